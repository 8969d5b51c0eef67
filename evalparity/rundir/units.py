"""A unit of a run folder (a cell, or a shard of a sharded cell) is written in a folder of its own and
published by one rename, so no reader ever sees half a cell; its failed attempts are kept.

- ``tmp_dir``: where a unit is written (``<cells|shards>/.tmp-<unit>``).
- ``publish``: the rename into place. A failed attempt never replaces a finished cell (it is kept beside it
  as ``<unit>.failed``), and its reason and log go to ``attempts/`` (``archive_attempt``).
- ``is_done`` / ``read_cell_json``: whether a unit finished (under a given spec identity), its record.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from evalparity.config import CELLS, TRASH_PREFIX, kill_point
from evalparity.files import read_json, write_json
from evalparity.rundir import layout, records
from evalparity.rundir.names import check_name_ok
from evalparity.rundir.records import STATUS_OK

tmp_dir = layout.tmp_dir


def read_cell_json(cell_dir: Path) -> dict | None:
    """A cell's record as a dict, or None when it is missing, unreadable or not a record."""
    rec = records.read_cell(cell_dir)
    return rec.to_json() if rec else None


def is_done(run_dir: Path, name: str, folder: str = CELLS, identity: str | None = None) -> bool:
    """Whether the unit finished. With ``identity`` (``RunSpec.identity``), only if it finished under that
    spec and model: a cell of another spec or model is never taken for this one's."""
    return records.is_done(layout.unit_dir(run_dir, name, folder), identity)


def publish(run_dir: Path, name: str, status: str, folder: str = CELLS) -> Path:
    """Move the temp folder into place. A failed attempt never replaces a finished cell: it is kept
    beside it as ``<name>.failed``. Shards of a sharded cell live in ``shards/`` until they are merged."""
    src = tmp_dir(run_dir, name, folder)  # checks the name: the target below is replaced, so it must be ours
    final = layout.unit_dir(run_dir, name, folder)
    if status != STATUS_OK:
        with contextlib.suppress(OSError):  # a full disk must not stop the attempt from being recorded
            archive_attempt(run_dir, name, folder)
    if status != STATUS_OK and is_done(run_dir, name, folder):
        final = layout.failed_dir(run_dir, name, folder)
    trash = None
    if final.exists():
        trash = final.with_name(f"{TRASH_PREFIX}{final.name}-{os.getpid()}")
        final.replace(trash)
    kill_point(f"publish-cell:{name}")
    src.replace(final)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    return final


def archive_attempt(run_dir: Path, name: str, folder: str = CELLS) -> None:
    """Keep a failed attempt's reason and log as ``attempts/<folder>/<name>/attempt-N.{json,log}``: the next
    attempt replaces the cell's own folder, and a failure that comes and goes is only diagnosable from all
    of them."""
    src = tmp_dir(run_dir, name, folder)
    hist = layout.attempts_dir(run_dir, name, folder)
    hist.mkdir(parents=True, exist_ok=True)
    n = 1 + len(list(hist.glob("attempt-*.json")))
    log = layout.log_file(src)
    if log.exists():
        shutil.copyfile(log, hist / f"attempt-{n}.log")
    meta = read_cell_json(src) or {}
    write_json(hist / f"attempt-{n}.json", {"attempt": n, "error": meta.get("error"), "finished": meta.get("finished"),
                                            "log": f"attempt-{n}.log" if log.exists() else None})


def attempt_history(run_dir: Path, name: str, folder: str = CELLS) -> list[dict]:
    """Every recorded failed attempt of a unit, oldest first, with its log's path relative to the run."""
    hist = layout.attempts_dir(run_dir, name, folder)
    out = []
    for p in hist.glob("attempt-*.json") if hist.is_dir() else []:
        meta = read_json(p)
        if meta:
            log = meta.get("log")
            meta["log_path"] = str((hist / log).relative_to(run_dir)) \
                if isinstance(log, str) and check_name_ok(log) and (hist / log).is_file() else None
            out.append(meta)
    return sorted(out, key=lambda m: m.get("attempt") if isinstance(m.get("attempt"), int) else 0)


