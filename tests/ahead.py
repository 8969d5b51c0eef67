"""Long setup commands started ahead of the tests that read them, one at a time, in a background thread.

Why: CI has two cores, and a tiny-model ``evalparity run`` keeps about one of them busy (a vLLM engine on the
CPU pins itself to one core; imports, lm-eval's request handling and the tiny model's HF cells are mostly
single-threaded Python): a one-cell crash run is 19.9 s of CPU for the 16.4 s it took in CI, and the whole
serial suite about 1,800 s of CPU for CI's 1,650-1,770 s. Run one after the other, the suite's long runs
left the second core idle. The jobs here are those runs (the commands of fixtures, and of a few tests, whose
results the tests only read): the same commands with the same arguments, started when the session begins, in
the order in which the collected tests first need them, so that they run beside the tests before them. A
fixture that asks for a job waits for it; a job not started yet is taken back and run by the fixture itself,
as without this module; a job no collected test needs is never run. The background's commands run under
``nice``: the tests in the foreground (some of which time signals against a command) keep the CPU they had,
and the background takes what they leave.

Isolation: a job's inputs (folders, environment, working directory, anything read from the registry of
backends) are fixed in the main thread before the first test starts (``Job.prepare``), so nothing a test
sets later (a monkeypatched variable, a chdir, a registered plugin) reaches a command started in the
background; only the waiting and the files the command writes happen there. Every process started here that
is still running when the session ends is killed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LIVE: set[subprocess.Popen] = set()
_LOCK = threading.Lock()
_STOPPED = threading.Event()


WORKER = "tests-ahead"  # the background thread's name
NICE = 10  # the background's commands yield the CPU to the tests' own (nice -n), so that it only takes what they leave


def _niced(cmd: list[str]) -> list[str]:
    """``cmd`` under ``nice`` when called from the background thread (its children inherit it)."""
    if threading.current_thread().name == WORKER and shutil.which("nice"):
        return ["nice", "-n", str(NICE), *cmd]
    return cmd


def run(cmd: list[str], *, env: dict | None = None, base: dict | None = None, cwd: Path | None = None,
        timeout: float = 900) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` with ``base`` (default: this process's
    environment now) updated by ``env``; the process is known to ``stop`` while it runs."""
    e = dict(os.environ if base is None else base)
    e.update(env or {})
    with subprocess.Popen(_niced(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                          env=e) as p:
        with _LOCK:
            _LIVE.add(p)
        try:
            out, err = p.communicate(timeout=timeout)
        except BaseException:
            p.kill()
            p.communicate()
            raise
        finally:
            with _LOCK:
                _LIVE.discard(p)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@dataclass
class Context:
    """What a job's ``prepare`` may use: fixtures (got in the main thread), and the environment and working
    directory its commands start with (``base`` None: the current ones, when a fixture runs it itself)."""

    request: Any  # the session's pytest FixtureRequest
    base: dict | None = None
    cwd: Path | None = None

    def fixture(self, name: str) -> Any:
        return self.request.getfixturevalue(name)

    def mktemp(self, name: str) -> Path:
        return self.fixture("tmp_path_factory").mktemp(name)

    def run(self, cmd: list[str], env: dict | None = None, cwd: Path | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess:
        return run(cmd, env=env, base=self.base, cwd=cwd or self.cwd, timeout=timeout)

    def popen(self, cmd: list[str], **kwargs) -> subprocess.Popen:
        """``subprocess.Popen(cmd, **kwargs)`` in the job's environment and folder; killed by ``stop`` if it
        is still running then."""
        p = subprocess.Popen(_niced(cmd), cwd=kwargs.pop("cwd", self.cwd),
                             env=dict(os.environ if self.base is None else self.base), **kwargs)
        with _LOCK:
            _LIVE.add(p)
        return p


@dataclass
class Job:
    """``prepare(context)`` makes the job's folders and fixes its inputs, and returns the work: a callable
    of no arguments that runs the commands and returns what the fixture reads."""

    fixture: str
    prepare: Callable[[Context], Callable[[], Any]]
    wanted: Callable[[], bool]
    first: bool = False
    state: str = "new"  # new -> queued (prepared) -> running | inline -> done
    work: Callable[[], Any] | None = None
    value: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def finish(self) -> None:
        try:
            self.value = self.work()
        except BaseException as err:  # noqa: BLE001 - raised again in the fixture that takes it
            self.error = err
        finally:
            self.done.set()


_JOBS: dict[str, Job] = {}


def job(fixture: str, wanted: Callable[[], bool] = lambda: True, first: bool = False):
    """Decorator: ``prepare`` is the job read by the fixture named ``fixture``. ``wanted``: whether it can
    run here at all (a job whose tests would be skipped is not started). ``first``: started before the jobs
    needed earlier, for a long job that the tests reach before it could finish in its turn (the tests then
    run the earlier, shorter jobs themselves, beside it)."""
    def register(prepare: Callable[[Context], Callable[[], Any]]):
        assert fixture not in _JOBS, f"two jobs for the fixture {fixture!r}"
        _JOBS[fixture] = Job(fixture, prepare, wanted, first)
        return prepare
    return register


def start(request) -> None:
    """Prepare, in the main thread, the jobs that the session's collected tests need, in the order of
    their first use, and start the background thread that runs them one by one."""
    first: dict[str, int] = {}
    for i, item in enumerate(request.session.items):
        for name in getattr(item, "fixturenames", ()):
            if name in _JOBS and name not in first:
                first[name] = i
    order = sorted(first, key=lambda n: (not _JOBS[n].first, first[n]))
    planned = [_JOBS[n] for n in order if _JOBS[n].state == "new" and _JOBS[n].wanted()]
    if not planned:
        return
    context = Context(request, base=dict(os.environ), cwd=Path.cwd())
    for j in planned:
        j.work = j.prepare(context)
        j.state = "queued"
    threading.Thread(target=_worker, args=(planned,), name=WORKER, daemon=True).start()


def _worker(planned: list[Job]) -> None:
    for j in planned:
        with _LOCK:
            if j.state != "queued" or _STOPPED.is_set():
                continue
            j.state = "running"
        j.finish()


def take(fixture: str, request) -> Any:
    """The job's result: waited for when it runs in the background, else run here (prepared now if it was
    not planned, which needs the fixture's ``request``). Its error, if it raised, is raised here. A job may
    take another one (planned: a fixture the first one's fixture depends on)."""
    j = _JOBS[fixture]
    with _LOCK:
        state = j.state
        if state in ("new", "queued"):
            j.state = "inline"
    if state == "new":
        assert request is not None, f"the job {fixture!r} was not planned: take it from its fixture"
        try:
            j.work = j.prepare(Context(request))
        except BaseException as err:
            j.error = err
            j.done.set()
            raise
    if state in ("new", "queued"):
        j.finish()
    j.done.wait()
    if j.error is not None:
        raise j.error
    return j.value


def stop() -> None:
    """Start nothing more, and kill what is still running (a session that ended early, or was interrupted)."""
    with _LOCK:
        _STOPPED.set()
        live = list(_LIVE)
    for p in live:
        p.kill()
