"""Children die with their parent (issue 25, item 5): a command killed by SIGKILL or SIGTERM (``timeout``)
leaves no process behind, so none keeps holding GPU memory. Each case kills the parent once its children
exist and checks that every one of them is gone within a few seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import evalparity  # noqa: F401 - the sys.path entry for tests/

ROOT = Path(__file__).resolve().parents[1]

# A parent that starts, through procs.popen, a child that starts a grandchild of its own (as vLLM starts its
# engine process), prints the pids (child, grandchild, the child's guard), then ends as {end} says.
PARENT = """
import subprocess, sys, time
from evalparity import procs
child = procs.popen([sys.executable, "-c",
                     "import subprocess, sys, time; g = subprocess.Popen(['sleep', '300']); "
                     "print(g.pid, flush=True); time.sleep(300)"], stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), child.guard.pid, flush=True)
{end}
"""


def cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # ended meanwhile
        return ""


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def wait_for(predicate, timeout: float = 120.0, what: str = "") -> None:
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.1)


def running(pids: list[int], timeout: float = 5.0) -> list[int]:
    """The pids still running (not zombies) after up to ``timeout`` seconds."""
    t0 = time.monotonic()
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() - t0 > timeout:
            return alive


def start_parent(end: str) -> tuple[subprocess.Popen, list[int]]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(end=end)], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT)
    pids = [int(x) for x in parent.stdout.readline().split()]
    assert len(pids) == 3, pids
    return parent, pids


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_child_and_grandchild_die_with_the_parent(sig):
    parent, pids = start_parent("time.sleep(300)")
    try:
        assert set(pids) == {p.pid for p in descendants(parent.pid)}
        parent.send_signal(sig)
        assert parent.wait(timeout=10) == -sig  # SIGTERM still ends it as SIGTERM (timeout's exit status)
        assert running(pids) == []
    finally:
        parent.kill()


ENDED = "child.wait(); procs.ended(child); print('ended', flush=True); time.sleep(300)"


@pytest.mark.parametrize("end", ["raise SystemExit(7)", "raise KeyboardInterrupt", ENDED])
def test_children_die_on_every_exit_path(end):
    """A return, an error, Ctrl-C; and a child that ended by itself, once its parent saw it end
    (``procs.ended``, as the executors do), takes its leftovers (and its guard) with it."""
    parent, pids = start_parent(end)
    try:
        if end == ENDED:
            os.kill(pids[0], signal.SIGKILL)
            assert parent.stdout.readline().strip() == "ended"
            assert running(pids) == [] and parent.poll() is None
        else:
            assert parent.wait(timeout=30) in (7, -signal.SIGINT)  # an uncaught KeyboardInterrupt: SIGINT
            assert running(pids) == []
    finally:
        parent.kill()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_drift_leaves_no_worker(tiny_model, tmp_path, sig):
    """`timeout` (SIGTERM) on `evalparity drift` left its worker running, holding 44 GiB of an H200."""
    (tmp_path / "p.txt").write_text("the cat sat on the mat\n")
    cmd = [sys.executable, "-m", "evalparity.cli", "drift", "--model", str(tiny_model), "--prompts",
           str(tmp_path / "p.txt"), "--cells", "hf-bf16", "--device", "cpu", "--out", str(tmp_path / "o")]
    parent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        wait_for(lambda: any("evalparity.drift.worker" in cmdline(p) for p in descendants(parent.pid)),
                 what="the drift worker")
        everyone = [p.pid for p in descendants(parent.pid)]
        parent.send_signal(sig)
        parent.wait(timeout=20)
        assert running(everyone) == [], [cmdline(psutil.Process(p)) for p in running(everyone, 0)]
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_killed_run_leaves_no_cell(tiny_model, tiny_tasks, tmp_path):
    """SIGKILL of `evalparity run` once a cell's process exists: the cell, and its group, go with it."""
    cmd = [sys.executable, "-m", "evalparity.cli", "run", "--model", str(tiny_model), "--tasks", "tiny_mc",
           "--include-path", str(tiny_tasks), "--backends", "hf", "--dtypes", "fp32,bf16", "--limit", "4",
           "--max-length", "256", "--out", str(tmp_path / "r")]
    parent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
                              env=dict(os.environ))
    try:
        wait_for(lambda: any("evalparity.cells" in cmdline(p) for p in descendants(parent.pid)),
                 timeout=300, what="a cell process")
        everyone = [p.pid for p in descendants(parent.pid)]
        parent.kill()
        parent.wait(timeout=20)
        assert running(everyone) == [], [cmdline(psutil.Process(p)) for p in running(everyone, 0)]
    finally:
        if parent.poll() is None:
            parent.kill()


# A parent with a procs child (as the run's embedded-model preparation) and a fork pool set up as
# task_index.parallel_build sets up its workers; it prints the pids, then one worker kills itself (a pool
# worker lost) while the others sleep.
POOL_PARENT = """
import os, signal, subprocess, sys, time
from concurrent.futures import ProcessPoolExecutor
import multiprocessing
from evalparity import procs
child = procs.popen(["sleep", "300"])
procs.prepare_fork()
def say(*words):  # one write per line: two workers' lines on one pipe must not interleave
    os.write(1, (" ".join(map(str, words)) + "\\n").encode())
def nap(i):
    say("worker", os.getpid())
    if i == 0 and "{lose}" == "lose":
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(300)
pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"), initializer=procs.forked_worker_setup,
                           initargs=(os.getpid(),))
say("child", child.pid)
futures = [pool.submit(nap, i) for i in range(2)]
try:
    futures[0].result()
except Exception as err:
    say("lost", type(err).__name__)
time.sleep(300)
"""


@pytest.mark.parametrize("case", ["parent SIGKILL", "a worker lost"])
def test_forked_pool_workers_die_with_the_parent_and_spare_its_children(case):
    """``procs.forked_worker_setup`` (the task index's parallel build): a SIGKILLed parent leaves no pool worker
    behind, and a pool that loses a worker (the executor then stops the others with SIGTERM) does not take the
    parent's other children with it, as the handler the workers inherited from the parent would."""
    lose = "lose" if case == "a worker lost" else "keep"
    proc = subprocess.Popen([sys.executable, "-c", POOL_PARENT.replace("{lose}", lose)], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    try:
        child = workers = None
        seen: list[int] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline().split()
            if line[:1] == ["child"]:
                child = int(line[1])
            elif line[:1] == ["worker"]:
                seen.append(int(line[1]))
            elif line[:1] == ["lost"]:
                break
            if lose == "keep" and child and len(seen) == 2:
                break
        assert child and seen, "the parent did not start its child and workers"
        if lose == "keep":
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            workers = seen
        else:
            time.sleep(2)  # the executor has stopped the other worker
            assert psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE, \
                "the parent's child was killed with the pool"
            workers = seen
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        end = time.monotonic() + 10
        while time.monotonic() < end and any(psutil.pid_exists(w) and psutil.Process(w).status() != psutil.STATUS_ZOMBIE
                                             for w in workers):
            time.sleep(0.1)
        assert not [w for w in workers if psutil.pid_exists(w) and psutil.Process(w).status() != psutil.STATUS_ZOMBIE]
    finally:
        if proc.poll() is None:
            proc.kill()


WAITING = """
import os, signal, sys, threading, time
sys.path.insert(0, {root!r})
from evalparity import procs
child = procs.popen(["sleep", "100"])
def later():
    time.sleep(0.5)
    print(time.time(), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=later, daemon=True).start()
child.wait()  # as the run waits for the embedded model's preparation
"""


def test_sigterm_while_the_main_thread_waits_for_a_child_does_not_sit_out_a_timeout():
    """SIGTERM during ``Popen.wait()`` in the main thread: the handler's reaping could not take the lock that
    wait holds and sat out its 5 s timeout (of a CI job's grace period before SIGKILL); the child is gone
    and the process ends by SIGTERM soon after."""
    parent = subprocess.Popen([sys.executable, "-c", WAITING.format(root=str(ROOT))], stdout=subprocess.PIPE,
                              text=True, cwd=ROOT)
    try:
        sent = float(parent.stdout.readline())
        code = parent.wait(timeout=30)
        assert code == -signal.SIGTERM
        assert time.time() - sent < 3, "the handler waited out its timeout"
    finally:
        parent.kill()


RETURNING = """
import os, signal, sys, threading
sys.path.insert(0, {root!r})
from evalparity import procs
signal.signal(signal.SIGTERM, lambda signum, frame: None)  # returns, as the command's does after its sign-off
child = procs.popen(["sleep", "100"])
threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
print(child.wait(), flush=True)
"""


def test_a_child_killed_by_the_handler_reports_its_kill_to_an_interrupted_wait():
    """The handler's reaping must leave the ended child to its Popen: reaped there, the main thread's
    interrupted ``wait()`` resumed, found no child, and reported 0 for a child killed by SIGKILL."""
    out = subprocess.run([sys.executable, "-c", RETURNING.format(root=str(ROOT))], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.stdout.strip() == str(-signal.SIGKILL), (out.stdout, out.stderr)


# A child that leaves files in its temporary folder, as vLLM's engine does (a rendezvous file, a ZMQ socket).
LITTER = """
import socket, subprocess, sys, tempfile, time
from evalparity import procs
child = procs.popen([sys.executable, "-c",
                     "import os, socket, sys, tempfile, time; d = tempfile.gettempdir(); "
                     "open(os.path.join(d, 'vllm_dist_0'), 'w').close(); "
                     "socket.socket(socket.AF_UNIX).bind(os.path.join(d, 'ipc-0')); "
                     "print(d, os.environ['TORCHINDUCTOR_CACHE_DIR'], flush=True); time.sleep(300)"],
                    stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
{end}
"""


@pytest.mark.parametrize("end", [ENDED.replace("child.wait()", "child.kill(); child.wait()"), "raise SystemExit(7)",
                                 "raise KeyboardInterrupt", "time.sleep(300)", "time.sleep(301)"],
                         ids=["ended", "exit", "ctrl-c", "term", "parent-sigkill"])
def test_a_childs_temporary_files_go_with_it(tmp_path_factory, end):
    """Every child gets a temporary folder of its own (``procs.private_tmp_env``), removed with it however it
    ends: what the engines leave in /tmp (a file and a socket per vLLM engine) is not left outside the
    output folder; with the parent killed by SIGKILL, its guard removes it. Torch's compile cache stays where
    its default is, shared between cells."""
    tmp_path = tmp_path_factory.mktemp("t")  # short: a socket's path in a child's folder in it must fit 107 bytes
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"} | {"TMPDIR": str(tmp_path)}
    parent = subprocess.Popen([sys.executable, "-c", LITTER.format(end=end)], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env=env)
    try:
        theirs, compile_cache = parent.stdout.readline().split()
        assert Path(theirs).parent == tmp_path and sorted(os.listdir(theirs)) == ["ipc-0", "vllm_dist_0"]
        assert Path(compile_cache).parent == tmp_path and Path(compile_cache).name.startswith("torchinductor_")
        if end == "time.sleep(300)":
            parent.terminate()
        if end == "time.sleep(301)":
            parent.kill()
        if end.startswith("child.kill"):
            assert parent.stdout.readline().strip() == "ended"
        else:
            parent.wait(timeout=30)
        wait_for(lambda: not Path(theirs).exists(), timeout=10, what=f"{theirs} removed")
        assert os.listdir(tmp_path) == []
    finally:
        parent.kill()


def test_a_childs_temporary_folder_is_made_where_its_own_would_be_and_never_nests(tmp_path_factory):
    """In the child's own ``TMPDIR`` (a cell's ``env.TMPDIR=`` is what it gets), and for a child of a child (a
    cell's served model) beside its parent's, not inside it: a Unix socket's path is at most 107 bytes, and
    vLLM's ZMQ socket under /tmp is 89 already (session 33's review: nested, a base of 23 characters broke it)."""
    from evalparity import procs

    tmp_path = tmp_path_factory.mktemp("t")  # short, as above
    user = tmp_path / "scratch"
    user.mkdir()
    env, mine = procs.private_tmp_env({"TMPDIR": str(user)})
    assert Path(mine).parent == user and env["TMPDIR"] == mine
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(user / f"torchinductor_{procs._user()}")  # torch's default there
    env2, theirs = procs.private_tmp_env(env)  # what the cell passes on to its server
    assert Path(theirs).parent == user and theirs != mine
    assert env2["TORCHINDUCTOR_CACHE_DIR"] == env["TORCHINDUCTOR_CACHE_DIR"]
    assert procs.private_tmp_env({"TMPDIR": str(tmp_path / "missing")}) == ({"TMPDIR": str(tmp_path / "missing")},
                                                                            None)  # left as it would have been
    deep = tmp_path / ("d" * max(1, 48 - len(str(tmp_path))))  # 48 bytes: a socket in a folder in it would not fit
    deep.mkdir()
    assert len(str(deep)) >= 47 and procs.private_tmp_env({"TMPDIR": str(deep)}) == ({"TMPDIR": str(deep)}, None)
    assert not any(deep.iterdir())
