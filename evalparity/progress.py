"""The progress display of a run's cells, shared by ``matrix`` (one job per cell) and ``stager`` (rounds).

It has two faces, picked by ``console.is_interactive`` (rich's ``is_terminal``, less a dumb terminal or
``TTY_INTERACTIVE=0``: the switch for a CI that sets ``FORCE_COLOR``, which makes rich take a pipe for a
terminal):

- on a terminal, rich's live bars: one per cell (phase, bar, n/total, elapsed, ETA) under an overall line;
- anywhere else (a CI log, a pipe, a file), plain timestamped lines::

      2026-12-01T23:40:12Z  hf-fp32  evaluating 1,200/4,000 (30 %)  elapsed 0:01:05  eta 0:02:31

  one when a cell is first seen running, one per phase it enters, one for every 10 % of a bar or after
  ``EVALPARITY_PROGRESS_S`` seconds without a line for that cell (default 30; a heartbeat while it loads a
  model for minutes), and one when it ends, with its status and time. The time is ``runlog.stamp``, the
  one clock of every line of a piped run's log (``cli.output`` stamps the run's other lines and its log
  records with it), so that the block naming the run (``run_block``) and each cell's lines read in order.

Why two faces: a live display redraws in place. Without a terminal rich cannot, so it printed nothing while
the cells ran and dumped the bars' last frame at the end: a multi-hour GPU run left its CI log silent, and
CI systems kill jobs whose log stays silent too long.

The cells themselves report through ``progress.json`` (``progress_file.ProgressFile``: phase, the current tqdm
bar's description and n/total); both faces read it, so a cell process knows nothing of either.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from evalparity import config
from evalparity.printable import visible
from evalparity.runlog import stamp

INTERVAL_ENV = config.PROGRESS_ENV
STEP = 0.1  # a progress line for every tenth of a bar, even within the interval
WIDTH = 70  # a live bar's description is cut here, so that the bar and its numbers stay on the line


def interval() -> float:
    """Seconds between a running cell's lines in the non-terminal face (``config.progress_interval``)."""
    return config.progress_interval()


@dataclass(frozen=True)
class CellState:
    """What a cell's ``progress.json`` says: its phase and, while a tqdm bar runs, that bar."""

    phase: str
    desc: str = ""
    n: int = 0
    total: int = 0

    @classmethod
    def read(cls, path: Path) -> CellState | None:
        """The state in ``path``, or None while the cell has not written one (queued, importing) or it is
        being replaced (the cell writes it atomically, but it may vanish when the cell ends)."""
        try:
            st = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(st, dict):
            return None
        n, total = st.get("n"), st.get("total")
        return cls(str(st.get("phase") or ""), str(st.get("desc") or ""),
                   n if type(n) is int else 0, total if type(total) is int and total > 0 else 0)

    def label(self) -> str:
        """The phase, and the bar's own description when it says more (``evaluating: Running
        loglikelihood requests``); never the same words twice."""
        if self.desc and self.desc != self.phase:
            return f"{self.phase}: {self.desc}" if self.phase else self.desc
        return self.phase or "running"

    def bar(self) -> tuple[str, str, int]:
        """Which bar this is: a new description or total is a new bar (lm-eval runs one per request type)."""
        return self.phase, self.desc, self.total


def clock_text(seconds: float) -> str:
    """``H:MM:SS``, as rich's elapsed column writes it."""
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def run_block(console: Console, *, model: str, device: str, cells: Iterable[str], done: Iterable[str],
              out: Path | str, executor: str) -> None:
    """The lines a run starts with, on either face: the model, the device, the cells (those already done
    marked), the output folder and the executor, so that a log says what it is a log of; timestamped, as every
    line of a log, where there is no terminal. Names and paths are user text: printed as ``Text``, control
    characters written out."""
    done = set(done)
    names = ", ".join(f"{c} (done)" if c in done else c for c in cells)
    when = "" if console.is_interactive else f"{stamp()}  "
    for key, value in (("model", model), ("device", device), ("cells", names), ("out", out),
                       ("executor", executor)):
        console.print(Text(f"{when}{key:<9} {visible(value)}"), soft_wrap=True, highlight=False)


class _Eta(TimeRemainingColumn):
    """The ETA of a bar still running; blank once it is done, so that a finished cell shows one time, its
    elapsed one (rich would show a remaining 0:00:00 beside it)."""

    def render(self, task) -> Text:
        return Text("") if task.finished else super().render(task)


class LiveBars:
    """The terminal face: rich's live bars. The description holds the cell and its phase, the columns
    the bar, n/total, ONE clock (elapsed, started when the cell starts, not when it is queued, frozen when it
    ends) and the ETA of its current bar."""

    def __init__(self, console: Console, units: Iterable[str], overall: str, total: int | None = None,
                 completed: int = 0):
        columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), _Eta())
        self.bars = Progress(*columns, console=console, transient=False)
        self.console = console
        self._overall = self.bars.add_task(visible(overall), total=total, completed=completed)
        self._tasks: dict[str, TaskID] = {u: self.bars.add_task(f"  {visible(u)}: queued", total=None, start=False)
                                          for u in units}
        self._started: set[str] = set()

    def __enter__(self) -> LiveBars:
        self.bars.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.bars.__exit__(kind, err, tb)

    def overall(self, description: str | None = None, advance: int = 0) -> None:
        self.bars.update(self._overall, description=None if description is None else visible(description),
                         advance=advance)

    def watch(self, unit: str, path: Path) -> bool:
        """Show a running unit's ``progress.json``; False while it has none (queued, or importing)."""
        st = CellState.read(path)
        if st is None:
            return False
        task = self._start(unit)
        # No bar (loading, writing, waiting for a round): the last one stays as it was, rather than drop to 0
        self.bars.update(task, description=f"  {visible(unit)}: {visible(st.label())}"[:WIDTH],
                         total=st.total or None, completed=st.n if st.total else None)
        return True

    def finished(self, unit: str, status: str, count: int = 1) -> None:
        """The unit's bar full (``count`` of ``count``: 1 for a cell, the rounds so far for a staged one),
        with its status; its elapsed column stops there."""
        task = self._start(unit)
        self.bars.update(task, description=f"  {visible(unit)}: {visible(status)}"[:WIDTH], total=count,
                         completed=count)

    def _start(self, unit: str) -> TaskID:
        """The unit's bar, its clock started (a queued unit's stays at -:--:--)."""
        if unit not in self._started:
            self._started.add(unit)
            self.bars.start_task(self._tasks[unit])
        return self._tasks[unit]

    def line(self, text: str) -> None:
        """A line above the bars (a round's decisions), printed as written, never as markup."""
        self.console.print(Text(visible(text)), highlight=False, soft_wrap=True)


@dataclass
class _Unit:
    """What the log face remembers of one unit: when it was first seen and since when it has been in its
    current stretch (a round, for a staged cell), its last bar and line."""

    t0: float | None = None       # first seen running
    since: float | None = None    # the current stretch began (first seen after the previous ``finished``)
    phase: str | None = None
    bar: tuple | None = None
    bar_t0: float = 0.0           # the bar's baseline, for its ETA
    bar_n0: int = 0
    tenth: int = 0                # the last tenth of the bar a line was printed for
    last_line: float = 0.0


class LogLines:
    """The face for logs (no terminal): timestamped lines, never a bar's frame (see the module's docstring).
    ``clock``: a monotonic clock, replaceable in tests."""

    def __init__(self, console: Console, units: Iterable[str], overall: str, total: int | None = None,
                 completed: int = 0, every: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.console = console
        self.every = interval() if every is None else every
        self.clock = clock
        self._units = {u: _Unit() for u in units}
        self._overall, self._total, self._completed = overall, total, completed

    def __enter__(self) -> LogLines:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        return None

    def overall(self, description: str | None = None, advance: int = 0) -> None:
        """A new description is a line of its own (a staged run's ``round 2: 1,000 docs per cell ...``);
        ``advance`` counts a finished cell, shown on the next cell's end line."""
        self._completed += advance
        if description is not None and description != self._overall:
            self._overall = description
            self.line(description)

    def watch(self, unit: str, path: Path) -> bool:
        st = CellState.read(path)
        if st is None:
            return False
        u, now = self._units[unit], self.clock()
        if u.t0 is None:
            u.t0 = now
        if u.since is None or st.phase != u.phase:  # the cell starts, or a stretch or phase begins
            u.since = now if u.since is None else u.since
            u.phase = st.phase
            self._new_bar(u, st, now)
            self._say(unit, u, st, now)
            return True
        if st.bar() != u.bar:  # the same phase, another bar: its own ETA and tenths, no line of its own
            self._new_bar(u, st, now)
        tenth = int(st.n * 10 // st.total) if st.total else 0
        if tenth > u.tenth or now - u.last_line >= self.every:
            self._say(unit, u, st, now)
        return True

    def finished(self, unit: str, status: str, count: int = 1) -> None:
        """The unit's end (or, for a staged cell, its round's): the status and the time of the stretch; the
        next ``watch`` of the unit starts a new stretch with a line of its own."""
        u, now = self._units[unit], self.clock()
        took = f" in {clock_text(now - u.since)}" if u.since is not None else ""
        counted = f"  ({self._completed}/{self._total} {self._overall})" if self._total else ""
        self.line(f"{unit}  {status}{took}{counted}")
        u.since, u.phase, u.bar = None, None, None

    def line(self, text: str) -> None:
        self.console.print(Text(f"{stamp()}  {visible(text)}"), highlight=False, soft_wrap=True)

    def _new_bar(self, u: _Unit, st: CellState, now: float) -> None:
        u.bar, u.bar_t0, u.bar_n0 = st.bar(), now, st.n
        u.tenth = int(st.n * 10 // st.total) if st.total else 0

    def _say(self, unit: str, u: _Unit, st: CellState, now: float) -> None:
        parts = [unit, st.label()]
        if st.total:
            parts[-1] += f" {st.n:,}/{st.total:,} ({100 * st.n // st.total} %)"
            u.tenth = int(st.n * 10 // st.total)
        parts.append(f"elapsed {clock_text(now - (now if u.t0 is None else u.t0))}")
        if st.total and st.n > u.bar_n0 and now > u.bar_t0:
            rate = (st.n - u.bar_n0) / (now - u.bar_t0)
            parts.append(f"eta {clock_text((st.total - st.n) / rate)}")
        self.line("  ".join(parts))
        u.last_line = now


Display = LiveBars | LogLines


def display(console: Console, units: Iterable[str], overall: str, total: int | None = None,
            completed: int = 0) -> Display:
    """The face for ``console``: live bars on a terminal, timestamped lines elsewhere. ``units``: the cells
    (or shards) that will run, each queued until its ``progress.json`` appears; ``overall``: the top line (a
    count of cells, out of ``total``, or a staged run's round). ``EVALPARITY_PROGRESS_S`` is checked on
    either face, so that a bad value fails the same way wherever the run is started."""
    every = interval()
    units = list(units)
    if console.is_interactive:  # a terminal that can redraw in place (not TERM=dumb, not TTY_INTERACTIVE=0)
        return LiveBars(console, units, overall, total, completed)
    return LogLines(console, units, overall, total, completed, every=every)
