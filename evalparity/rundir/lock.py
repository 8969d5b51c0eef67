"""One process at a time in a run folder, and whole outputs after a kill.

- **Lock.** The lock is a file created with ``link(2)`` (``O_EXCL`` where hard links are unsupported), both
  atomic on local filesystems and on NFS, which is where a Ray cluster's shared run directory lives;
  ``flock``/``fcntl`` locks are not reliable there. It holds the holder's host, pid and start time, so a
  second run can name it, and a lock left by a dead process of this host (SIGKILL, OOM) is taken over. A lock
  from another host cannot be checked: it is reported.
- **Kills.** ``stats/``, ``report/`` and ``drift/`` are written into a staging folder and swapped in together
  (``staged_outputs``); the staging folder's name goes into the lock's record, and the next command that
  takes the lock over finishes or removes what a killed one left (``recover_outputs``), and nothing else.
- **Where a run may be.** Not inside another run (``check_not_inside_a_run``), not below a file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import platform
import secrets
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from evalparity.config import (
    CELLS,
    COMMITTED,
    LOCK_NAME,
    OUTPUT_NAMES,
    SHARDS,
    STAGE_PREFIX,
    TRASH_PREFIX,
    kill_point,
)
from evalparity.errors import EvalParityError
from evalparity.files import loads, read_json, write_json
from evalparity.rundir import layout
from evalparity.rundir.names import check_name_ok

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------- the output directory
def writable_dir_error(path: Path, err: OSError, flag: str = "--out") -> EvalParityError:
    """One line for a directory that cannot be created or written, naming why and the fix."""
    why = {errno.EROFS: "is on a read-only filesystem", errno.EACCES: "is not writable (permission denied)",
           errno.EPERM: "is not writable (permission denied)", errno.ENOSPC: "is on a full disk",
           errno.EDQUOT: "is over its disk quota"}.get(err.errno, f"cannot be written ({err.strerror})")
    if flag == "run directory":  # report: it writes stats/ and report/ into the run it reads
        return EvalParityError(f"run directory {path} {why}: report writes stats/ and report/ into it; copy the "
                               f"run somewhere writable (cp -r {path} DEST) and run report on the copy")
    return EvalParityError(f"{flag} {path} {why}: give {flag} a writable directory with free space")


def check_out_path(path: Path, flag: str = "--out") -> None:
    """Refuse an ``--out`` that is a file, or sits below one, before anything runs."""
    p = Path(path)
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                where = "is a file" if q == p else f"is below {q}, which is a file"
                raise EvalParityError(f"{flag} {path} {where}: give {flag} a directory path")
            return


def check_not_inside_a_run(path: Path, flag: str = "--out") -> None:
    """Refuse an output folder inside another run or comparison: that run's next ``report`` replaces its
    ``stats/`` and ``report/`` whole, and a folder in its ``cells/`` is read as one of its cells."""
    for q in Path(os.path.realpath(path)).parents:  # realpath: a link loop is not an error here
        if layout.spec_file(q).is_file() or layout.compare_file(q).is_file() or (q / LOCK_NAME).is_file():
            raise EvalParityError(f"{flag} {path} is inside the run directory {q}, whose own commands replace and read "
                                  f"what is inside it: give {flag} a folder outside any run")


# ---------------------------------------------------------------- lock
STALE_BREAK_S = 30.0


def contents(run_dir: Path) -> list[Path]:
    """What a directory holds besides this module's lock files (and a ``.gitkeep``)."""
    if not run_dir.is_dir():
        return []
    return [p for p in run_dir.iterdir() if not p.name.startswith(LOCK_NAME) and p.name != ".gitkeep"]


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid from its holder."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    now = _proc_start(pid)
    return start is None or now is None or now == start


def _read_lock(path: Path) -> dict | None:
    """The holder a lock file names; None when there is no lock file, {} when it is not a lock (corrupt:
    not JSON, or without a host and an integer pid)."""
    try:
        data = loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("host"), str) or type(data.get("pid")) is not int:
        return {}
    return data


def describe_holder(h: dict) -> str:
    return (f"pid {h.get('pid', '?')} on {h.get('host', '?')}, since {h.get('started', '?')}"
            + (f": evalparity {' '.join(h['argv'])}" if h.get("argv") else ""))


# The locks this process holds, by resolved run directory: ``staged_outputs`` and ``recover_outputs`` find
# theirs here, so that the staging folders a command may finish or remove are the ones its lock names.
_HELD: dict[str, RunLock] = {}


def _key(run_dir: Path) -> str:
    return os.path.realpath(run_dir)


@dataclass
class RunLock:
    """The held lock of one run directory; ``release`` removes it (only if it is still this one's).

    ``info["stages"]`` names the staging folders this holder is responsible for: the ones it made and has not
    yet published or removed, plus those of a dead holder whose stale lock it took over. Recovery touches
    those alone, never a folder whose name merely looks like a staging folder."""

    path: Path
    info: dict
    created: list[Path] = field(default_factory=list)  # directories this lock's acquire created, deepest first

    def update(self, **changes) -> None:
        """Rewrite this lock's record (atomically: a reader sees the old one or the new one)."""
        info = self.info | changes
        tmp = self.path.with_name(f"{self.path.name}.{platform.node()}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)  # never written through a link planted under that name (files.atomic_target)
        tmp.write_text(json.dumps(info))
        os.replace(tmp, self.path)
        self.info = json.loads(json.dumps(info))

    def release(self) -> None:
        _HELD.pop(_key(self.path.parent), None)
        if _read_lock(self.path) == self.info:
            with contextlib.suppress(OSError):
                self.path.unlink()
        for d in self.created:  # a run that wrote nothing leaves nothing behind
            with contextlib.suppress(OSError):
                d.rmdir()

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _create_exclusive(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text`` if it does not exist (True), atomically; False if it exists."""
    tmp = path.with_name(f"{path.name}.{platform.node()}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # never written through a link planted under that name (files.atomic_target)
    tmp.write_text(text)
    try:
        os.link(tmp, path)  # atomic, and the lock is whole the moment it exists
        return True
    except FileExistsError:
        return False
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
            raise
        try:  # no hard links here (some FUSE mounts): O_EXCL, with a moment when the file is empty
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def _break_stale(path: Path, stale: dict) -> bool:
    """Remove ``path`` if it still holds ``stale``. A second lock (``.break``) makes the check-and-remove
    one step, so two processes that both saw the stale lock cannot remove a fresh one."""
    brk = path.with_name(path.name + ".break")
    try:
        if time.time() - brk.stat().st_mtime > STALE_BREAK_S:  # a breaker killed mid-step
            brk.unlink(missing_ok=True)
    except FileNotFoundError:
        pass
    if not _create_exclusive(brk, json.dumps({"host": platform.node(), "pid": os.getpid()})):
        return False
    try:
        if _read_lock(path) == stale:
            path.unlink(missing_ok=True)
            return True
        return False
    finally:
        brk.unlink(missing_ok=True)


def acquire(run_dir: Path, *, create: bool = True, flag: str = "--out") -> RunLock:
    """Take the run directory's lock, creating the directory when ``create``; a one-line error when
    another live process holds it, or when the directory cannot be written."""
    run_dir = Path(run_dir)
    check_out_path(run_dir, flag)
    if create:
        check_not_inside_a_run(run_dir, flag)
    created = [q for q in (run_dir, *run_dir.parents) if not q.exists()] if create else []
    inherited: list[str] = []
    try:
        if create:
            run_dir.mkdir(parents=True, exist_ok=True)
        elif not run_dir.is_dir():
            raise EvalParityError(f"{run_dir} is not a directory: give the --out of a run")
        path = run_dir / LOCK_NAME
        info = {"host": platform.node(), "pid": os.getpid(), "pid_start": _proc_start(os.getpid()),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:]}
        text = json.dumps(info)
        info = json.loads(text)
        for _ in range(20):
            if path.is_symlink():  # dangling, it read as "no lock" twenty times: "keeps changing hands"
                raise EvalParityError(f"{path} is a symbolic link (to {os.readlink(path)}), not a lock evalparity "
                                      f"writes: if no evalparity works on {run_dir}, remove the link; or use "
                                      f"another {flag}")
            if _create_exclusive(path, text):
                lock = RunLock(path, info, created)
                if inherited:
                    lock.update(stages=inherited)
                _HELD[_key(run_dir)] = lock
                return lock
            holder = _read_lock(path)
            if holder is None:  # released just now
                continue
            if not holder:  # being written (the O_EXCL fallback, for a moment) or corrupt
                time.sleep(0.1)
                if _read_lock(path) != {}:
                    continue
                age = time.time() - path.stat().st_mtime
                if age > STALE_BREAK_S:
                    if _break_stale(path, {}):
                        logger.warning(f"took over a corrupt lock of {run_dir}, {age:.0f} s old")
                    continue
                raise EvalParityError(f"{path} is not a lock evalparity can read (corrupt): if no evalparity works "
                                      f"on {run_dir}, remove it (one older than {STALE_BREAK_S:.0f} s is taken over "
                                      f"by itself), or use another {flag}")
            if holder.get("host") == platform.node() and not _alive(holder["pid"], holder.get("pid_start")):
                if _break_stale(path, holder):
                    logger.warning(f"took over a stale lock of {run_dir} left by a process that is gone "
                                   f"({describe_holder(holder)})")
                    stages = holder.get("stages")
                    inherited = [x for x in stages if isinstance(x, str)] if isinstance(stages, list) else []
                continue
            other = "" if holder.get("host") == platform.node() else \
                f" (another host: if that process is gone, remove {path})"
            raise EvalParityError(f"{run_dir} is in use by another evalparity ({describe_holder(holder)}){other}: "
                                  f"wait for it to finish, or use another {flag}", exit_code=2)
        raise EvalParityError(f"could not take the lock {path} (it keeps changing hands): retry, or use "
                              f"another {flag}")
    except OSError as err:
        for d in created:
            with contextlib.suppress(OSError):
                d.rmdir()
        if isinstance(err, (FileExistsError, NotADirectoryError)):
            raise EvalParityError(f"{flag} {run_dir} is below a file: give {flag} a directory path") from None
        raise writable_dir_error(run_dir, err, flag) from None
    except BaseException:
        for d in created:
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


# ---------------------------------------------------------------- what a killed command left
def _remove(path: Path) -> None:
    """Remove a folder moved aside, or only the link where it was a link (never what a link points to)."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _held(run_dir: Path) -> RunLock | None:
    return _HELD.get(_key(run_dir))


@contextlib.contextmanager
def staged_outputs(run_dir: Path, names: tuple[str, ...]) -> Iterator[Path]:
    """A staging folder that reads like ``run_dir`` (links to everything but ``names``), for code that
    writes ``run_dir/<name>/``; when the block ends without error, each ``<name>`` replaces the run's own,
    back to back, so readers see the old set or the new one. On error the run's own are untouched.

    A kill during the block leaves the run's own untouched (the next command removes the staging folder).
    A kill between the renames (``COMMITTED`` written, some names swapped in) is finished by the next
    command on the run, which holds the lock: ``recover_outputs`` swaps in the rest from the whole staged
    set, so no old ``report/`` stays beside a new ``stats/``. Call it with the run directory locked: the
    staging folder's name goes into the lock's record, which is how the next command knows it for this
    command's (``recover_outputs``)."""
    bad = [n for n in names if n not in OUTPUT_NAMES]
    if bad:
        raise ValueError(f"staged_outputs publishes only {OUTPUT_NAMES}, not {bad}")
    recover_outputs(run_dir)
    stage = run_dir / f"{STAGE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    lock = _held(run_dir)
    if lock is not None:
        lock.update(stages=[*lock.info.get("stages", []), stage.name])
    stage.mkdir()
    trash: list[Path] = []
    try:
        for p in run_dir.iterdir():
            if p.name not in names and not p.name.startswith("."):
                (stage / p.name).symlink_to(p.absolute())  # not resolved: a link loop in the run is its own
        yield stage
        write_json(stage / COMMITTED, {"names": list(names)})  # from here on, a kill is finished, not undone
        for name in names:  # old ones out of the way first, so the swap is two renames back to back
            if (run_dir / name).exists():
                trash.append(run_dir / f"{TRASH_PREFIX}{name}-{os.getpid()}")
                (run_dir / name).replace(trash[-1])
        for i, name in enumerate(names):
            if i:
                kill_point("publish-outputs")
            if (stage / name).exists():
                (stage / name).replace(run_dir / name)
    except BaseException:
        for t in trash:  # put back what was moved aside
            with contextlib.suppress(OSError):
                t.replace(run_dir / t.name.removeprefix(TRASH_PREFIX).rsplit("-", 1)[0])
        raise
    finally:
        for t in trash:
            _remove(t)
        shutil.rmtree(stage, ignore_errors=True)
        if lock is not None:
            with contextlib.suppress(OSError):
                lock.update(stages=[x for x in lock.info.get("stages", []) if x != stage.name])


def recover_outputs(run_dir: Path) -> None:
    """Finish or drop what a killed command left in ``run_dir``. Call it holding the run's lock: only the
    staging folders that lock's record names (a dead holder's, taken over with its stale lock) are
    touched; a staged set whose publish had begun is swapped in (it is whole, and only ``stats``, ``report``
    or ``drift`` are ever swapped), any other such folder is removed. Any other folder that looks like a
    staging folder is left alone, with a warning: a name on disk is not proof that evalparity made it.
    Old folders moved aside (``.trash-*``, here and in ``cells/`` and ``shards/``) are removed."""
    lock = _held(run_dir)
    mine = set(lock.info.get("stages", [])) if lock is not None else set()
    for stage in sorted(run_dir.glob(f"{STAGE_PREFIX}*")):
        if stage.name not in mine or stage.is_symlink() or not stage.is_dir():
            if lock is not None and stage.name not in mine:
                logger.warning(f"left {stage} alone: no evalparity command on this run recorded making it")
            continue
        done = read_json(stage / COMMITTED)
        names = done.get("names") if done else None
        if isinstance(names, list) and names and all(n in OUTPUT_NAMES for n in names):
            for name in names:
                new = stage / name
                if new.is_dir() and not new.is_symlink():
                    if (run_dir / name).exists():
                        (run_dir / name).replace(run_dir / f"{TRASH_PREFIX}{name}-{stage.name}")
                    new.replace(run_dir / name)
            logger.warning(f"finished publishing the {' and '.join(names)} of an earlier command that was killed "
                           "midway")
        shutil.rmtree(stage, ignore_errors=True)
        if lock is not None:
            lock.update(stages=[x for x in lock.info.get("stages", []) if x != stage.name])
    for folder in (run_dir, layout.cells_dir(run_dir), layout.shards_dir(run_dir)):
        if folder.is_symlink():  # not the run's own folder: what is behind it is none of this command's
            continue
        for t in folder.glob(f"{TRASH_PREFIX}*") if folder.is_dir() else []:
            _remove(t)
    _move_old_attempts(run_dir)


def _move_old_attempts(run_dir: Path) -> None:
    """Attempt histories an earlier evalparity kept as ``cells/<name>.attempts`` (where the statistics took
    them for a cell that never finished) move to ``attempts/cells/<name>``."""
    for folder in (CELLS, SHARDS):
        if (run_dir / folder).is_symlink():
            continue
        for old in sorted((run_dir / folder).glob("*.attempts")) if (run_dir / folder).is_dir() else []:
            name = old.name.removesuffix(".attempts")
            if not old.is_dir() or not check_name_ok(name):
                continue
            new = layout.attempts_dir(run_dir, name, folder)
            new.parent.mkdir(parents=True, exist_ok=True)
            if not new.exists():
                old.replace(new)
                continue
            for f in sorted(old.iterdir()):
                if not (new / f.name).exists():
                    f.replace(new / f.name)
            with contextlib.suppress(OSError):
                old.rmdir()


