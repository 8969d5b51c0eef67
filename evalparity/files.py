"""Atomic file publishing: a file that a later stage (or another process) reads is there whole, or not at all.

A leaf module: it imports nothing of evalparity but ``config`` (for the test hook ``kill_point``), so
that every module can write its files through it without an import cycle.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from evalparity.config import fingerprint_cache, kill_point


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


RACY_NS = 200_000_000  # a file changed this close before its stamp was read is not cached (below)


def stamp(path: Path) -> list[int]:
    """What changes when a file's bytes can have changed: size, mtime, ctime and inode. A rewrite in place
    changes at least the ctime, which no user call sets back; a rename of the folder above changes none.
    Its last element is not the file's: the time it was read (ns), for ``HashCache.put``'s racy-file rule."""
    now = time.time_ns()
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, now]


class HashCache:
    """Files' sha256, remembered by resolved path and ``stamp``, in the cache directory
    (``config.fingerprint_cache``), so that a 538 MB or 100 GB model is hashed once per file, not on every
    use by every reader (the model's fingerprint, the embedded model's manifest check). The cache only saves
    time: an unreadable or odd one is ignored, and one that cannot be written is not an error.

    A racy file is never cached (git's rule for its index): one whose mtime or ctime is within ``RACY_NS`` of
    the moment its stamp was read. The kernel keeps those times at a clock tick's resolution, so a second
    write in the same tick as the last would leave the stamp unchanged while the bytes hashed may be the
    first write's."""

    def __init__(self) -> None:
        data = read_json(fingerprint_cache())
        self.data: dict = data if data is not None else {}
        self.changed = False

    def get(self, path: Path, st: list[int]) -> str | None:
        hit = self.data.get(str(Path(path).resolve()))
        if isinstance(hit, dict) and hit.get("stamp") == st[:4] and isinstance(hit.get("sha256"), str):
            return hit["sha256"]
        return None

    def put(self, path: Path, st: list[int], digest: str) -> None:
        """Remember ``digest`` for ``path`` as stamped by ``st`` (read before the bytes were hashed), unless
        the file was racy then."""
        if st[4] - max(st[1], st[2]) < RACY_NS:
            return
        self.data[str(Path(path).resolve())] = {"stamp": st[:4], "sha256": digest}
        self.changed = True

    def sha256(self, path: Path) -> str:
        """``path``'s sha256: the cached one while its stamp is unchanged, else hashed now (and cached). The
        stamp is read before the bytes, so a file rewritten meanwhile is cached under its old stamp, which
        no longer matches: hashed again next time."""
        st = stamp(path)
        digest = self.get(path, st)
        if digest is None:
            digest = sha256(path)
            self.put(path, st, digest)
        return digest

    def save(self) -> None:
        if not self.changed:
            return
        path = fingerprint_cache()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.data))
            os.replace(tmp, path)
            self.changed = False
        except OSError:  # a read-only home, a folder in the file's place: only time is lost
            tmp.unlink(missing_ok=True)
