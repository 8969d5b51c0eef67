"""A run's own Ray instance that comes up but refuses the run's connection (seen on an H200: "Failed to connect
to Ray cluster at <node ip>:<port>" after 21 s) is refused in one line that names the instance's log, where
the reason is, and the way to run without Ray; a cluster the user named keeps its own advice."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from evalparity import placement as pl
from evalparity.errors import EvalParityError


class _Head:
    log_path = "/tmp/evalparity-ray-test.log"
    temp_dir = "/tmp/evalparity-ray-test"

    def __init__(self) -> None:
        self.abandoned = False

    def wait(self) -> str:
        return "127.0.0.1:6553"

    def abandon(self) -> None:
        self.abandoned = True


def _refuse(**_kw):
    raise ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6553\nmore")


def test_an_own_instance_that_refuses_the_run_names_its_log(monkeypatch, tmp_path):
    import ray

    monkeypatch.setattr(pl, "check_reachable", lambda _address: None)
    monkeypatch.setattr(pl, "use_token_auth", lambda _address: False)
    monkeypatch.setattr(ray, "init", _refuse)
    head = _Head()
    with pytest.raises(EvalParityError) as err:
        pl.RayExecutor(str(tmp_path), "model", "local", head=head)
    text = str(err.value)
    assert "\n" not in text and head.abandoned
    assert "192.0.2.2:6553" in text and f"its log is {_Head.log_path}" in text and _Head.temp_dir in text
    assert "drop --ray local" in text and "--cells-per-gpu 1" in text
    with pytest.raises(EvalParityError) as err:  # the user's cluster: no log of ours to name
        pl.RayExecutor(str(tmp_path), "model", "10.0.0.9:6379")
    assert "its log is" not in str(err.value) and "ray start --head" in str(err.value)


def _connects_with_sigterm_handler(monkeypatch, tmp_path, init, handler, expected, after=None) -> None:
    """``RayExecutor`` connecting through ``init`` (in ray.init's place) while ``handler`` is this process's
    SIGTERM handler: it raises ``expected``, and ``after`` (default: ``handler``) is in place afterwards."""
    import ray

    monkeypatch.setattr(pl, "check_reachable", lambda _address: None)
    monkeypatch.setattr(pl, "use_token_auth", lambda _address: False)
    monkeypatch.setattr(ray, "init", init)
    before = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(expected):
            pl.RayExecutor(str(tmp_path), "model", "10.0.0.9:6379")
        assert signal.getsignal(signal.SIGTERM) is (handler if after is None else after)
    finally:
        signal.signal(signal.SIGTERM, before)


def test_connecting_to_ray_keeps_the_commands_sigterm_handler(monkeypatch, tmp_path):
    """``ray.init()`` sets its own SIGTERM handler (``sys.exit(15)``): a Ray run stopped by a CI job's time
    limit exited 15, silently, instead of the command's 143 and its line on how to resume (``cli.Stopped``)."""
    from ray._private.utils import set_sigterm_handler

    def init_as_ray_does(**_kw):
        set_sigterm_handler(lambda signum, frame: None)  # what ray.init does first, in the main thread
        raise ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6553")

    def ours(signum, frame):
        raise AssertionError("not called")

    _connects_with_sigterm_handler(monkeypatch, tmp_path, init_as_ray_does, ours, EvalParityError)


def test_sigterm_while_connecting_to_ray_goes_to_the_commands_handler(monkeypatch, tmp_path):
    """SIGTERM while ``ray.init()`` connects (Ray's handler in place: ``sys.exit(15)``, no line) reaches the
    command's own handler (``cli.Stopped``: 143 and how to resume), and what that handler leaves for the next
    SIGTERM (the default: a second one ends the process) is not undone."""
    from ray._private.utils import set_sigterm_handler

    class Ours(Exception):
        pass

    def ours(signum, frame):  # as the command's: the next SIGTERM ends the process at once
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Ours

    def init_then_sigterm(**_kw):
        set_sigterm_handler(lambda signum, frame: sys.exit(signum))  # Ray's own, as ray.init sets it
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs before this ends

    _connects_with_sigterm_handler(monkeypatch, tmp_path, init_then_sigterm, ours, Ours, after=signal.SIG_DFL)


def _sigterm_caught() -> bool:
    """Whether the kernel delivers SIGTERM to a handler of this process (SigCgt), whatever Python believes."""
    with open("/proc/self/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(mask >> (signal.SIGTERM - 1) & 1)


def test_stopping_ray_keeps_the_kernels_sigterm_handler():
    """``ray.shutdown()`` reset SIGTERM's disposition to the default in the kernel, behind Python's back: after
    a Ray run's cells, SIGTERM killed the process silently (no line, no run.json, the lock left)."""
    import ctypes

    class FakeRay:
        def cancel(self, ref, force):
            pass

        def shutdown(self):  # what Ray's C++ side does: the libc call, which Python's signal module never sees
            libc = ctypes.CDLL(None, use_errno=True)
            libc.signal.restype = ctypes.c_void_p
            libc.signal(signal.SIGTERM, ctypes.c_void_p(0))  # SIG_DFL

    def ours(signum, frame):
        raise AssertionError("not called")

    executor = object.__new__(pl.RayExecutor)
    executor.refs, executor.ray, executor.head = [], FakeRay(), None
    before = signal.signal(signal.SIGTERM, ours)
    try:
        assert _sigterm_caught()
        executor.stop()
        assert _sigterm_caught() and signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, before)
