"""Placement without a cluster: which executor a run gets, the jobs a matrix becomes, and the merge of shards."""

from __future__ import annotations

import os
import shutil

import pandas as pd
import pytest

from evalparity import matrix, placement, shards
from evalparity.config import PORT_BASE_ENV, PORT_END, PORTS_PER_JOB, job_port_base
from evalparity.samples import KEY
from evalparity.spec import RunSpec, build_cells


def _spec(device: str = "cuda", tp: int = 1, shard_count: int = 1) -> RunSpec:
    cells = build_cells(["hf", "vllm"], ["fp32", "bf16"], 8, [], shards=shard_count)
    return RunSpec(model="m", tasks=("t",), cells=cells, device=device, tensor_parallel=tp, leaf_docs=(("t", 9),))


@pytest.mark.parametrize("device,gpus,tp,expected", [
    ("cpu", 0, 1, "local"),    # CPU: one cell at a time unless --ray
    ("cuda", 1, 1, "local"),   # one GPU: nothing to spread
    ("cuda", 2, 2, "local"),   # two GPUs, but each cell needs both
    ("cuda", 2, 1, "ray"),     # two GPUs, one per cell: Ray on this host
])
def test_executor_choice(monkeypatch, tmp_path, device, gpus, tp, expected):
    monkeypatch.setattr(placement, "gpu_count", lambda cheap=False: gpus)
    fake_ray = type("FakeRayExecutor", (), {"name": "ray"})  # no Ray instance is started here
    monkeypatch.setattr(placement, "RayExecutor", lambda *a, **k: fake_ray())
    ex = matrix.choose_executor(_spec(device, tp), matrix.Placement(), 4, tmp_path, "m")
    assert ex.name == expected


@pytest.mark.parametrize("gpus,per_gpu,says", [
    (1, 6, "1 GPU visible, 6 cells to a GPU by the memory plan had room for more"),
    (2, 1, "2 GPUs visible had room for more"),
])
def test_a_run_that_wants_ray_without_it_says_so_and_goes_one_cell_at_a_time(monkeypatch, tmp_path, caplog, gpus,
                                                                            per_gpu, says):
    """Where the memory plan packed cells on one GPU, or several GPUs are visible, and Ray is not installed,
    the run goes one cell at a time and its log says why and what to install (a packed run on one GPU
    without Ray did not finish in 150 s where packed runs took 61-87 s: results/drift-h200, session 29)."""
    import logging

    monkeypatch.setattr(placement, "gpu_count", lambda cheap=False: gpus)
    monkeypatch.setattr(matrix.importlib.util, "find_spec", lambda name: None)
    with caplog.at_level(logging.WARNING):
        ex = matrix.choose_executor(_spec("cuda"), matrix.Placement(cells_per_gpu=per_gpu), 4, tmp_path, "m")
    assert ex.name == "local"
    assert f"Ray is not installed: running one cell at a time, where {says} (pip install 'ray>=2.40', the [ray] " \
           "extra, to run them side by side)" in caplog.text


@pytest.mark.parametrize("device,ray,gpus,tp,per_gpu,jobs,expected", [
    ("cpu", None, 0, 1, 1, 4, False),
    ("cpu", "local", 0, 1, 1, 4, True),              # --ray local: always an instance of the run's own
    ("auto", "10.0.0.1:6379", 8, 1, 1, 4, False),    # a cluster's address: none of its own
    ("cuda", None, 2, 1, 1, 4, True),
    ("auto", None, 2, 1, 1, 1, False),               # one job: nothing to spread
    ("cuda", None, 2, 2, 1, 4, False),               # every job needs both GPUs
    ("cuda", None, 1, 1, 2, 4, True),                # two cells share the one GPU
])
def test_when_a_run_starts_a_ray_instance_of_its_own(device, ray, gpus, tp, per_gpu, jobs, expected):
    wanted = placement.local_ray_wanted(device, tp, placement.Placement(ray=ray, cells_per_gpu=per_gpu), jobs, gpus)
    assert wanted is expected


def test_the_early_gpu_count_needs_no_torch(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert placement.gpu_count(cheap=True) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert placement.gpu_count(cheap=True) == 0
    assert placement.early_ray_head("cuda", 1, placement.Placement(), 4) is None  # no GPU listed: no instance


def test_a_ray_instance_that_cannot_start_is_one_line_with_its_log(monkeypatch):
    """Ray refuses to start on a port already taken: the run says so in one line, naming the cause and the
    log, and keeps that log."""
    import socket

    from evalparity.errors import EvalParityError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(placement, "_free_port", lambda: taken.getsockname()[1])
        head = placement.LocalRayHead()
        with pytest.raises(EvalParityError, match=r"did not start \(exit 1: \w+Error: .*port.*; log ") as err:
            head.wait(timeout=120)
    head.close()
    assert "\n" not in str(err.value) and os.path.exists(head.log_path)
    os.remove(head.log_path)
    shutil.rmtree(head.temp_dir, ignore_errors=True)  # kept, with Ray's own logs, for a user to read


def test_jobs_ask_for_their_gpus_and_shards(tmp_path):
    done, jobs, merge_only = matrix.plan_jobs(_spec("cuda", tp=2, shard_count=2), tmp_path, force=False)
    assert not done and not merge_only
    assert len(jobs) == 8 and {j.gpus for j in jobs} == {2.0}
    assert {j.unit for j in jobs if j.cell == "hf-fp32"} == {"hf-fp32.0of2", "hf-fp32.1of2"}
    assert jobs[0].argv("R", "M", "py")[-2:] == ["--shard", "0/2"]
    _, cpu_jobs, _ = matrix.plan_jobs(_spec("cpu"), tmp_path, force=False, cells_per_gpu=2)
    assert {j.gpus for j in cpu_jobs} == {0.0} and cpu_jobs[0].argv("R", "M", "py")[-1] == "M"
    _, shared, _ = matrix.plan_jobs(_spec("cuda"), tmp_path, force=False, cells_per_gpu=2)
    assert {j.gpus for j in shared} == {0.5}
    # every job (shards too) its own port range, below the ephemeral ports, none overlapping another's
    bases = sorted(int(j.env[PORT_BASE_ENV]) for j in jobs)
    assert len(set(bases)) == len(jobs) and bases[0] >= 1024 and bases[-1] + PORTS_PER_JOB <= PORT_END
    assert all(b - a >= PORTS_PER_JOB for a, b in zip(bases, bases[1:]))
    # another run directory starts elsewhere; any ordinal stays in the range
    other = sorted(int(j.env[PORT_BASE_ENV]) for j in matrix.plan_jobs(
        _spec("cuda", tp=2, shard_count=2), tmp_path / "other", force=False)[1])
    assert other != bases
    assert all(1024 <= job_port_base("r", k) <= PORT_END - PORTS_PER_JOB for k in range(0, 5000, 7))


def test_a_vllm_job_probes_its_own_ports(monkeypatch):
    """backends/vllm.use_job_ports: the job's range becomes VLLM_PORT, unless the user chose VLLM_PORT."""
    from evalparity.backends import vllm as backend

    monkeypatch.delenv("VLLM_PORT", raising=False)
    monkeypatch.delenv(PORT_BASE_ENV, raising=False)
    assert backend.use_job_ports() is None  # not started by a run: vLLM's own choice
    monkeypatch.setenv(PORT_BASE_ENV, "20032")
    assert backend.use_job_ports() == "20032" and os.environ["VLLM_PORT"] == "20032"
    monkeypatch.setenv("VLLM_PORT", "41000")
    assert backend.use_job_ports() == "41000"
    monkeypatch.delenv("VLLM_PORT")
    assert backend.use_job_ports({"data_parallel_size": 2}) is None  # replicas would share one port


def _node(cpus: float, gpus: float = 0, alive: bool = True) -> dict:
    return {"Alive": alive, "Resources": {"CPU": cpus} | ({"GPU": gpus} if gpus else {})}


@pytest.mark.parametrize("nodes,gpus,expected", [
    ([_node(32, 2)], 1, 16),                  # one GPU of a 32-CPU, 2-GPU host: half its CPUs
    ([_node(32, 2)], 0.5, 8),                 # --cells-per-gpu 2: a quarter
    ([_node(32, 2)], 2, 32),                  # tensor-parallel 2: the whole host
    ([_node(128, 8), _node(16, 4)], 1, 4),    # the host with the fewest CPUs per GPU decides: every GPU fits a job
    ([_node(64), _node(16, 4, alive=False)], 1, 1),  # no live GPU host: the default
    ([_node(1, 4)], 1, 1),                    # fewer CPUs than GPUs: still at least one
])
def test_gpu_jobs_ask_ray_for_their_share_of_a_hosts_cpus(nodes, gpus, expected):
    assert placement.gpu_job_cpus(nodes, gpus) == expected


def test_merged_table_is_sorted_like_an_unsharded_one_and_refuses_overlap():
    whole = pd.DataFrame({"task": ["a"] * 6 + ["b"] * 2, "filter": "none", "doc_id": [0, 0, 1, 1, 2, 2, 0, 1],
                          "choice": [0, 1, 0, 1, 0, 1, 0, 0], "loglikelihood": range(8)})
    evens = whole[whole["doc_id"] % 2 == 0]
    odds = whole[whole["doc_id"] % 2 == 1]
    pd.testing.assert_frame_equal(shards.merge_tables([odds, evens]), whole.sort_values(KEY).reset_index(drop=True))
    with pytest.raises(ValueError, match="overlap"):
        shards.merge_tables([whole, odds])
    agg = shards.aggregate(whole.assign(**{"m:acc": [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]}))
    assert agg == {"a": {"acc,none": pytest.approx(2 / 3)}, "b": {"acc,none": 0.5}}


def test_unreachable_ray_address_is_refused_quickly():
    from evalparity.errors import EvalParityError

    with pytest.raises(EvalParityError, match="nothing answers at Ray address 127.0.0.1:1"):
        placement.check_reachable("127.0.0.1:1", timeout=2)
    with pytest.raises(EvalParityError, match="not HOST:PORT"):
        placement.check_reachable("nonsense")
    placement.check_reachable("auto")  # left to Ray


@pytest.mark.parametrize("address,mode,has_token,sent", [
    ("127.0.0.1:6379", None, True, True),          # this host's cluster, this host's token: sent
    ("localhost:6379", None, True, True),
    ("127.0.0.1:6379", None, False, False),        # no token at hand
    ("127.0.0.1:6379", "disabled", True, False),   # the user's RAY_AUTH_MODE wins
    ("192.0.2.77:6379", None, True, False),        # another host: its token is the user's to give
    ("192.0.2.77:6379", "token", True, True),
    ("auto", None, True, False),                   # Ray itself decides for auto and local
    ("local", None, True, False),
])
def test_ray_auth_token_is_sent_to_this_hosts_cluster(monkeypatch, tmp_path, address, mode, has_token, sent):
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    if has_token:
        (tmp_path / "token").write_text("t" * 32)
    # setenv first, so that monkeypatch restores the variable's absence after the test even when
    # use_token_auth sets it (a delenv of an absent variable records nothing, and RAY_AUTH_MODE=token then
    # leaked into every later test's `--ray local`, which has no token)
    monkeypatch.setenv("RAY_AUTH_MODE", "unset")
    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE")
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    assert placement.use_token_auth(address) is sent
    if sent:
        assert os.environ["RAY_AUTH_MODE"] == "token"


def test_summary_shows_where_cells_ran_only_when_it_says_something():
    local = matrix.CellOutcome("hf-fp32", "ok", 1.0, {"placement": {"executor": "local", "host": "h", "gpu_ids": []}})
    shard = {"executor": "ray", "host": "h2", "gpu_ids": ["1"]}
    ray = matrix.CellOutcome("vllm-fp32", "ok", 1.0, {"placement": [shard, shard | {"gpu_ids": ["0"]}]})
    assert "where" not in [c.header for c in matrix.summary_table([local]).columns]
    table = matrix.summary_table([local, ray])
    assert "where" in [c.header for c in table.columns]
    assert matrix.where(ray.meta) == "h2:gpu1\nh2:gpu0"
