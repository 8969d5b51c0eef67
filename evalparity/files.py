"""Atomic file publishing: a file that a later stage (or another process) reads is there whole, or not at all.

A leaf module: it imports nothing of evalparity but ``config`` (for the test hook ``kill_point``), so
that every module can write its files through it without an import cycle.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from evalparity.config import fingerprint_cache, kill_point


@contextlib.contextmanager
def atomic_target(path: Path) -> Iterator[Path]:
    """A temp path beside ``path`` to write to; renamed onto ``path`` when the block ends without error, so no
    reader sees half a file. The temp name is this process's own, so processes writing the same file at
    once each rename a whole one. For writers that take a path (pyarrow, matplotlib)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # a stale one, or a link planted there: written through, it would write elsewhere
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


def write_output(path: Path, data: str) -> None:
    """A file the user named for their own tools (``--junit-xml``, ``--summary-md``, ``plan --json``): written
    atomically (``write_atomic``), except where ``path`` is a FIFO or a device (``/dev/stdout`` in a CI step,
    a named pipe a reader waits on), which is written into as it is: renamed over, it would become a plain
    file and its reader would wait for nothing."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = stat.S_IFREG  # not there yet (or a dangling link): a plain file, written atomically
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        write_atomic(path, data)
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(data)


def json_text(data: dict) -> str:
    """How evalparity writes a JSON record: indented, anything else as its text."""
    return json.dumps(data, indent=2, default=str)


def write_json(path: Path, data: dict) -> None:
    """Write JSON atomically (``write_atomic``)."""
    write_atomic(path, json_text(data))


def loads(text: str):
    """``json.loads``, where a document nested too deeply for Python's parser (``[[[[...``: a RecursionError)
    is a ValueError like any other that is not JSON evalparity wrote, so that its readers refuse it in one line."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def read_json(path: Path) -> dict | None:
    """The JSON object in ``path``; None when it is missing, unreadable, not JSON or not an object."""
    try:
        data = loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class Abandoned(Exception):
    """A hash given up on: the ``stop`` event of ``_digest`` was set (``HashCache.sha256_all``)."""


def _digest(f, stop: threading.Event | None = None) -> str:
    """The sha256 of an open binary file's bytes from where it stands, read in chunks: the one place that
    reads a file to hash it. ``stop`` set ends it at the next chunk (8 MiB) with Abandoned."""
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 23), b""):
        if stop is not None and stop.is_set():
            raise Abandoned(f.name)
        h.update(chunk)
    return h.hexdigest()


def sha256(path: Path) -> str:
    """The sha256 of a file's bytes (a model's weights, a cell's table, an input's samples)."""
    with open(path, "rb") as f:
        return _digest(f)


HASH_THREADS = 8  # files hashed side by side at most (HashCache.sha256_all)
RACY_NS = 200_000_000  # a file changed this close before its stamp was read is not cached (HashCache)


def _stamp_of(st: os.stat_result, now: int) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, now]


def stamp(path: Path) -> list[int]:
    """What changes when a file's bytes can have changed: size, mtime, ctime, inode and device. A rewrite in
    place changes at least the ctime, which no user call sets back; a rename of the folder above changes none.
    The device tells apart two file systems mounted in turn at one path (a loop device or an image reused),
    whose files can repeat each other's inodes and times.
    Its last element is not the file's: the time it was read (ns), for ``HashCache.put``'s racy-file rule."""
    now = time.time_ns()
    return _stamp_of(os.stat(path), now)


def stamped_sha256(path: Path, stop: threading.Event | None = None) -> tuple[list[int], str]:
    """(``stamp``, sha256) of one open file: the stamp read from the descriptor before its bytes, so that
    both are of the same file even when ``path`` is a link someone changes meanwhile, and a write during
    the read leaves a stamp that no longer matches."""
    with open(Path(path).resolve(), "rb") as f:
        now = time.time_ns()
        st = _stamp_of(os.fstat(f.fileno()), now)
        try:
            return st, _digest(f, stop)
        except OSError as err:  # a read error names no file: this one
            if err.filename is None:
                err.filename = str(path)
            raise


def _trusted(path: Path) -> bool:
    """Whether a cache file may be believed: this user's, and writable by no one else (a group-writable or
    shared cache would let another user vouch for bytes they changed)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


class HashCache:
    """Files' sha256, remembered by resolved path and ``stamp``, in the cache directory
    (``config.fingerprint_cache``), so that a 538 MB or 100 GB model is hashed once per file, not on every
    use by every reader (the model's fingerprint, the embedded model's manifest check). The cache only saves
    time: an unreadable or odd one is ignored, one that is not this user's alone too (``_trusted``), and one
    that cannot be written is not an error.

    A stamp that could stay the same while the bytes change is never cached:
    - a racy file (git's rule for its index): its mtime or ctime within ``RACY_NS`` of the moment its stamp
      was read. The kernel keeps those times at a clock tick's resolution, so a second write in the same
      tick as the last would leave the stamp unchanged while the bytes hashed may be the first write's;
    - whole-second times (mtime and ctime both): a file system that keeps seconds only (ext4 with small
      inodes, squashfs, FAT) repeats a stamp for a whole second, and images built reproducibly repeat it
      from one image to the next at the same mount point."""

    def __init__(self) -> None:
        path = fingerprint_cache()
        data = read_json(path) if _trusted(path) else None
        self.data: dict = data if data is not None else {}
        self.changed = False
        self._lock = threading.Lock()  # ``sha256_all``'s threads put side by side

    def get(self, path: Path, st: list[int]) -> str | None:
        hit = self.data.get(str(Path(path).resolve()))
        if isinstance(hit, dict) and hit.get("stamp") == st[:-1] and isinstance(hit.get("sha256"), str):
            return hit["sha256"]
        return None

    def put(self, path: Path, st: list[int], digest: str) -> None:
        """Remember ``digest`` for ``path`` as stamped by ``st`` (read before the bytes were hashed), unless
        that stamp cannot be trusted to change with the bytes (the class's docstring)."""
        size, mtime, ctime, _ino, _dev, read_at = st
        if read_at - max(mtime, ctime) < RACY_NS or (mtime % 10**9 == 0 and ctime % 10**9 == 0):
            return
        with self._lock:
            self.data[str(Path(path).resolve())] = {"stamp": st[:-1], "sha256": digest}
            self.changed = True

    def sha256(self, path: Path, stop: threading.Event | None = None) -> tuple[str, list[int], bool]:
        """(``path``'s sha256, its stamp, whether it came from the cache): the cached one while the stamp
        is unchanged, else hashed now (``stamped_sha256``) and cached."""
        st = stamp(path)
        digest = self.get(path, st)
        if digest is not None:
            return digest, st, True
        st, digest = stamped_sha256(path, stop)
        self.put(path, st, digest)
        return digest, st, False

    def sha256_all(self, paths: list[Path]) -> list[tuple[str, list[int], bool]]:
        """``sha256`` of each of ``paths``, in their order. The distinct files are hashed side by side, in up to
        ``HASH_THREADS`` threads (file reads and hashlib release the GIL): a 14B model's six shards of 5 GB,
        one after another, were 28.6 s of a first run's setup on an H200 host of 16 cores. A file reached
        under a second name (a symbolic or a hard link: the same device and inode, size and times) is read
        once, and the second name gets the first's hash, as from the cache. An exception in the caller's thread (Ctrl-C,
        SIGTERM's ``cli.Stopped``) stops the other threads at their next chunk instead of waiting for them to
        finish their files; a single file is hashed in the caller's thread."""
        paths = [Path(p) for p in paths]
        first: dict[tuple[int, ...], int] = {}
        of: list[int] = []
        for i, p in enumerate(paths):
            st = os.stat(p)
            # one file: the same device and inode, and the same size and times (a file system that repeats or
            # zeroes inode numbers, as some FUSE and network ones do, must not make two files one)
            same = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) if st.st_ino else (i,)
            of.append(first.setdefault(same, i))
        distinct = sorted(first.values())
        if len(distinct) <= 1:
            done = {i: self.sha256(paths[i]) for i in distinct}
        else:
            stop = threading.Event()
            pool = ThreadPoolExecutor(min(HASH_THREADS, os.cpu_count() or 1, len(distinct)),
                                      thread_name_prefix="sha256")
            try:
                futures = {i: pool.submit(self.sha256, paths[i], stop) for i in distinct}
                done = {i: f.result() for i, f in futures.items()}
            except BaseException:
                stop.set()  # each thread stops at its next chunk: waiting for them is short, and after it no
                pool.shutdown(wait=True, cancel_futures=True)  # thread puts into the cache while it is saved
                raise
            pool.shutdown()
        out = []
        for i, p in enumerate(paths):
            if of[i] == i:
                out.append(done[i])
                continue
            digest, st, _ = done[of[i]]  # the same file (device and inode): its stamp is this name's too
            self.put(p, st, digest)
            out.append((digest, st, True))
        return out

    def save(self) -> None:
        """Write the cache, without the entries of files that are gone (a run on a copy of a model in a
        temporary folder would otherwise leave its entries for ever: 1,275 of 1,318 on this machine's test
        runs were such)."""
        with self._lock:  # no thread of sha256_all puts meanwhile
            if not self.changed:
                return
            self.data = {k: v for k, v in self.data.items() if os.path.lexists(k)}
            path = fingerprint_cache()
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(self.data))
                os.chmod(tmp, 0o600)
                os.replace(tmp, path)
                self.changed = False
            except OSError:  # a read-only home, a folder in the file's place: only time is lost
                tmp.unlink(missing_ok=True)
