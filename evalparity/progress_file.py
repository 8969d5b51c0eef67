"""What a worker process (a cell, a drift side, ``evalparity hidden``'s worker) tells its parent while it
runs: ``progress.json`` (phase and n/total, which ``evalparity.progress`` shows as live bars or timestamped
lines) and one line in its own log at each change of phase.

A leaf (no pandas or torch): ``evalparity hidden``'s command imports it before it starts its worker.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from evalparity import procs
from evalparity.files import write_json


class ProgressFile:
    """Writes {"phase", "desc", "n", "total"} to progress.json, at most every half second; the parent shows
    it (``evalparity.progress``: live bars, or timestamped lines in a log).

    A new phase clears the bar of the last one (``writing`` is not ``Running loglikelihood requests
    4000/4000``), and a bar's last step is always written, so that its 100 % is never lost to the throttle."""

    def __init__(self, path: Path):
        self.path = path
        self.state = {"phase": "starting", "desc": "", "n": 0, "total": 0, "pid": os.getpid()}
        self._last = 0.0

    def update(self, force: bool = False, **kw) -> None:
        if kw.get("phase", self.state["phase"]) != self.state["phase"]:
            self.state.update(desc="", n=0, total=0)
            log_phase(kw["phase"])
        self.state.update(kw)
        now = time.monotonic()
        done = "n" in kw and bool(self.state["total"]) and self.state["n"] >= self.state["total"]
        if force or done or now - self._last > 0.5:
            self._last = now
            try:
                write_json(self.path, self.state)
            except OSError:
                pass

    def hook_tqdm(self) -> None:
        """Every tqdm bar in this process (lm-eval's request bars, vLLM's) reports here too."""
        import tqdm.std  # only the cell process hooks it (tqdm comes with lm-eval)

        progress = self
        original_update = tqdm.std.tqdm.update

        def update(bar, n=1):
            out = original_update(bar, n)
            try:  # never let progress reporting break the evaluation (disabled bars lack attributes)
                total = getattr(bar, "total", None)
                if total:
                    progress.update(desc=str(getattr(bar, "desc", "") or ""), n=int(getattr(bar, "n", 0)),
                                    total=int(total))
            except Exception:  # noqa: BLE001
                pass
            return out

        tqdm.std.tqdm.update = update


def log_phase(phase: str) -> None:
    """One line in the cell's log when its phase changes: when, and how long after the process started
    (where a cell's start goes: imports, task manager, engine, first round)."""
    age = procs.process_age()
    since = f" ({age:.1f} s after the process started)" if age is not None else ""
    print(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {phase}{since}", flush=True)
