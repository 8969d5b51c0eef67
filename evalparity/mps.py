"""A CUDA MPS server of the run's own, for cells that share a GPU (``--mps``; issue 26: a sign-off's cost).

Cells packed on one GPU (the memory plan) are separate processes, each with its own CUDA context, and the GPU
runs one context's kernels at a time. Through an MPS server their kernels run side by side. Measured on one
H200 (``results/staged-h200``, session 17), the default staged HellaSwag run, six cells packed: the vLLM
cells' scoring over the four rounds took 49.1-51.8 s with MPS against 66.6-72.8 s without (two runs each), the
same 10 verdicts and every table bit-identical; as twelve replicas (``--shards 2``), 20.9-22.4 s per vLLM shard
against 35.6-38.9 s. vLLM's engine in a process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING=1``) changed
nothing there, so the cells were waiting on the GPU's turns, not on their own Python.

The server is private to the run: ``nvidia-cuda-mps-control -f`` (in the foreground: a child that dies with
the run, ``procs``) with its pipe and log directories in a temporary directory of its own. Only processes
given that ``CUDA_MPS_PIPE_DIRECTORY`` (the run's cells) connect to it; every other CUDA program on the machine,
and an MPS server the user runs, are left alone. A client is tried before any cell starts (``PROBE``); when it
cannot connect (MPS unsupported, or the GPU in a compute mode that refuses a second server) the run goes on
without (``--mps auto``) or stops in one line (``--mps on``). MPS changes which kernels overlap, not what they
compute.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from evalparity import procs
from evalparity.errors import EvalParityError
from evalparity.files import write_atomic

CHOICES = ("auto", "on", "off")
CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
READY_S = 10.0   # for the control daemon's pipe to appear
PROBE_S = 60.0   # for the probe client to get a context through the server
# A client: a CUDA context on the first GPU, through the server its environment names (the driver API by
# ctypes: no torch import, about a second).
PROBE = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
for name, call in (("cuInit", lambda: cuda.cuInit(0)), ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(dev), 0)),
                   ("cuDevicePrimaryCtxRetain", lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))):
    rc = call()
    if rc:
        print(f"{name} returned CUDA error {rc}")
        sys.exit(1)
"""


class Unavailable(Exception):
    """The server could not be started or a client could not connect to it; the message says why."""


def check_choice(choice: str) -> None:
    if choice not in CHOICES:
        raise EvalParityError(f"--mps {choice!r} is not one of {', '.join(CHOICES)}: give auto (an MPS server when "
                              "cells share a GPU), on or off")


def decide(choice: str, device: str, shared: bool, remote_ray: bool) -> tuple[bool, str]:
    """(start a server?, why): on when cells share a GPU (``shared``: the memory plan packs more than one job
    on a GPU) of this host. ``--mps on`` where that cannot be is refused in one line; ``auto`` says why not."""
    if choice == "off":
        return False, "off (--mps off)"
    why_not = ""
    if device == "cpu":
        why_not = "the cells run on the CPU"
    elif remote_ray:
        why_not = "the cells run on a Ray cluster's hosts, where this run starts no server (start one there)"
    elif os.environ.get(PIPE_ENV):
        why_not = f"{PIPE_ENV} names an MPS server already, which the cells use"
    elif shutil.which(CONTROL) is None:
        why_not = f"{CONTROL} is not on PATH (it comes with the NVIDIA driver's utilities)"
    elif not shared:
        why_not = "no two cells share a GPU"
    if not why_not:
        return True, "on: cells share a GPU"
    if choice == "on":
        raise EvalParityError(f"--mps on: {why_not}: run with --mps auto or off")
    return False, f"off: {why_not}"


@dataclass
class Server:
    """The run's MPS control daemon (which starts the server on the first client) and its directories."""

    proc: subprocess.Popen
    root: Path
    control: str

    def env(self) -> dict[str, str]:
        """What a cell needs to be the server's client."""
        return _paths(self.root)

    def close(self, log_to: Path | None = None) -> None:
        """Stop the daemon (``quit``, then ``procs.stop``), keep its logs in ``log_to`` (the run's ``mps.log``)
        and remove its directory. Safe to call twice."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run([self.control], input="quit\n", text=True, env=os.environ | self.env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        procs.stop(self.proc, grace_s=2.0)
        if log_to is not None and self.root.exists():
            with contextlib.suppress(OSError):
                logs = sorted((self.root / "log").glob("*.log"))
                write_atomic(log_to, "".join(f"== {p.name}\n{p.read_text(errors='replace')}" for p in logs))
        shutil.rmtree(self.root, ignore_errors=True)


def _paths(root: Path) -> dict[str, str]:
    """The pipe and log directories under ``root``, as the daemon and its clients find them."""
    return {PIPE_ENV: str(root / "pipe"), LOG_ENV: str(root / "log")}


def serve(choice: str, sharing: tuple[bool, str]) -> tuple[Server | None, str]:
    """(the server, or None; why) for ``decide``'s answer ``sharing``: started where it says so. A server no
    client can use stops the command under ``--mps on`` (one line) and is done without under ``auto`` (the
    why then says so, for the caller to show and record)."""
    wanted, why = sharing
    if not wanted:
        return None, why
    try:
        return start(), why
    except Unavailable as err:
        if choice == "on":
            raise EvalParityError(f"--mps on: {err}: run with --mps auto or off") from None
        return None, f"off: {err}"


def start(control: str = CONTROL, probe: str = PROBE) -> Server:
    """The daemon started and a client connected through it; ``Unavailable`` (with the reason) otherwise, with
    everything it started stopped and removed."""
    root = Path(tempfile.mkdtemp(prefix="evalparity-mps-"))  # short: the pipe is a socket path (108 bytes)
    (root / "pipe").mkdir()
    (root / "log").mkdir()
    # Not under the user's CUDA_VISIBLE_DEVICES: a daemon started so renumbers the GPUs it sees, and the cells,
    # given host GPU numbers by the placement, would then name others (NVIDIA's MPS documentation).
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    try:
        with open(root / "log" / "control-output.log", "wb") as out:  # in the foreground it writes here
            proc = procs.popen([control, "-f"], env=env | _paths(root),
                               stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    except OSError as err:
        shutil.rmtree(root, ignore_errors=True)
        raise Unavailable(f"{control} could not be started ({err.strerror or err})") from None
    server = Server(proc, root, control)
    try:
        deadline = time.monotonic() + READY_S
        while not (root / "pipe" / "control").exists():
            if proc.poll() is not None:
                raise Unavailable(f"{control} exited with status {proc.returncode} at its start")
            if time.monotonic() > deadline:
                raise Unavailable(f"{control} did not open its pipe within {READY_S:.0f} s")
            time.sleep(0.05)
        try:
            tried = subprocess.run([sys.executable, "-c", probe], env=os.environ | server.env(), text=True,
                                   stdin=subprocess.DEVNULL, capture_output=True, timeout=PROBE_S)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"a client got no CUDA context through the server within {PROBE_S:.0f} s") from None
        if tried.returncode != 0:
            last = (tried.stdout + tried.stderr).strip().splitlines()
            raise Unavailable(f"a client could not connect ({last[-1] if last else f'exit {tried.returncode}'})")
    except BaseException:
        server.close()
        raise
    return server
