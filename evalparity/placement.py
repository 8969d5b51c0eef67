"""Where each cell runs: one process at a time on this machine, or Ray tasks over a host's GPUs or a cluster.

The unit of work is a ``Job``: one cell, or one shard of a sharded cell, run as its own process
(``python -m evalparity.cells``). Two executors start jobs and report when they end:

- ``LocalExecutor`` runs one job at a time here (a CPU, a GPU, or the GPUs of a tensor-parallel cell, which
  it names in the job's ``CUDA_VISIBLE_DEVICES``);
- ``RayExecutor`` submits every job at once as a Ray task that asks for the GPUs (or CPUs) the job needs,
  and lets Ray place them: on the GPUs of this host (a local Ray instance) or on a cluster (``--ray
  ADDRESS``). Ray, not evalparity, decides which job waits; a job starts as soon as a GPU it fits on is free.

Either way the job's process writes its results into the run directory (which on a cluster must be on
storage every host reaches) and publishes them by an atomic rename, so a lost host loses only the job it
was running. Each job is told where it runs through ``EVALPARITY_PLACEMENT``, and records that in its
``cell.json``.

A cell with ``python=NAME`` runs its process under the interpreter ``--python NAME=PATH`` named (another venv:
another vLLM, transformers or lm-eval); ``start_job`` picks it, for both executors (``cell_interpreter``).
On Ray the task is only the launcher of that process, so it stays on the interpreter Ray's workers run;
Ray's own way, ``runtime_env={"py_executable": PATH}``, would start the Ray worker itself under PATH, which
then needs Ray (the cluster's version) and the task's code installed in every such environment, for nothing
the cell's process does not already get from being started under PATH.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import logging
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from evalparity import memplan, procs
from evalparity.config import PLACEMENT_ENV, REASON_FD_ENV, STAGES, unit_location
from evalparity.devices import visible_gpus
from evalparity.errors import EvalParityError
from evalparity.rundir import records, rounds


@dataclass(frozen=True)
class Job:
    """One process's worth of work: a cell, or shard ``shard`` of ``shards`` of it."""

    cell: str
    shard: int = 0
    shards: int = 1
    gpus: float = 0.0  # GPUs the job holds (tensor-parallel size, or a fraction when cells share a GPU)
    cpus: float = 1.0  # at least this many; a GPU job on Ray asks for its GPUs' share of a host (gpu_job_cpus)
    env: dict[str, str] = field(default_factory=dict, compare=False)  # what the job's process needs set
    staged: str = ""  # a staged run's cell: "resident" (keeps its model across rounds) or "round" (one round)

    @property
    def location(self) -> tuple[str, str]:
        """(folder, name) the job publishes under (``config.unit_location``); a staged cell's process lives
        in ``stages/.tmp-<cell>`` and publishes its parts beside it."""
        if self.staged:  # its home: stages/.tmp-<cell>, or stages/.tmp-<cell>.<k>of<n> for a replica
            return STAGES, rounds.replica_name(self.cell, self.shard, self.shards)
        return unit_location(self.cell, self.shard, self.shards)

    @property
    def unit(self) -> str:
        return self.location[1]

    def argv(self, run_dir: str, model_path: str, python: str) -> list[str]:
        cmd = [python, "-m", "evalparity.cells", run_dir, self.cell, model_path]
        cmd += ["--staged", self.staged] if self.staged else []
        return cmd + (["--shard", f"{self.shard}/{self.shards}"] if self.shards > 1 else [])


@dataclass
class JobEnd:
    job: Job
    returncode: int | None  # None: the process (or the host running it) was lost before it could say
    error: str = ""
    placement: dict = field(default_factory=dict)


def _die_with_parent() -> None:
    """Run in the Ray head's process before exec: when the run dies, the head dies too (SIGKILL), and Ray's
    reaper takes its daemons down. (Jobs get the same and more from ``procs.popen``.)"""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def cell_interpreter(run_dir: str, cell: str) -> str:
    """The interpreter ``cell``'s process runs under: the path its ``python=NAME`` names in the run's spec
    (``RunSpec.interpreter``), else this one. Read from the spec in the run folder, which every host that
    runs a job reaches (the job writes its results there), so that a Ray task starts the cell under the path
    the run recorded, on whichever host Ray chose (the path must exist there too)."""
    spec = records.read_spec(Path(run_dir))
    entry = next((c for c in spec.cells if c.name == cell), None)
    return (spec.interpreter(entry) if entry is not None else "") or sys.executable


def start_job(job: Job, run_dir: str, model_path: str, placement: dict) -> subprocess.Popen:
    """Start the job's process on this host, under its cell's interpreter (``cell_interpreter``), with its
    environment and the placement it records, and a pipe on which it says why it failed (``job_reason``): a
    reason that reaches the parent even when the disk is too full for the process to record it in the run
    directory."""
    python = cell_interpreter(run_dir, job.cell)
    r, w = os.pipe()
    env = dict(os.environ) | job.env | {PLACEMENT_ENV: json.dumps(placement), REASON_FD_ENV: str(w)}
    try:  # a process group of its own, killed with this process however it ends (procs)
        proc = procs.popen(job.argv(run_dir, model_path, python), env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(w,))
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    proc.reason_fd = r  # type: ignore[attr-defined]
    return proc


def job_reason(proc: subprocess.Popen) -> str:
    """What the ended job's process wrote on its reason pipe (``cells.tell_parent``): '' when nothing."""
    fd = getattr(proc, "reason_fd", None)
    if fd is None:
        return ""
    proc.reason_fd = None  # type: ignore[attr-defined]
    try:
        os.set_blocking(fd, False)  # a grandchild may hold the pipe open: never wait on it
        data = os.read(fd, 1 << 16)
    except OSError:  # BlockingIOError: nothing was written
        data = b""
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace").strip()


def run_job_here(job: Job, run_dir: str, model_path: str, placement: dict) -> tuple[int, str]:
    """Run the job to its end here: its exit code and the reason it gave for a failure ('' if none)."""
    proc = start_job(job, run_dir, model_path, placement)
    try:
        code = proc.wait()
        procs.ended(proc)
        return code, job_reason(proc)
    except BaseException:
        procs.stop(proc)
        job_reason(proc)
        raise


def gpu_count(cheap: bool = False) -> int:
    """GPUs this process may use; ``cheap``: as the driver lists them, a guess made before torch is loaded."""
    return len(visible_gpus(cheap))


def local_gpu_ids(gpus: float) -> list[str]:
    """The device ids a job holding ``gpus`` GPUs gets from the local executor: none for a CPU job; the first
    ``gpus`` of those this process may use for a job over several (its ``CUDA_VISIBLE_DEVICES``: a
    tensor-parallel engine takes every GPU it sees, and must see as many as it spreads over); every one for a
    job of one GPU or less, which keeps the device the run names (``--device cuda:1``)."""
    if not gpus:
        return []
    visible = visible_gpus()
    return visible[:math.ceil(gpus)] if gpus > 1 else visible


class LocalExecutor:
    """One job at a time, in a child process of this one."""

    name = "local"

    def __init__(self, run_dir: str, model_path: str):
        self.run_dir, self.model_path = run_dir, model_path
        self.queue: list[Job] = []
        self.proc: subprocess.Popen | None = None
        self.current: Job | None = None

    def submit(self, jobs: list[Job]) -> None:
        self.queue.extend(jobs)

    def running(self) -> list[Job]:
        return [self.current] if self.current else []

    def busy(self) -> bool:
        return bool(self.queue or self.current)

    def most_gpus(self) -> int:
        """GPUs one job can have here: every GPU this process may use."""
        return gpu_count()

    def poll(self) -> list[JobEnd]:
        ended = []
        if self.proc is not None and self.proc.poll() is not None:
            procs.ended(self.proc)
            ended.append(JobEnd(self.current, self.proc.returncode, error=job_reason(self.proc),
                                placement=self.placement))
            self.proc, self.current = None, None
        if self.proc is None and self.queue:
            job = self.current = self.queue.pop(0)
            ids = local_gpu_ids(job.gpus)
            if job.gpus > 1:  # a tensor-parallel replica: the GPUs it asked for, as Ray would give them
                job = replace(job, env=job.env | {"CUDA_VISIBLE_DEVICES": ",".join(ids)})
            self.placement = {"executor": "local", "host": platform.node(), "gpu_ids": ids,
                              "shard": job.shard, "shards": job.shards}
            self.proc = start_job(job, self.run_dir, self.model_path, self.placement)
        return ended

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)
            job_reason(self.proc)
        self.queue.clear()


def gpu_job_cpus(nodes: list[dict], gpus: float) -> int:
    """CPUs a job holding ``gpus`` GPUs asks Ray for: its GPUs' share of a host's CPUs (16 for one GPU of a
    32-CPU, 2-GPU host), on the GPU host with the fewest CPUs per GPU; at least 1.

    Why: Ray runs a task with OMP_NUM_THREADS set to the CPUs it asked for (1 by default), and the cell's
    process inherits that, where a cell run here one at a time has every core. Asking for the share gives a
    cell on Ray the threads it would have had alone on its slice of the host, and still lets every GPU of a
    host take a job. ``nodes`` is ``ray.nodes()``."""
    ratios = [n["Resources"]["CPU"] / n["Resources"]["GPU"] for n in nodes
              if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) > 0 and "CPU" in n["Resources"]]
    return max(1, int(min(ratios) * gpus + 1e-9)) if ratios and gpus > 0 else 1


def _ray_job(job: Job, run_dir: str, model_path: str) -> tuple[int, dict, str]:
    """The body of one Ray task, on whichever host Ray chose: say where it is, run the job's process."""
    import ray  # heavy: ray (this runs in a Ray worker)

    ctx = ray.get_runtime_context()
    placement = {"executor": "ray", "host": platform.node(), "node_id": ctx.get_node_id(),
                 "node_ip": ray.util.get_node_ip_address(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                 "cpus": ctx.get_assigned_resources().get("CPU"), "shard": job.shard, "shards": job.shards}
    code, reason = run_job_here(job, run_dir, model_path, placement)
    return code, placement, reason


RAY_KEYWORDS = ("auto", "local")  # --ray values that name no address: Ray finds or starts the cluster


def _host_port(address: str | None) -> bool:
    """Whether ``--ray`` names a cluster by HOST:PORT (not a keyword, not a ``ray://`` client URL)."""
    return bool(address) and address not in RAY_KEYWORDS and "://" not in address


def check_reachable(address: str | None, timeout: float = 5.0) -> None:
    """A HOST:PORT address that nothing answers on is refused in seconds (Ray itself retries for minutes)."""
    if not _host_port(address):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise EvalParityError(f"--ray {address!r} is not HOST:PORT, auto or local: e.g. --ray 10.0.0.1:6379")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        raise EvalParityError(f"nothing answers at Ray address {address} ({err.strerror or err}): start the "
                              "cluster with `ray start --head`, or pass --ray local") from None


@contextlib.contextmanager
def _stderr_to(path: str):
    """Send file descriptor 2 (C/C++ code writes there directly) to ``path`` for the block's duration."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "a") as log:
            os.dup2(log.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        if os.path.exists(path) and os.path.getsize(path) == 0:
            os.remove(path)


def _token_available() -> bool:
    """Whether a Ray auth token is at hand: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token (where a
    local ``ray.init()`` of Ray >= 2.5x writes one)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    return os.path.isfile(path)


def _is_this_host(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    if host in ("localhost", platform.node()) or host.startswith("127.") or host == "::1":
        return True
    try:
        return host in {info[4][0] for info in socket.getaddrinfo(platform.node(), None)}
    except OSError:
        return False


def use_token_auth(address: str | None) -> bool:
    """Send this host's Ray auth token to a cluster on this host, as Ray itself does for ``auto``.

    ``ray start --head`` turns token authentication on when ~/.ray/auth_token exists (any earlier local
    ``ray.init()`` writes it), but ``ray.init(address=HOST:PORT)`` never sends the token unless
    RAY_AUTH_MODE=token, so the driver is refused (InvalidAuthToken) after a minute of retries. For an
    address on this host the token is this host's own, so it is sent; a remote cluster's token is the
    user's to give (RAY_AUTH_MODE=token), and a refusal says so. Returns whether token mode is on."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return mode.lower() == "token"
    if _host_port(address) and _token_available() and _is_this_host(address):  # the file before a DNS lookup
        os.environ["RAY_AUTH_MODE"] = "token"
        return True
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRayHead:
    """A new Ray instance on this host, started in a process of its own (``ray start --head --block``) as
    soon as the run knows it will want one, so that Ray's start overlaps the run's setup (reading the task
    index and every task's data) instead of following it.

    Why a process and not ``ray.init()``: Ray's start is mostly waiting on the daemons it spawns (GCS, raylet,
    agents), 4-6 s on a 2-core machine and about 10 s on the H200 host, and the run's setup is about 8 s more
    on the latter. Started on a thread of the run's own process instead, the two slowed each other down (GIL)
    and overlapped by about 1 s (results/h200x2-scaleout/README.md, fourth lease). Stopping the head (SIGTERM)
    takes its daemons down with it; if this process dies, the head gets SIGKILL (PR_SET_PDEATHSIG) and Ray's
    reaper takes the daemons down. Its output goes to a file of its own (``log_path``), not the terminal."""

    READY = "Ray runtime started"

    def __init__(self, log_path: str | None = None) -> None:
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="evalparity-ray-", suffix=".log")
            os.close(fd)
        self.log_path = log_path
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        # its own temp dir: `ray start` records its address there (ray_current_cluster), and in Ray's default
        # one it would redirect the user's own `ray.init()` and `ray status` to this short-lived instance
        self.temp_dir = tempfile.mkdtemp(prefix="evalparity-ray-")
        cmd = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())",
               "start", "--head", "--block", f"--port={port}", f"--ray-client-server-port={_free_port()}",
               f"--temp-dir={self.temp_dir}", "--include-dashboard=false", "--disable-usage-stats"]
        self.t0, self.started_at = time.perf_counter(), time.time()
        self.ready_s: float | None = None
        self.waited_s = 0.0
        self.failed = False
        self.terminated = False
        self.log_to: str | None = None
        with open(log_path, "w") as log:
            # No 30 s drain on SIGTERM (Ray >= 2.5x waits for a node's work to move elsewhere): a run stops
            # its instance only when no cell is left on it. No prestarted workers: when the first driver
            # connects, the raylet starts one idle worker per CPU (32 on a 2-GPU H200 host) and ray.init()
            # waits on them (0.8 s with 2 here), for a run that needs one worker per cell.
            env = dict(os.environ) | {"PYTHONUNBUFFERED": "1", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
                                      "RAY_prestart_worker_first_driver": "0"}
            self.proc = subprocess.Popen(cmd, env=env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=_die_with_parent)

    def _log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait(self, timeout: float = 300.0) -> str:
        """The head's address, once it says it is up; a one-line error if it exits or stays silent.
        Sets ``ready_s`` (from the head's start to its "started" line, by that line's own time stamp) and
        ``waited_s`` (how long this call waited: what the early start did not hide)."""
        t = time.perf_counter()
        while self.ready_s is None:
            text = self._log()
            if self.READY in text:
                self.ready_s = self._stamped(text) or time.perf_counter() - self.t0
            elif self.proc.poll() is not None or time.perf_counter() - self.t0 > timeout:
                lines = [ln.strip() for ln in self._log().splitlines() if ln.strip()]
                code = self.proc.returncode
                why = f"exit {code}" if code is not None else f"not up in {timeout:.0f} s"
                errors = [ln for ln in lines if "Error:" in ln or "Exception:" in ln]  # the raise, not its advice
                last = (errors or lines or ["no output"])[-1][:160]
                self.abandon()
                raise EvalParityError(f"a local Ray instance did not start ({why}: {last}; log {self.log_path}): "
                                      "pass --ray ADDRESS of a running cluster, or see the log")
            else:
                time.sleep(0.1)
        self.waited_s = time.perf_counter() - t
        return self.address

    def _stamped(self, text: str) -> float | None:
        """Seconds from the head's start to the log line saying it is up, by that line's time stamp (Ray's
        "2026-11-30 12:52:19,206 SUCC ..."); None if it cannot be read."""
        line = next(ln for ln in text.splitlines() if self.READY in ln)
        try:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            return None
        return max(0.0, at - self.started_at)

    def abandon(self) -> None:
        """Stop a head that failed (to start, or to take the run's connection), keeping its log and Ray's
        session logs for the user: ``close`` then leaves them where they are."""
        self.failed = True
        self.stop()

    def close(self) -> None:
        """Stop the head and move its log to ``log_to`` (the run directory's, set once a run connected), or
        remove it; a head that failed to start keeps its log where the error said. Safe to call twice."""
        self.stop()
        with contextlib.suppress(OSError):
            if self.log_to:
                os.replace(self.log_path, self.log_to)
            elif not self.failed:
                os.remove(self.log_path)
        if not self.failed:  # Ray's own session logs: the head's log above says what a user needs
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def stop(self, wait: bool = True) -> None:
        """SIGTERM the head (it stops its daemons), SIGKILL its whole session after 30 s. ``wait=False`` only
        sends SIGTERM: the daemons then stop (about 2 s) while the run computes its statistics, and ``close``
        waits for them. Safe to call twice."""
        if self.proc.poll() is None:
            if not self.terminated:
                self.proc.terminate()
                self.terminated = True
            if not wait:
                return
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@contextlib.contextmanager
def keeps_sigterm_handler():
    """Put this process's SIGTERM handler back after the block. ``ray.init()`` replaces it with its own
    (``sys.exit(15)``), and ``ray.shutdown()`` resets the kernel's disposition to the default behind Python's
    back (``signal.getsignal`` still names the old handler): a run stopped by SIGTERM (a CI job's time limit)
    then exited 15, or died by the signal, without a line and without ``run.json``, and the command's handler
    (``cli.Stopped``: 143 and how to resume) and ``procs``' (its children's groups killed at once) were gone.
    A SIGTERM inside the block (Ray's ``sys.exit(15)``) goes to the handler put back. Only the main thread
    can set handlers; elsewhere nothing is touched."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    except SystemExit as ended:  # SIGTERM while Ray's handler was in place: handled as this process handles it
        if before is None or ended.code != signal.SIGTERM:
            raise
        signal.signal(signal.SIGTERM, before)
        if callable(before):
            before(signal.SIGTERM, None)
        elif before == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGTERM)
        raise
    finally:
        # signal.signal sets the kernel's disposition too, which Ray's C++ side may reset. Not where the handler
        # put back has run meanwhile and chosen the default for the next SIGTERM (cli: a second one ends it)
        if before is not None and signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN):
            signal.signal(signal.SIGTERM, before)


class RayExecutor:
    """Every job as a Ray task asking for its GPUs/CPUs; Ray queues and places them."""

    name = "ray"

    def __init__(self, run_dir: str, model_path: str, address: str | None, head: LocalRayHead | None = None):
        """Connect to Ray at ``address``, or to ``head`` (a new local instance started earlier), which this
        executor then stops with itself."""
        if importlib.util.find_spec("ray") is None:
            raise EvalParityError("Ray is not installed: pip install 'ray>=2.40' (or the [ray] extra), "
                                  "or run without --ray")
        self.head = head
        if head is not None:
            address = head.wait()
        check_reachable(address)
        token = use_token_auth(address)  # read when Ray is first imported: nothing here imports it earlier
        import ray  # heavy: ray; after use_token_auth, whose RAY_AUTH_MODE it reads at import

        self.ray = ray
        self.run_dir, self.model_path = run_dir, model_path
        kw = {"address": address} if address else {}
        try:
            # Ray's own logs and the workers' output stay off the user's terminal (cells log to files); what
            # its C++ side prints while it connects (a warning a second while it retries) goes to ray.log.
            if address == "local":  # a new instance in this process: no prestarted workers (LocalRayHead)
                kw["_system_config"] = {"prestart_worker_first_driver": False}
            with _stderr_to(os.path.join(run_dir, "ray.log")), keeps_sigterm_handler():
                ray.init(**kw, log_to_driver=False, include_dashboard=False, logging_level=logging.ERROR,
                         configure_logging=True, ignore_reinit_error=True)
        except (ConnectionError, RuntimeError, ValueError) as err:
            if head is not None:
                head.abandon()
            where = address or "a new local instance"
            fix = "start it with `ray start --head` or pass --ray local"
            if address and address not in RAY_KEYWORDS and not token:
                fix = ("if it uses token authentication, set RAY_AUTH_MODE=token and give its token "
                       "(RAY_AUTH_TOKEN or ~/.ray/auth_token); else " + fix)
            if head is not None:  # the run's own instance: its logs say why, and running without Ray is the fix
                fix = (f"its log is {head.log_path} (Ray's own under {head.temp_dir}); to run without Ray, drop "
                       "--ray local and, on a host of several GPUs, show the run one (CUDA_VISIBLE_DEVICES=0); on "
                       "one GPU add --cells-per-gpu 1")
            raise EvalParityError(f"cannot connect to Ray at {where} ({str(err).splitlines()[0][:120]}): "
                                  f"{fix}") from None
        if head is not None:
            head.log_to = os.path.join(run_dir, "ray-head.log")
        self.task = ray.remote(max_retries=0)(_ray_job)
        self.refs: dict = {}

    def resources(self) -> dict:
        return self.ray.cluster_resources()

    def most_gpus(self) -> int:
        """GPUs one job can have: those of the cluster's live host with the most (a task's GPUs are one
        host's, so a tensor-parallel replica needs them on one host)."""
        return int(max((n.get("Resources", {}).get("GPU", 0) for n in self.ray.nodes() if n.get("Alive")),
                       default=0))

    def submit(self, jobs: list[Job]) -> None:
        nodes = self.ray.nodes() if any(j.gpus for j in jobs) else []
        for job in jobs:
            cpus = max(job.cpus, gpu_job_cpus(nodes, job.gpus)) if job.gpus else job.cpus
            ref = self.task.options(num_gpus=job.gpus, num_cpus=cpus, name=f"evalparity:{job.unit}").remote(
                job, self.run_dir, self.model_path)
            self.refs[ref] = job

    def running(self) -> list[Job]:
        return list(self.refs.values())

    def busy(self) -> bool:
        return bool(self.refs)

    def poll(self) -> list[JobEnd]:
        if not self.refs:
            return []
        done, _ = self.ray.wait(list(self.refs), num_returns=len(self.refs), timeout=0)
        ended = []
        for ref in done:
            job = self.refs.pop(ref)
            try:
                code, placement, *reason = self.ray.get(ref)
                ended.append(JobEnd(job, code, error=reason[0] if reason else "", placement=placement))
            except Exception as err:  # noqa: BLE001 - a worker or host lost: that job only
                msg = str(err).strip().splitlines()
                ended.append(JobEnd(job, None, error=f"{type(err).__name__}: {msg[0][:200] if msg else ''}"))
        return ended

    def stop(self) -> None:
        for ref in list(self.refs):
            self.ray.cancel(ref, force=True)
        self.refs.clear()
        with keeps_sigterm_handler():
            self.ray.shutdown()
        if self.head is not None:  # its daemons stop while the run goes on; LocalRayHead.close waits for them
            self.head.stop(wait=False)


# ---------------------------------------------------------------- the run's choice, before its setup
# Here, not in matrix, so that the run can start its Ray instance before its checks without loading pandas
# and scipy (matrix -> cells -> samples): a mistake in the arguments is refused in 1.5 s, not 2.5 s.

@dataclass(frozen=True)
class Placement:
    """How cells are spread: which executor, and how much of a GPU each replica takes."""

    ray: str | None = None     # None: decide here (Ray over this host's GPUs when several are free)
    cells_per_gpu: int = 1     # >1 lets small models share a GPU (each then takes 1/N of it)
    mps: str = "off"           # --mps, as asked (``mps.decide``)
    cell_env: tuple[tuple[str, str], ...] = ()  # for every cell's process: the run's MPS server (``mps.Server.env``)


def local_ray_wanted(device: str, tensor_parallel: int, placement: Placement, n_jobs: int, gpus: int) -> bool:
    """Whether the run wants a Ray instance of its own on this host: ``--ray local``, or (no ``--ray``) more
    than one job and room on this host's ``gpus`` for more than one at a time. ``tensor_parallel``: the GPUs
    of the run's narrowest job (``matrix.narrowest``): a tp2 cell beside tp1 cells leaves them room to pair up."""
    if placement.ray:
        return placement.ray == "local"
    two = memplan.gpus_to_hold([tensor_parallel] * 2, placement.cells_per_gpu)
    return device != "cpu" and n_jobs > 1 and two <= gpus


def early_ray_head(device: str, tensor_parallel: int, placement: Placement, n_jobs: int):
    """Start the run's own Ray instance now, before the setup, if it will likely want one (``--device`` not
    cpu and the GPUs the driver lists, counted without importing torch), so that Ray's start overlaps the
    setup (``placement.LocalRayHead``). None when not, or when Ray is not installed. A guess that turns out
    wrong costs nothing: ``choose_executor`` decides again, and an unused instance is stopped."""
    if importlib.util.find_spec("ray") is None:
        return None
    if not local_ray_wanted(device, tensor_parallel, placement, n_jobs, gpu_count(cheap=True)):
        return None
    return LocalRayHead()
