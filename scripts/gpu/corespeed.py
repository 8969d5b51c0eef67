"""Sample this host's single-core speed while runs go on.

``python3 corespeed.py FILE [INTERVAL]``: every INTERVAL seconds (default 5), time a fixed pure-Python
workload and append ``unix_time seconds`` to FILE, until killed.

Why: every cell is bound by one CPU core (its evaluation's CPU seconds are 98-100% of its wall seconds), so
a run's time follows the speed of the cores it gets, and on a shared GPU host that speed moved by 16%
between two identical runs minutes apart (results/h200x2-scaleout/README.md, fourth lease). These samples
measure that speed independently of the runs, so runs made at different moments can be compared fairly.
"""

from __future__ import annotations

import sys
import time


def workload(n: int = 1_000_000) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def main() -> None:
    path = sys.argv[1]
    interval = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
    while True:
        t0 = time.perf_counter()
        workload()
        took = time.perf_counter() - t0
        with open(path, "a") as out:
            out.write(f"{time.time():.1f} {took:.4f}\n")
        time.sleep(interval)


if __name__ == "__main__":
    main()
