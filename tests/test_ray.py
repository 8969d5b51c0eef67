"""Cells as Ray tasks on a local Ray cluster (CPU only, as in CI), and sharded cells.

- The same matrix run without Ray and through Ray gives equal per-sample tables, sharded cells included.
- A sharded cell's merged table has exactly the shape, order and alignment of the unsharded one.
- Killing the Ray worker that runs a cell loses that cell only; rerunning the command completes the matrix (the
  run through Ray above: its hf-fp32's worker is killed, and its rerun is what the tables are compared from).
- ``--ray local`` starts an instance of the run's own beside the setup, and stops it when the cells are done.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from conftest import cli, evalparity, tiny_run_args

from evalparity.samples import HASHES, KEY, read_table

PORT = 6391
ADDRESS = f"127.0.0.1:{PORT}"
CELLS = ["hf-fp32", "vllm-fp32", "hf-fp32-dp2"]  # the shared tiny run's fp32 cells, rerun through Ray


def _ray(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    ray_bin = Path(sys.executable).with_name("ray")
    return subprocess.run([str(ray_bin), *args], capture_output=True, text=True, timeout=180,
                          env=dict(os.environ) | (env or {}))


@pytest.fixture(scope="module")
def token_env(tmp_path_factory) -> dict:
    """A Ray auth token of the test's own. `ray start` turns token authentication on when it finds a token
    (as on any machine where a local `ray.init()` once wrote ~/.ray/auth_token), and the CLI must then
    send it: the case that failed with InvalidAuthToken."""
    path = tmp_path_factory.mktemp("raytoken") / "auth_token"
    path.write_text(secrets.token_hex(32))
    return {"RAY_AUTH_TOKEN_PATH": str(path)}


@pytest.fixture(scope="module")
def cluster(token_env):
    """A one-node Ray cluster with 2 CPUs and token authentication, started as a user would."""
    _ray("stop", "--force")
    started = _ray("start", "--head", "--num-cpus", "2", "--port", str(PORT), "--disable-usage-stats",
                   "--include-dashboard=false", env=token_env)
    assert started.returncode == 0, started.stderr[-2000:]
    yield ADDRESS
    _ray("stop", "--force")


@dataclass(frozen=True)
class Runs:
    """The shared tiny run (``plain``) and its fp32 cells through the cluster (``viaray``): the first command
    (``killed``, its stderr) whose hf-fp32 lost its Ray worker, each cell's record as that command left it
    (``left``), and the same command again (``again``), which completed the matrix."""

    plain: Path
    viaray: Path
    killed: int
    killed_stderr: str
    left: dict[str, dict]
    again: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def runs(tiny_run, tiny_model, tiny_tasks, cluster, token_env, tmp_path_factory) -> Runs:
    """The shared tiny run (no Ray) against its fp32 cells run again through the cluster: the Ray worker
    that runs hf-fp32 is SIGKILLed as the cell starts, and the command is run again (one run through Ray for
    both what a killed worker loses and what Ray scores; the tables compared are the rerun's)."""
    plain, _ = tiny_run
    viaray = tmp_path_factory.mktemp("ray") / "ray"
    args = tiny_run_args(tiny_model, tiny_tasks, viaray)
    args[args.index("fp32,bf16")] = "fp32"
    args += ["--ray", cluster]
    proc = subprocess.Popen(cli(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ) | token_env)
    try:
        running = _wait_for_progress(viaray, "hf-fp32")
        os.kill(_parent(running["pid"]), signal.SIGKILL)  # the Ray worker that runs the cell's process
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = {c: json.loads((viaray / "cells" / c / "cell.json").read_text()) for c in CELLS}
    again = evalparity(*args, env=token_env)
    return Runs(plain, viaray, proc.returncode, err, left, again)


def test_ray_tables_equal_plain_tables(runs):
    plain, viaray = runs.plain, runs.viaray
    assert runs.again.returncode in (0, 3, 4), runs.again.stderr[-3000:]
    for name in CELLS:
        pd.testing.assert_frame_equal(read_table(plain / "cells" / name / "samples.parquet"),
                                      read_table(viaray / "cells" / name / "samples.parquet"))


def test_placement_is_recorded(runs):
    plain, viaray = runs.plain, runs.viaray
    meta = json.loads((viaray / "cells" / "vllm-fp32" / "cell.json").read_text())
    p = meta["placement"]
    assert p["executor"] == "ray" and p["host"] and p["node_id"] and p["tensor_parallel"] == 1
    # Ray caps a one-CPU task at one thread unless the driver set OMP_NUM_THREADS itself
    assert p["omp_num_threads"] == os.environ.get("OMP_NUM_THREADS", "1") and p["cpus_visible"] >= 1
    assert json.loads((plain / "cells" / "vllm-fp32" / "cell.json").read_text())["placement"]["executor"] == "local"
    sharded = json.loads((viaray / "cells" / "hf-fp32-dp2" / "cell.json").read_text())
    assert [s["placement"]["shard"] for s in sharded["shards"]] == [0, 1]
    assert all(s["placement"]["shards"] == 2 for s in sharded["shards"])
    assert "Ray: 0 GPU(s), 2 CPU(s)" in runs.again.stderr


def test_sharded_cell_matches_unsharded_in_shape_and_alignment(runs):
    plain = runs.plain
    whole = read_table(plain / "cells" / "hf-fp32" / "samples.parquet")
    merged = read_table(plain / "cells" / "hf-fp32-dp2" / "samples.parquet")
    assert merged.shape == whole.shape and list(merged.columns) == list(whole.columns)
    pd.testing.assert_frame_equal(merged[KEY + HASHES], whole[KEY + HASHES])
    # each shard holds every other document of each task, and together they hold them all once
    shard_ids = [set(read_table(plain / "shards" / f"hf-fp32-dp2.{k}of2" / "samples.parquet")["doc_id"])
                 for k in range(2)]
    assert not shard_ids[0] & shard_ids[1] and shard_ids[0] | shard_ids[1] == set(whole["doc_id"])
    assert 0 in shard_ids[0] and 1 in shard_ids[1]


def test_sharding_is_a_noise_floor_row(runs):
    plain = runs.plain
    verdicts = json.loads((plain / "stats" / "verdicts.json").read_text())
    rows = [c for c in verdicts["comparisons"] if c["cell"] == "hf-fp32-dp2"]
    assert rows and all(r["kind"] == "noise_floor" and r["reference"] == "hf-fp32" for r in rows)


def _wait_for_progress(out: Path, cell: str, timeout: float = 300) -> dict:
    """The progress record of ``cell``'s process, as soon as it has written one."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            return json.loads((out / "cells" / f".tmp-{cell}" / "progress.json").read_text())
        except (OSError, json.JSONDecodeError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{cell} did not start within the timeout")


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[1])


def test_killed_worker_loses_one_cell_and_rerun_completes(runs):
    assert runs.killed == 5, runs.killed_stderr[-3000:]  # a cell failed; the others were kept
    assert runs.left["hf-fp32"]["status"] == "failed" and runs.left["hf-fp32"]["error"], runs.left["hf-fp32"]
    assert all(runs.left[c]["status"] == "ok" for c in CELLS if c != "hf-fp32"), runs.left
    assert runs.again.returncode in (0, 3, 4), runs.again.stderr[-3000:]
    assert f"{len(CELLS) - 1} cell(s) already done" in runs.again.stderr
    for name in CELLS:
        assert json.loads((runs.viaray / "cells" / name / "cell.json").read_text())["status"] == "ok"
    failed = json.loads((runs.viaray / "attempts" / "cells" / "hf-fp32" / "attempt-1.json").read_text())
    assert failed["error"] == runs.left["hf-fp32"]["error"]


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace"):
                found.append(cmdline.parent.name)
        except OSError:
            pass
    return found


def test_ray_local_starts_its_own_instance_beside_the_setup_and_stops_it(tiny_run, tiny_model, tiny_tasks,
                                                                         token_env, tmp_path):
    plain, _ = tiny_run
    out = tmp_path / "local"
    args = tiny_run_args(tiny_model, tiny_tasks, out)
    del args[args.index("--repeat"):args.index("--repeat") + 2]
    proc = evalparity(*args, "--backends", "hf", "--ray", "local", env=token_env)
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]
    for name in ("hf-fp32", "hf-bf16"):
        pd.testing.assert_frame_equal(read_table(plain / "cells" / name / "samples.parquet"),
                                      read_table(out / "cells" / name / "samples.parquet"))
        assert json.loads((out / "cells" / name / "cell.json").read_text())["placement"]["executor"] == "ray"
    run = json.loads((out / "run.json").read_text())
    assert run["executor"] == "ray" and run["ray_head_ready_s"] > 0 and run["ray_head_waited_s"] >= 0
    assert "ray_head_stop" in run["stages_s"]  # the head's stop, begun before the statistics, is timed too
    log = (out / "ray-head.log").read_text()
    assert "Ray runtime started" in log
    temp_dir = log.split("Process exit logs will be saved to: ")[1].split("/session_")[0]
    assert "evalparity-ray-" in temp_dir and not Path(temp_dir).exists()  # its own, and removed
    assert not _processes_mentioning(temp_dir)  # no daemon of it is left
