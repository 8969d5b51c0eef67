"""The run's own MPS server (``evalparity.mps``): when it is started, that the cells get it, that it is stopped
and leaves nothing behind, and that a server no client can use is refused or done without. No GPU here: a fake
``nvidia-cuda-mps-control`` stands in for the daemon (what it was given, in its log) and the client's probe is
replaced by one that checks the environment a cell would get."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from evalparity import cells, matrix, mps
from evalparity.errors import EvalParityError
from evalparity.spec import RunSpec, build_cells

# In the foreground (-f): log its arguments and environment, open the pipe, wait for "quit". Otherwise, as a
# control client: read a command and pass "quit" on.
FAKE = """#!/bin/bash
if [ "$1" = "-f" ]; then
  echo "daemon $* pipe=$CUDA_MPS_PIPE_DIRECTORY visible=${CUDA_VISIBLE_DEVICES-unset}"
  touch "$CUDA_MPS_PIPE_DIRECTORY/control"
  while [ ! -f "$CUDA_MPS_PIPE_DIRECTORY/quit" ]; do sleep 0.05; done
  echo "quit"
  exit 0
fi
read cmd
[ "$cmd" = quit ] && touch "$CUDA_MPS_PIPE_DIRECTORY/quit"
"""
# A client's check, as a cell would be one: the pipe the environment names is the daemon's.
PROBE_OK = "import os, sys; sys.exit(0 if os.path.exists(os.environ['CUDA_MPS_PIPE_DIRECTORY'] + '/control') else 3)"
PROBE_REFUSED = "print('cuDevicePrimaryCtxRetain returned CUDA error 805'); raise SystemExit(1)"


@pytest.fixture
def fake_control(tmp_path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / mps.CONTROL
    control.write_text(FAKE)
    control.chmod(control.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(mps.PIPE_ENV, raising=False)
    return control


def test_a_server_serves_the_cells_and_is_gone_after(fake_control, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the user's: not the daemon's (it would renumber the GPUs)
    server = mps.start(probe=PROBE_OK)
    env = server.env()
    root = server.root
    assert Path(env[mps.PIPE_ENV]).parent == root and (root / "pipe" / "control").exists()
    assert len(str(root / "pipe" / "control")) < 108  # a socket path
    assert server.proc.poll() is None
    server.close(log_to=tmp_path / "mps.log")
    assert server.proc.poll() == 0  # it quit when told (not killed)
    assert not root.exists()
    log = (tmp_path / "mps.log").read_text()
    assert f"daemon -f pipe={root / 'pipe'} visible=unset" in log and "quit" in log  # its output, kept
    server.close()  # twice is harmless


@pytest.mark.parametrize("probe,control_text,needle", [
    (PROBE_REFUSED, FAKE, "a client could not connect (cuDevicePrimaryCtxRetain returned CUDA error 805)"),
    (PROBE_OK, "#!/bin/bash\nexit 7\n", "exited with status 7 at its start"),
])
def test_a_server_no_client_can_use_is_stopped_and_removed(fake_control, tmp_path, probe, control_text, needle):
    fake_control.write_text(control_text)
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("evalparity-mps-*"))
    with pytest.raises(mps.Unavailable) as err:
        mps.start(probe=probe)
    assert needle in str(err.value)
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("evalparity-mps-*")) == before


def test_when_a_server_is_wanted(fake_control, monkeypatch, tmp_path):
    assert mps.decide("auto", "cuda", True, False) == (True, "on: cells share a GPU")
    assert mps.decide("off", "cuda", True, False) == (False, "off (--mps off)")
    cases = {  # (device, shared, remote Ray) -> why not
        ("cpu", True, False): "the cells run on the CPU",
        ("cuda", False, False): "no two cells share a GPU",
        ("cuda", True, True): "the cells run on a Ray cluster's hosts",
    }
    for (device, shared, remote), why in cases.items():
        wanted, said = mps.decide("auto", device, shared, remote)
        assert not wanted and why in said
        with pytest.raises(EvalParityError, match=f"--mps on: {why}"):
            mps.decide("on", device, shared, remote)
    monkeypatch.setenv(mps.PIPE_ENV, str(tmp_path))  # the user's own server: the cells use that one
    assert mps.decide("auto", "cuda", True, False) == (False, f"off: {mps.PIPE_ENV} names an MPS server already, "
                                                              "which the cells use")
    monkeypatch.delenv(mps.PIPE_ENV)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "is not on PATH" in mps.decide("auto", "cuda", True, False)[1]
    with pytest.raises(EvalParityError, match="--mps on: nvidia-cuda-mps-control is not on PATH"):
        mps.decide("on", "cuda", True, False)


def test_every_job_gets_the_servers_environment_and_records_it(tmp_path, monkeypatch):
    tiny_spec = RunSpec(model="m", tasks=("t",), cells=build_cells(["hf", "vllm"], ["fp32", "bf16"], 8, []),
                        device="cuda", leaf_docs=(("t", 9),))
    extra = {mps.PIPE_ENV: "/tmp/evalparity-mps-x/pipe", mps.LOG_ENV: "/tmp/evalparity-mps-x/log"}
    _, jobs, _ = matrix.plan_jobs(tiny_spec, tmp_path, False, 2, False, extra)
    assert jobs and all(j.env[k] == v for j in jobs for k, v in extra.items())
    _, plain, _ = matrix.plan_jobs(tiny_spec, tmp_path, False, 2, False)
    assert all(mps.PIPE_ENV not in j.env for j in plain)
    monkeypatch.setenv(mps.PIPE_ENV, extra[mps.PIPE_ENV])
    assert cells.placement_meta(tiny_spec, tiny_spec.cells[0])["mps"] is True
    monkeypatch.delenv(mps.PIPE_ENV)
    assert cells.placement_meta(tiny_spec, tiny_spec.cells[0])["mps"] is False


def test_drift_probes_cells_together_through_a_server_and_alone_without(fake_control, tmp_path, monkeypatch):
    """``evalparity drift`` (and ``run --drift``): cells probed together (the run packed them) get the
    server's environment, which is stopped after; cells probed one after another get none, and ``--mps on``
    for them is refused in one line. drift.json says which (``mps``)."""
    import json

    from evalparity import drift
    from evalparity.rundir import layout

    seen: dict = {}

    def fake_probe_all(launch, prompts, out, reference, todo, dump, console, shown, shared_env, *, together,
                       reference_too):
        seen["env"] = dict(shared_env)
        return {}

    monkeypatch.setattr(drift, "_probe_all", fake_probe_all)
    real_start = mps.start
    started: list = []
    monkeypatch.setattr(mps, "start", lambda: started.append(real_start(probe=PROBE_OK)) or started[-1])
    launch = {n: {"env": {}} for n in ("hf-fp32", "vllm-bf16", "hf-bf16")}
    drift.run_drift(launch, ["p"], tmp_path / "a", together=True)
    assert set(seen["env"]) == {mps.PIPE_ENV, mps.LOG_ENV} and not started[0].root.exists()
    assert started[0].proc.poll() == 0 and (tmp_path / "a" / "mps.log").exists()
    assert json.loads(layout.drift_spec(tmp_path / "a").read_text())["mps"] == "on: cells share a GPU"
    drift.run_drift(launch, ["p"], tmp_path / "b", together=False)
    assert seen["env"] == {} and len(started) == 1
    assert json.loads(layout.drift_spec(tmp_path / "b").read_text())["mps"] == "off: no two cells probed together"
    with pytest.raises(EvalParityError, match="--mps on: no two cells are probed together here"):
        drift.run_drift(launch, ["p"], tmp_path / "c", together=False, mps_choice="on")
    drift.run_drift(launch, ["p"], tmp_path / "d", together=True, mps_choice="off")
    assert seen["env"] == {} and len(started) == 1


def test_a_server_only_where_jobs_hold_a_gpu_at_once(monkeypatch):
    """``matrix.shares_gpus``: packed, more than one job, side by side on this host's own Ray; not on CPU, not
    one at a time (one job, one per GPU, Ray absent), not on a cluster's hosts."""
    from evalparity import placement as pl

    spec = RunSpec(model="m", tasks=("t",), cells=build_cells(["hf", "vllm"], ["fp32", "bf16"], 8, []),
                   device="cuda", leaf_docs=(("t", 9),))
    monkeypatch.setattr(pl, "gpu_count", lambda: 1)
    packed = matrix.Placement(cells_per_gpu=4)
    assert matrix.shares_gpus(spec, packed, 4)
    assert matrix.shares_gpus(spec, matrix.Placement(ray="local", cells_per_gpu=4), 4)
    assert not matrix.shares_gpus(spec, packed, 1)  # one job left (a resume)
    assert not matrix.shares_gpus(spec, matrix.Placement(cells_per_gpu=1), 4)  # one cell per GPU
    assert not matrix.shares_gpus(spec, matrix.Placement(ray="10.0.0.1:6379", cells_per_gpu=4), 4)
    assert not matrix.shares_gpus(RunSpec(model="m", tasks=("t",), cells=spec.cells, device="cpu",
                                          leaf_docs=(("t", 9),)), packed, 4)
    real = matrix.importlib.util.find_spec
    monkeypatch.setattr(matrix.importlib.util, "find_spec", lambda n, *a: None if n == "ray" else real(n, *a))
    assert not matrix.shares_gpus(spec, packed, 4)  # without Ray the cells run one at a time


def test_a_staged_runs_jobs_get_the_servers_environment(monkeypatch, tmp_path):
    """The default (staged) path builds its jobs apart from ``plan_jobs``: they get ``Placement.cell_env``
    too (the path the H200 measurement ran)."""
    from evalparity import stager

    spec = RunSpec(model="m", tasks=("t",), cells=build_cells(["hf", "vllm"], ["fp32", "bf16"], 8, []),
                   device="cpu", leaf_docs=(("t", 9),))
    made = {}

    def fake_run(spec_, run_dir, opts, executor, make_job, *rest):
        for c in spec_.cells:
            made[c.name] = make_job(c.name, "resident")
        return {c.name: {"status": "ok", "wall_s": 0.0, "meta": {}} for c in spec_.cells}

    monkeypatch.setattr(stager, "run", fake_run)
    env = {mps.PIPE_ENV: "/tmp/evalparity-mps-x/pipe"}
    matrix._run_staged(spec, tmp_path, "m", False, matrix.Console(file=open(os.devnull, "w")),
                       matrix.Placement(cell_env=tuple(env.items())), matrix.RunLog(), None, None)
    assert made and all(j.env[mps.PIPE_ENV] == env[mps.PIPE_ENV] for j in made.values())
