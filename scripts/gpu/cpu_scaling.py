"""How many cores' worth of work this host's vCPUs give when many processes are busy at once.

``python3 cpu_scaling.py [N ...]`` (default 1 2 4 6 8 12 16): for each N, N processes run the same fixed
pure-Python workload (``corespeed.workload``) at once; prints each N's median seconds per process and the
aggregate throughput in units of one process alone (N x t1 / tN).

Why (issue 26): every cell of a run is bound by one core (its evaluation's CPU seconds are its wall seconds),
and on the H200 machine twelve replica processes used 81 % more CPU seconds than six for the same docs
(results/staged-h200, session 18): a vCPU is slower when more of them are busy. This measures that curve
without a GPU or a model, so that a run's side-by-side cells can be priced against it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from corespeed import workload  # noqa: E402


def _timed(_: int) -> float:
    t0 = time.perf_counter()
    workload(25_000_000)
    return time.perf_counter() - t0


def main(ns: list[int]) -> None:
    print(f"os.cpu_count()={os.cpu_count()}, affinity={len(os.sched_getaffinity(0))}")
    ctx = mp.get_context("fork")
    t1 = None
    for n in ns:
        with ctx.Pool(n) as pool:
            times = pool.map(_timed, range(n))
        med = statistics.median(times)
        t1 = t1 or med
        print(f"N={n:3d}: median {med:.2f} s per process (max {max(times):.2f}); "
              f"throughput {n * t1 / med:.1f}x one process alone", flush=True)


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [1, 2, 4, 6, 8, 12, 16])
