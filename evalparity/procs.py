"""Child processes that die with the command that started them, however it ends.

A cell or a drift worker holds GPU memory; one left running after its command is gone holds it until someone
finds and kills it (an ``evalparity drift`` killed by ``timeout`` left a vLLM worker holding 44 GiB). So every
child is started by ``popen``, which gives it

- a process group of its own (its engine subprocesses, vLLM's EngineCore for one, are born into it), which
  the parent kills whole on each of its exit paths: a normal return or an exception (``atexit``), Ctrl-C
  (KeyboardInterrupt unwinds to ``atexit``), and SIGTERM or SIGHUP (``timeout``, a closed terminal, a batch
  scheduler), which are caught here, passed on to the groups, and then take the parent down as before;
- ``PR_SET_PDEATHSIG``: the kernel sends the child SIGKILL when its parent dies, even by SIGKILL, where no
  exit path of the parent runs;
- a guard in its group (a small ``python -S`` process, another child of the parent, with SIGTERM as its
  parent-death signal) that kills the group when the parent dies that way, so the grandchildren go too.

The parent-death signal fires when the *thread* that started the child exits, not the process: start children
from the thread that lives as long as they should (every caller here starts them from the main thread; a
Ray task runs ``placement.run_job_here`` on its worker's main thread).

A leaf module: the standard library only, so that the executors and the drift share it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import getpass
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # what stops a command from outside; SIGINT unwinds as Ctrl-C

# The guard: in the child's process group, it kills that group when the parent dies, or straight away if the
# parent is already gone (reparented) by the time it runs, and then removes the child's temporary folder (its
# second argument: ``private_tmp_env``), which no exit path of the dead parent will; it leaves the group first
# to outlive it that long (where it cannot, it kills the group and itself with it, as before). SIGTERM, its
# parent-death signal, arrives blocked (``_guard_setup``) and is unblocked once the handler is in place, so it
# cannot kill the guard before the guard can act on it. While the parent lives, the guard dies with the group.
_GUARD = """
import os, signal, sys
def kill(*_):
    group = os.getpgid(0)
    try:
        os.setpgid(0, 0)
    except OSError:
        os.killpg(0, signal.SIGKILL)
    os.killpg(group, signal.SIGKILL)
    if len(sys.argv) > 2:
        import shutil, time
        for _ in range(100):
            shutil.rmtree(sys.argv[2], ignore_errors=True)
            if not os.path.lexists(sys.argv[2]):
                break
            time.sleep(0.02)
    os._exit(0)
signal.signal(signal.SIGTERM, kill)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
if os.getppid() != int(sys.argv[1]):
    kill()
while True:
    signal.pause()
"""

_children: dict[int, subprocess.Popen] = {}  # pid (= its process group) -> the child, until it has ended
_lock = threading.RLock()  # re-entrant: the signal handler may run while the main thread holds it
_prctl: Callable | None = None


def _load_prctl() -> Callable | None:
    """libc's prctl, looked up in the parent: a child between fork and exec must not load a library (another
    thread of the parent may hold the loader's lock at the fork)."""
    global _prctl
    if _prctl is None and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
    return _prctl


def _die_with_parent(sig: int) -> None:
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, sig)


def _child_setup() -> None:
    """In the child, after fork and before exec: a process group of its own, SIGKILL when the parent dies."""
    os.setpgid(0, 0)
    _die_with_parent(signal.SIGKILL)


def prepare_fork() -> None:
    """Before forking workers that will call ``forked_worker_setup``: libc's prctl looked up here, in the
    parent (``_load_prctl`` says why)."""
    _load_prctl()


def forked_worker_setup(parent: int) -> None:
    """First thing in a worker forked from this process (a process pool's ``initializer``): it dies with the
    parent (SIGKILL, even when the parent is SIGKILLed), and the parent's children are not its own: the table
    of children emptied and SIGTERM/SIGHUP back to their defaults (the parent's handler, inherited, would
    kill the parent's other children when the pool stops this worker). ``parent``: the forking process's pid;
    a worker whose parent is gone already exits."""
    with _lock:
        _children.clear()
    for sig in EXIT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    _die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the parent-death signal was set
        os._exit(1)


def _guard_setup(group: int) -> Callable[[], None]:
    def setup() -> None:
        os.setpgid(0, group)  # into the child's group (the same session: hence setpgid, not setsid, above)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        _die_with_parent(signal.SIGTERM)
    return setup


TMP_PREFIX = "evalparity-tmp-"
TMP_ROOT_ENV = "EVALPARITY_TMP_ROOT"  # the temporary folder a child's own folder was made in


def private_tmp_env(env: dict[str, str] | None) -> tuple[dict[str, str], str | None]:
    """``env`` (default: this process's) with ``TMPDIR`` a new folder of the child's own, and that folder.
    The engines leave files in the temporary folder and never remove them (vLLM 0.32's ``vllm serve``: ZMQ
    sockets and a ``vllm_dist_<hex>`` rendezvous file, 8 files per managed server measured on a CPU; its
    multi-process paths use the same folder): they were left in /tmp, outside the output folder. The folder is
    removed with the child (``ended``, ``kill_all``), or, where no exit path of this process runs (it was
    killed by SIGKILL, or it is a Ray worker whose task Ray cancelled), by the child's guard (``_GUARD``) once
    it has killed the child.

    The folder is made in the temporary folder the child would have had (``env``'s ``TMPDIR``: a cell's
    ``env.TMPDIR=`` is honoured), or, for a child of a child (a cell's served model), beside its parent's
    (``TMP_ROOT_ENV``), not inside it: socket paths are limited to 108 bytes. Torch's compile cache stays where
    its default was for the child (moving it would make every cell compile cold)."""
    env = dict(os.environ if env is None else env)
    root = env.get(TMP_ROOT_ENV) if Path(env.get("TMPDIR", "")).name.startswith(TMP_PREFIX) else None
    root = root or env.get("TMPDIR") or tempfile.gettempdir()
    if not tmp_fits(root):  # sockets made in a folder of its own would not bind: the child keeps ``root``
        return env, None
    try:
        tmp = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=root)
    except OSError:  # no writable temporary folder: the child finds out as it would have
        return env, None
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(root, f"torchinductor_{_user()}"))
    env.update({"TMPDIR": tmp, TMP_ROOT_ENV: root})
    return env, tmp


SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (sockaddr_un.sun_path, less its NUL)
SOCKET_NAME = 37  # what vLLM adds to the temporary folder for a ZMQ socket: "/" and a UUID


def tmp_fits(root: str) -> bool:
    """Whether a child's own folder in ``root`` leaves room for a socket's path: made in a temporary folder
    longer than 46 bytes, it would not (``vllm serve`` then fails to start: "ipc path ... is longer than 107
    characters"), and the child is left with ``root`` itself, as it would have been."""
    return len(os.fsencode(root)) + 1 + len(TMP_PREFIX) + 8 + SOCKET_NAME <= SOCKET_PATH_MAX


def _user() -> str:
    """The user name as torch's compile cache names its default folder (``cache_dir_utils``)."""
    try:
        name = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):  # no entry in the password file (containers)
        name = f"uid_{os.getuid()}"
    return re.sub(r'[\\/:*?"<>|]', "_", name)


def popen(argv: list[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kwargs)`` for a child that must not outlive this process (see the module's
    docstring), with a temporary folder of its own (``private_tmp_env``). Call ``ended`` once it has ended (or
    ``stop`` to end it), from the thread that started it."""
    _load_prctl()
    _install_handlers()
    kwargs["env"], tmp = private_tmp_env(kwargs.get("env"))
    try:
        proc = subprocess.Popen(argv, preexec_fn=_child_setup, **kwargs)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    proc.tmp = tmp  # type: ignore[attr-defined]
    with _lock:
        _children[proc.pid] = proc
    try:
        proc.guard = subprocess.Popen(  # type: ignore[attr-defined]
            [sys.executable, "-S", "-c", _GUARD, str(os.getpid()), *([tmp] if tmp else [])], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_guard_setup(proc.pid))
    except (OSError, subprocess.SubprocessError):  # the child ended already (its group is gone): no guard needed
        proc.guard = None  # type: ignore[attr-defined]
    return proc


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the child's whole process group (the child, its guard, its own children)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def ended(proc: subprocess.Popen) -> None:
    """The child has ended and been waited for: kill what it left behind in its group (an engine process that
    outlived it, its guard) and forget it. Done at once, while the group's id cannot belong to anyone else."""
    kill_group(proc)
    guard = getattr(proc, "guard", None)
    if guard is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            guard.wait(timeout=5)
    with _lock:
        _children.pop(proc.pid, None)
    _remove_tmp(proc)


def _remove_tmp(proc: subprocess.Popen) -> None:
    tmp = getattr(proc, "tmp", None)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> int:
    """End the child: SIGTERM to its group (it may record why it stopped), SIGKILL after ``grace_s``; returns
    its exit status."""
    if proc.poll() is None:
        kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            proc.wait()
    ended(proc)
    return proc.returncode


def run_logged(argv: list[str], env: dict[str, str], log_path, tick: Callable[[], None],
               every: float = 0.3) -> tuple[int, str | None, str]:
    """Run a worker (``popen``) with its output into ``log_path``, calling ``tick`` while it runs (to show its
    progress), stopped with its engine on any exception here (Ctrl-C). Returns its exit status, the last
    ``error: ...`` line it printed (a worker's one-line refusal, without the prefix) or None, and its log's
    last line (what a crash left)."""
    return run_logged_all([(argv, env, log_path)], tick, every)[0]


def _fresh_log(path) -> object:
    """A worker's log, opened for writing as a new file: a link planted at its name in an output folder is
    removed, never written through (it overwrote a file outside ``--out``: session 32's review)."""
    p = Path(path)
    if p.is_symlink():
        p.unlink()
    return open(p, "w")


def run_logged_all(jobs: list[tuple[list[str], dict[str, str], object]], tick: Callable[[], None],
                   every: float = 0.3, on_end: Callable[[int, int], None] | None = None
                   ) -> list[tuple[int, str | None, str]]:
    """``run_logged`` for several workers at once (argv, environment, log path each): all started, ``tick``
    called until the last ends, every one stopped on any exception here. Each worker's group is cleared
    (``ended``: what it left behind is killed) as soon as it is seen ended, and then ``on_end(index,
    returncode)`` is called once for it: workers that wait on each other learn of its end, with nothing of it
    left holding memory."""
    logs = [_fresh_log(path) for _, _, path in jobs]
    procs: list[subprocess.Popen] = []
    seen: set[int] = set()
    try:
        for (argv, env, _), log in zip(jobs, logs):
            procs.append(popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                               env=os.environ | env))
        while True:
            for k, p in enumerate(procs):
                if k not in seen and p.poll() is not None:
                    seen.add(k)
                    ended(p)
                    if on_end is not None:
                        on_end(k, p.returncode)
            if len(seen) == len(procs):
                break
            tick()
            time.sleep(every)
    except BaseException:
        for k, p in enumerate(procs):
            if k not in seen:  # an ended one's group is cleared already, and its id may be another's by now
                stop(p)
        raise
    finally:
        for log in logs:
            log.close()
    out = []
    for p, (_, _, path) in zip(procs, jobs):
        if p.returncode == 0:
            out.append((0, None, ""))
            continue
        with open(path, errors="replace") as f:
            lines = f.read().strip().splitlines()
        said = next((x for x in reversed(lines) if x.startswith("error: ")), None)
        out.append((p.returncode, said[len("error: "):] if said else None, lines[-1] if lines else "no output"))
    tick()
    return out


def kill_all() -> None:
    """SIGKILL every child's group that has not been reported ended: this process is leaving."""
    with _lock:
        left = list(_children.values())
        _children.clear()
    for proc in left:
        kill_group(proc)
    deadline = time.monotonic() + 5
    for proc in left:
        for p in (proc, getattr(proc, "guard", None)):
            if p is not None:
                _reap(p, deadline)
        _remove_tmp(proc)


def _reap(p: subprocess.Popen, deadline: float) -> None:
    """Wait until ``p`` has ended, or ``deadline``. Not ``p.wait(timeout)``: when a signal handler calls this
    while the main thread is inside ``p.wait()`` (the run waiting for the embedded model's preparation), that
    wait holds the Popen's lock and ``wait(timeout)`` sat out its whole timeout (5 s of a CI job's grace
    period before SIGKILL). ``waitid(WNOWAIT)`` needs no lock and leaves the ended child to be reaped by its
    Popen: reaping it here, an interrupted ``wait()`` that resumes would find no child and report 0."""
    while p.returncode is None and time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return
        except ChildProcessError:  # reaped already (by its Popen)
            return
        time.sleep(0.01)


def live_children() -> list[int]:
    """Pids of the children started here and not yet reported ended (for tests and messages)."""
    with _lock:
        return sorted(_children)


_installed = False


def _install_handlers() -> None:
    """Once, from the main thread: SIGTERM/SIGHUP kill the children's groups, then do what they did before
    (a handler already installed is called; the default one ends this process by the same signal, so its
    exit status still says SIGTERM). Elsewhere (not the main thread) only ``atexit`` and the parent-death
    signal cover the children."""
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(kill_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in EXIT_SIGNALS:
        previous = signal.getsignal(sig)
        if previous == signal.SIG_IGN or previous is None:  # ignored on purpose (nohup), or not set from Python
            continue
        signal.signal(sig, _make_handler(sig, previous))


def _make_handler(sig: int, previous) -> Callable:
    def handler(signum, frame) -> None:
        kill_all()
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return handler


def process_age() -> float | None:
    """Seconds since this process was started (exec'd), from /proc; None where that cannot be read. The
    phase lines in cell.log carry it, so that a process's start (imports included) is on its timeline."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        # the start in clock ticks since boot, against the clock since boot (``btime`` is whole seconds:
        # up to 1 s off)
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None
