"""What one ``evalparity run`` did and how long each stage took, in ``<run>/run.json``.

Why: the cells record their own timings (``cell.json``), but a run's wall time also holds work outside
them (reading the task index and data, starting Ray, statistics, the report), which runs serially and so
bounds what spreading cells over GPUs can gain. This file says where that time went. Each invocation
replaces it (a resumed run records its own stages, not the first run's).
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from evalparity.files import write_json
from evalparity.rundir import layout


def stamp() -> str:
    """Now in UTC, ISO 8601 to the second: the one clock every timestamped log line starts with (the progress
    lines, ``progress``; the run's other lines and log records, ``cli.output``), whatever the runner's zone."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class RunLog:
    """Seconds per named stage, in the order they ran."""

    def __init__(self) -> None:
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.t0 = time.perf_counter()
        self.stages: dict[str, float] = {}
        self.facts: dict = {}  # e.g. the executor used
        self.run_dir: Path | None = None  # set once the run directory is known to be this run's
        self._last_step = self.t0

    def step(self, name: str) -> None:
        """Record one step of a long stage (the setup's model, task data, staging plan...) as the time since the
        previous step, under ``setup_steps_s``: a cold machine's setup is many first-time costs, and which one
        dominates decides what to overlap."""
        now = time.perf_counter()
        steps = self.facts.setdefault("setup_steps_s", {})
        steps[name] = round(steps.get(name, 0.0) + now - self._last_step, 3)
        self._last_step = now

    @contextlib.contextmanager
    def stage(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name] = round(self.stages.get(name, 0.0) + time.perf_counter() - t, 3)

    def mark(self, name: str, since: float) -> None:
        """Record a stage that began at ``since`` (a ``time.perf_counter()`` reading) and ends now."""
        self.stages[name] = round(time.perf_counter() - since, 3)

    def write(self) -> None:
        """Write run.json, if this invocation got as far as owning a run directory."""
        if self.run_dir is None:
            return
        total = time.perf_counter() - self.t0
        try:
            write_json(layout.run_file(self.run_dir), {
                "argv": sys.argv[1:], "started": self.started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "total_s": round(total, 3), "stages_s": self.stages,
                "outside_stages_s": round(total - sum(self.stages.values()), 3), **self.facts})
        except OSError:  # a record of timings is not worth failing a finished run over
            pass
