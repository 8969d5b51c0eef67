"""Why cells failed, in lines a person can act on: every attempt of each failed cell (or its shards) with
its reason and the log it kept, and whether the fix is the user's (a full disk) rather than a rerun's.

Why apart from the command line: which attempts count, which log exists and when this run's own failure is
missing from the records (a full disk) are rules about the run folder's attempt history (``rundir.units``);
the CLI only prints the lines.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from evalparity.config import CELLS, SHARDS
from evalparity.rundir import layout, units


def attempt_lines(run_dir: Path, failed: Iterable[str], metas: Mapping[str, dict]) -> list[str]:
    """One line per failed attempt of each failed cell (or of its shards), with its reason and kept log,
    and this run's own when it could not be recorded (a full disk): never a log path that does not exist.
    ``metas``: each cell's outcome record from this run (``error``, and ``unrecorded`` when its attempt
    could not be written)."""
    out = []
    for name in failed:
        shards = layout.attempts_dir(run_dir, name, SHARDS).parent
        tried = [(CELLS, name)] + [(SHARDS, p.name) for p in sorted(shards.glob(f"{name}.*of*"))]
        last = None
        for folder, unit in tried:
            for a in units.attempt_history(run_dir, unit, folder):
                last = a.get("error")
                out.append(f"  {unit} attempt {a.get('attempt')}: {a.get('error') or 'no reason recorded'}"
                           f" (log: {a.get('log_path') or 'none written'})")
        meta = metas.get(name, {})
        now = meta.get("error")
        if last is None or (now and now != last and meta.get("unrecorded")):
            log = layout.log_file(layout.cell_dir(run_dir, name))
            where = f" (log: {log.relative_to(run_dir)})" if last is None and log.is_file() \
                and not meta.get("unrecorded") else ""
            out.append(f"  {name}: {now or 'no reason recorded'}{where}")
    return out


def disk_is_full(error: object) -> bool:
    """Whether a failure's reason is a full disk (or quota): the fix is the user's, not a rerun's."""
    return isinstance(error, str) and any(os.strerror(e) in error for e in (errno.ENOSPC, errno.EDQUOT))
