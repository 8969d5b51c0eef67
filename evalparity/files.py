"""Atomic file publishing: a file that a later stage (or another process) reads is there whole, or not at all.

A leaf module: it imports nothing of evalparity but ``config`` (for the test hook ``kill_point``), so
that every module can write its files through it without an import cycle.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from evalparity.config import kill_point


@contextlib.contextmanager
def atomic_target(path: Path) -> Iterator[Path]:
    """A temp path beside ``path`` to write to; renamed onto ``path`` when the block ends without error, so no
    reader sees half a file. The temp name is this process's own, so processes writing the same file at
    once each rename a whole one. For writers that take a path (pyarrow, matplotlib)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        kill_point(f"write:{path.name}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # left only when the write failed


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write text or bytes atomically (``atomic_target``)."""
    with atomic_target(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")


def write_json(path: Path, data: dict) -> None:
    """Write JSON atomically (``write_atomic``)."""
    write_atomic(path, json.dumps(data, indent=2, default=str))


def read_json(path: Path) -> dict | None:
    """The JSON object in ``path``; None when it is missing, unreadable, not JSON or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in chunks (a model's weights, a cell's table, an input's samples)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 23), b""):
            h.update(chunk)
    return h.hexdigest()
