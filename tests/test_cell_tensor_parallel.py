"""A cell's own tensor parallel size (``--cell vllm-tp2=vllm:bf16:tensor_parallel_size=2``, issue 29), on fake
GPUs: ``spec.cell_gpus`` is the one answer to how many GPUs a cell's engine needs, and each place that gives a
cell GPUs asks it: the memory plan (sized per GPU, never packed), the jobs (Ray's ``num_gpus`` whole, the local
executor's ``CUDA_VISIBLE_DEVICES``), the staged run's resident check, the executor choice and the engine's
arguments. The refusals are one line each, before any cell starts; the size is part of the cell's variant."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from types import SimpleNamespace

import pytest
from synthetic import make_run, reseal
from test_memplan import H200, L40S, LLAMA14, SMOL  # the shapes and GPUs the memory plan is tested on

from evalparity import backends, matrix, memplan, placement, stager, variants
from evalparity.backends import server
from evalparity.errors import EvalParityError
from evalparity.memplan import plan
from evalparity.placement import Job
from evalparity.rundir import records, reuse
from evalparity.shapes import GiB
from evalparity.spec import CellSpec, RunSpec, cell_gpus

TP2 = "vllm-tp2=vllm:bf16:tensor_parallel_size=2"  # the README's example


def cell(text: str) -> CellSpec:
    return variants.parse_cell(text, 8, 1, {})


def spec_of(*cells: CellSpec, device: str = "cuda", tp: int = 1) -> RunSpec:
    return RunSpec(model="m", tasks=("t",), cells=cells, device=device, tensor_parallel=tp, leaf_docs=(("t", 9),))


def mixed(device: str = "cuda", tp: int = 1) -> RunSpec:
    """The reference, a plain vLLM cell and the tp2 variant."""
    return spec_of(CellSpec("hf", "float32", 8), CellSpec("vllm", "bfloat16", 8), cell(TP2), device=device, tp=tp)


# ---------------------------------------------------------------- the one answer
def test_a_cell_s_gpus_are_its_own_size_else_the_run_s():
    plain, tp2, tp1 = CellSpec("vllm", "bfloat16", 8), cell(TP2), cell("v1=vllm:bf16:tensor_parallel_size=1")
    hf = CellSpec("hf", "float32", 8)
    assert [cell_gpus(c, 1) for c in (plain, tp2, tp1, hf)] == [1, 2, 1, 1]
    assert [cell_gpus(c, 4) for c in (plain, tp2, tp1, hf)] == [4, 2, 1, 4]  # the cell's own wins, both ways
    assert cell_gpus(cell("s=server:bf16:tensor_parallel_size=3"), 1) == 3  # a server evalparity starts
    via_args = variants.run_cells((plain, hf), [], 8, 1, {"vllm": "tensor_parallel_size=2", "hf": ""})
    assert [cell_gpus(c, 1) for c in via_args] == [2, 1]  # --vllm-args gives every vllm cell its size


@pytest.mark.parametrize("typed, backend_args, says", [
    ("x=vllm:bf16:tensor_parallel_size=0", {}, "tensor_parallel_size=0 is not a whole number of GPUs"),
    ("x=vllm:bf16:pipeline_parallel_size=2", {}, "pipeline_parallel_size cannot be set per cell"),
    ("x=vllm:bf16:data_parallel_size=2", {}, "data_parallel_size cannot be set per cell"),
    (None, {"vllm": "pipeline_parallel_size=2"}, "--vllm-args: pipeline_parallel_size cannot be set per cell"),
    ("x=vllm:bf16:tensor_parallel_size=-1", {}, "is not a whole number of GPUs: give 1 or more"),
    ("x=vllm:bf16:tensor_parallel_size=1.5", {}, "is not a whole number of GPUs"),
    ("x=vllm:bf16:tensor_parallel_size=two", {}, "is not a whole number of GPUs"),
    ("x=vllm:bf16:tensor_parallel_size=", {}, "is not a whole number of GPUs"),
    ("x=hf:fp32:tensor_parallel_size=2", {}, "not an argument of the hf backend: its cells take the run's "
                                             "--tensor-parallel N"),
    (None, {"hf": "tensor_parallel_size=2"}, "--hf-args: tensor_parallel_size is not an argument of the hf backend"),
    (None, {"vllm": "tensor_parallel_size=x"}, "--vllm-args: tensor_parallel_size=x is not a whole number"),
])
def test_a_bad_size_or_a_backend_without_one_is_refused_in_one_line(typed, backend_args, says):
    with pytest.raises(EvalParityError) as err:
        variants.run_cells((CellSpec("hf", "float32", 8), CellSpec("vllm", "bfloat16", 8)),
                           [typed] if typed else [], 8, 1, backend_args)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_size_on_a_cpu_run_is_refused_before_any_cell_starts(tmp_path):
    from evalparity.cli.run import CellOptions, PlacementOptions, plan_cells

    wide = CellOptions(cell=["v=vllm:fp32:tensor_parallel_size=2"], backends="hf", dtypes="fp32")
    with pytest.raises(EvalParityError) as err:
        plan_cells(tmp_path / "run", "cpu", wide, None, PlacementOptions(), False)
    assert str(err.value) == ("cell v asks for 2 GPUs (tensor_parallel_size) but the run is on the CPU: use "
                              "--device cuda, or drop tensor_parallel_size from the cell on CPU")
    one = CellOptions(cell=["v=vllm:fp32:tensor_parallel_size=1"], backends="hf", dtypes="fp32")
    assert [c.name for c in plan_cells(tmp_path / "run", "cpu", one, None, PlacementOptions(), False)] == \
        ["hf-fp32", "v"]  # one GPU's worth is what a CPU cell is anyway
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- the memory plan
def test_the_plan_sizes_a_tp2_cell_per_gpu_and_packs_only_the_others():
    cells = [("hf-fp32", "hf", "float32", "auto"), ("vllm-bf16", "vllm", "bfloat16", "auto"),
             ("vllm-tp2", "vllm", "bfloat16", "auto")]
    p = plan(cells, SMOL, [H200, H200], cpus=32, max_length=2048, n_jobs=3, sizes={"vllm-tp2": 2})
    tp2, one = p.cells["vllm-tp2"], p.cells["vllm-bf16"]
    assert p.cells_per_gpu > 1 and (tp2.gpus, one.gpus) == (2, 1)  # the one-GPU cells still pack
    assert tp2.weights_gib == pytest.approx(one.weights_gib / 2, abs=0.01)  # half the weights on each GPU
    assert tp2.need_gib < one.need_gib
    room = memplan.usable(H200) / GiB
    assert tp2.budget_gib == pytest.approx(room, abs=0.01)  # both its GPUs whole, not a packed share
    assert one.budget_gib == pytest.approx(room / p.cells_per_gpu, abs=0.01)
    assert tp2.gpu_memory_utilization == pytest.approx(room * GiB / H200.total, abs=0.011)
    assert tp2.kv_cache_memory_bytes is None and one.kv_cache_memory_bytes  # alone on its GPUs: vLLM profiles
    assert any("vllm-tp2:" in line and "per GPU over 2 GPUs" in line for line in p.lines())
    given = plan(cells, SMOL, [H200, H200], cpus=32, max_length=2048, n_jobs=3, cells_per_gpu=4,
                 sizes={"vllm-tp2": 2})
    assert given.cells["vllm-tp2"].budget_gib == pytest.approx(room, abs=0.01)  # --cells-per-gpu packs the others
    assert given.cells["vllm-bf16"].budget_gib == pytest.approx(room / 4, abs=0.01)
    alone = plan(cells[2:], SMOL, [H200, H200], cpus=32, max_length=2048, n_jobs=1, sizes={"vllm-tp2": 2})
    assert alone.cells_per_gpu == 1 and alone.why == "tensor-parallel replicas are not packed"


def test_the_plan_refuses_more_gpus_than_there_are_and_a_cell_too_big_naming_the_cell_s_own_fix():
    cells = [("hf-fp32", "hf", "float32", "auto"), ("vllm-tp2", "vllm", "bfloat16", "auto")]
    with pytest.raises(EvalParityError) as err:
        plan(cells, SMOL, [H200], cpus=32, max_length=2048, n_jobs=2, sizes={"vllm-tp2": 2})
    assert str(err.value) == ("cell vllm-tp2 needs 2 GPUs (its tensor_parallel_size=2) but 1 is visible: run it on "
                              "a host with 2 GPUs, or lower its tensor_parallel_size to 1 or fewer")
    with pytest.raises(EvalParityError, match=r"^--tensor-parallel 2 needs 2 GPUs but 1 are visible"):
        plan(cells, SMOL, [H200], cpus=32, max_length=2048, n_jobs=2, tensor_parallel=2)  # the run's, as before
    big = [("big", "vllm", "float32", "auto")]  # 51 GiB of fp32 weights on a 44 GiB L40S
    with pytest.raises(EvalParityError) as err:
        plan(big, LLAMA14, [L40S, L40S], cpus=32, max_length=2048, n_jobs=1, sizes={"big": 1})
    assert str(err.value).endswith(": pass tensor_parallel_size=2 on the cell, or drop the cell big")
    assert plan(big, LLAMA14, [L40S, L40S], cpus=32, max_length=2048, n_jobs=1, sizes={"big": 2}).cells["big"].gpus == 2


def test_the_run_s_plan_asks_each_cell_its_size(monkeypatch):
    from evalparity.cli.run import plan_memory

    monkeypatch.setattr(memplan, "gpus_here", lambda: [H200, H200])
    monkeypatch.setattr(memplan, "host_cpus", lambda: 32)
    monkeypatch.setattr(memplan, "read_shape", lambda path: SMOL)
    p = plan_memory("cuda", None, "m", mixed().cells, 2048, 1, None)
    assert {n: c.gpus for n, c in p.cells.items()} == {"hf-fp32": 1, "vllm-bf16": 1, "vllm-tp2": 2}
    monkeypatch.setattr(memplan, "gpus_here", lambda: [H200])
    with pytest.raises(EvalParityError, match=r"^cell vllm-tp2 needs 2 GPUs"):
        plan_memory("cuda", None, "m", mixed().cells, 2048, 1, None)


# ---------------------------------------------------------------- placement: jobs, executors, staging
def test_a_tp2_job_asks_two_whole_gpus_and_the_others_still_pack(tmp_path):
    _, jobs, _ = matrix.plan_jobs(mixed(), tmp_path, force=False, cells_per_gpu=2)
    assert {j.cell: j.gpus for j in jobs} == {"hf-fp32": 0.5, "vllm-bf16": 0.5, "vllm-tp2": 2.0}
    _, jobs, _ = matrix.plan_jobs(mixed(tp=2), tmp_path, force=False, cells_per_gpu=1)
    assert {j.cell: j.gpus for j in jobs} == {"hf-fp32": 2.0, "vllm-bf16": 2.0, "vllm-tp2": 2.0}
    _, jobs, _ = matrix.plan_jobs(mixed("cpu"), tmp_path, force=False)
    assert {j.gpus for j in jobs} == {0.0}


class _FakeRay:
    """What RayExecutor asks of Ray: the nodes, and a task whose options it records instead of submitting."""

    def __init__(self, nodes: list[dict]):
        self._nodes, self.asked = nodes, {}

    def nodes(self) -> list[dict]:
        return self._nodes

    def options(self, **kw):
        self.asked[kw["name"].removeprefix("evalparity:")] = kw
        return SimpleNamespace(remote=lambda *a: object())


def _ray_executor(nodes: list[dict]) -> placement.RayExecutor:
    ex = object.__new__(placement.RayExecutor)  # no Ray instance: its attributes only
    ex.ray = ex.task = _FakeRay(nodes)
    ex.run_dir, ex.model_path, ex.refs, ex.head = "r", "m", {}, None
    return ex


def _node(cpus: float, gpus: float, alive: bool = True) -> dict:
    return {"Alive": alive, "Resources": {"CPU": cpus, "GPU": gpus}}


def test_ray_gets_whole_gpus_for_a_tp2_job_and_a_share_for_the_others(tmp_path):
    _, jobs, _ = matrix.plan_jobs(mixed(), tmp_path, force=False, cells_per_gpu=4)
    ex = _ray_executor([_node(32, 2)])
    ex.submit(jobs)
    asked = {name: (kw["num_gpus"], kw["num_cpus"]) for name, kw in ex.task.asked.items()}
    assert asked == {"hf-fp32": (0.25, 4), "vllm-bf16": (0.25, 4), "vllm-tp2": (2.0, 32)}
    # the largest live host decides what one job can have: a replica's GPUs are one host's
    assert _ray_executor([_node(16, 1), _node(64, 4), _node(64, 8, alive=False)]).most_gpus() == 4


def test_the_local_executor_names_a_tp2_job_s_gpus_in_cuda_visible_devices(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")
    started = []

    def fake_start(job, run_dir, model_path, where):
        started.append((job, where))
        return subprocess.Popen(["true"])

    monkeypatch.setattr(placement, "start_job", fake_start)
    ex = placement.LocalExecutor(str(tmp_path), "m")
    ex.submit([Job("vllm-tp2", gpus=2.0, env={"A": "1"}), Job("vllm-bf16", gpus=1.0), Job("c", gpus=0.0)])
    while ex.busy():
        ex.poll()
    (tp2, at2), (one, at1), (cpu, at0) = started
    assert tp2.env == {"A": "1", "CUDA_VISIBLE_DEVICES": "3,5"} and at2["gpu_ids"] == ["3", "5"]
    assert "CUDA_VISIBLE_DEVICES" not in one.env and at1["gpu_ids"] == ["3", "5", "7"]  # --device cuda:N kept
    assert "CUDA_VISIBLE_DEVICES" not in cpu.env and at0["gpu_ids"] == []
    assert ex.most_gpus() == 3


class _Fake:
    def __init__(self, name: str, gpus: int):
        self.name, self.gpus, self.stopped = name, gpus, False

    def most_gpus(self) -> int:
        return self.gpus

    def resources(self) -> dict:
        return {"GPU": float(self.gpus), "CPU": 32.0}

    def stop(self) -> None:
        self.stopped = True


def test_too_few_gpus_on_the_executor_is_refused_before_any_job_and_it_is_stopped():
    spec = mixed()
    ex = _Fake("ray", 1)  # a Ray cluster whose largest host has one GPU (the memory plan cannot see it)
    with pytest.raises(EvalParityError) as err:
        matrix.check_room(spec, ex, {"hf-fp32", "vllm-tp2"})
    assert str(err.value).startswith("cell vllm-tp2 needs 2 GPUs (its tensor_parallel_size=2) but 1 is visible")
    assert ex.stopped
    matrix.check_room(spec, _Fake("ray", 1), {"hf-fp32", "vllm-bf16"})  # the tp2 cell does not run (done, reused)
    matrix.check_room(spec, _Fake("ray", 2), {"hf-fp32", "vllm-tp2"})
    matrix.check_room(mixed("cpu"), _Fake("local", 0), {"vllm-tp2"})  # refused earlier, on the arguments


def test_staged_cells_stay_loaded_only_when_the_tp2_cell_s_gpus_fit_beside_the_others():
    spec = mixed()
    assert not stager.can_hold_all(_Fake("ray", 2), spec, 2, list(spec.cells))  # 2 for tp2 + 1 for the pair
    assert stager.can_hold_all(_Fake("ray", 3), spec, 2, list(spec.cells))
    assert stager.can_hold_all(_Fake("ray", 2), spec, 2, list(spec.cells[:2]))
    assert not stager.can_hold_all(_Fake("local", 8), spec, 2, list(spec.cells))  # one at a time


@pytest.mark.parametrize("tp2_first, gpus, expected", [(False, 2, "ray"), (False, 1, "local"), (True, 2, "ray")])
def test_the_executor_is_chosen_by_the_narrowest_cells(monkeypatch, tmp_path, tp2_first, gpus, expected):
    """Two GPUs: the tp1 cells can run side by side (the tp2 one waits its turn on Ray); one GPU: nothing to
    spread. A run-wide --tensor-parallel 2 with a cell of its own at 1 still has that cell to pair up."""
    monkeypatch.setattr(placement, "gpu_count", lambda cheap=False: gpus)
    monkeypatch.setattr(placement, "RayExecutor", lambda *a, **k: SimpleNamespace(name="ray"))
    spec = mixed() if not tp2_first else spec_of(CellSpec("vllm", "bfloat16", 8),
                                                 cell("v1=vllm:bf16:tensor_parallel_size=1"), tp=2)
    assert matrix.choose_executor(spec, matrix.Placement(), 3, tmp_path, "m").name == expected
    assert matrix.narrowest(spec) == 1


# ---------------------------------------------------------------- the variant: identity, difference, reuse
def test_the_size_is_part_of_the_variant_and_shown_as_its_difference():
    tp2, plain = cell(TP2), CellSpec("vllm", "bfloat16", 8)
    assert tp2.variant() == {"args": {"tensor_parallel_size": "2"}}
    assert variants.difference(variants.described(plain), variants.described(tp2)) == "tensor_parallel_size=2"
    ref = variants.described(CellSpec("hf", "float32", 8))
    assert variants.difference(ref, variants.described(tp2)) == "vllm, bf16, tensor_parallel_size=2"
    tp1 = variants.described(cell("v1=vllm:bf16:tensor_parallel_size=1"))
    assert variants.difference(tp1, variants.described(tp2)) == "tensor_parallel_size=2 (ref: 1)"


def test_a_finished_tp2_cell_resumed_at_another_size_is_refused(tmp_path):
    run = make_run(tmp_path / "run", n_tasks=1, cells=["hf-fp32", "vllm-bf16"], docs_per_task=5)
    data = json.loads((run / "spec.json").read_text())
    entry = next(c for c in data["cells"] if c["name"] == "vllm-bf16")
    entry |= {"name": "vllm-tp2", "label": "vllm-tp2", "args": [["tensor_parallel_size", "2"]]}
    (run / "spec.json").write_text(json.dumps(data))
    (run / "cells" / "vllm-bf16").rename(run / "cells" / "vllm-tp2")
    path = run / "cells" / "vllm-tp2" / "cell.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {
        "cell": "vllm-tp2", "base_cell": "vllm-tp2", "variant": {"args": {"tensor_parallel_size": "2"}}}))
    reseal(run)  # the records as a run of these cells would have written them (run_cells: vllm-tp2, not vllm-bf16)
    spec = records.read_spec(run)
    assert set(records.verify_run(run).cells) == {"hf-fp32", "vllm-tp2"}
    matrix.prepare_run_dir(run, spec)  # the same size: resumes
    four = replace(spec, cells=tuple(replace(c, args=(("tensor_parallel_size", "4"),)) if c.label else c
                                     for c in spec.cells))
    with pytest.raises(EvalParityError) as err:
        matrix.prepare_run_dir(run, four)
    assert "vllm-tp2 finished with other settings (tensor_parallel_size=2 (ref: 4)" in str(err.value)


def _source(reference: CellSpec, tp: int = 1) -> tuple[RunSpec, SimpleNamespace]:
    fp = {"source": "m", "revision": None, "files": {"model.safetensors": {"sha256": "ab" * 32}}, "digest": "x"}
    spec = replace(spec_of(reference, CellSpec("vllm", "bfloat16", 8), tp=tp), model_fingerprint=fp)
    return spec, SimpleNamespace(versions={}, extra={})


@pytest.mark.parametrize("there, there_tp, here, here_tp, differs", [
    (TP2, 1, "vllm-tp2=vllm:bf16", 1, ("2", "1")),           # a tp2 reference is not a tp1 one
    ("vllm-tp2=vllm:bf16", 2, "vllm-tp2=vllm:bf16", 1, ("2", "1")),  # nor when --tensor-parallel made it so
    (TP2, 1, "vllm-tp2=vllm:bf16", 2, None),                 # two GPUs either way, and variants that differ
    (TP2, 4, TP2, 1, None),                                  # the other cells' --tensor-parallel: not the reference's
])
def test_reference_from_compares_the_reference_s_own_size(there, there_tp, here, here_tp, differs):
    src, rec = _source(cell(there), there_tp)
    mine = _source(cell(here), here_tp)[0]
    found = reuse.differences(src, rec, src.cells[0], mine, mine.cells[0])
    if differs is None:
        assert found is None or found[0] != "the reference's tensor parallel size (GPUs per replica)"
    else:
        assert found == ("the reference's tensor parallel size (GPUs per replica)", *differs)


# ---------------------------------------------------------------- the engine's arguments
def test_the_size_reaches_vllm_s_engine_args_once():
    vllm = backends.get("vllm")
    tp2 = cell(TP2)
    args = vllm.model_args(spec_of(tp2), tp2, "/m")
    assert args["tensor_parallel_size"] == 2 and vllm.settings(spec_of(tp2), tp2, args)["tensor_parallel_size"] == 2
    own1 = cell("v1=vllm:bf16:tensor_parallel_size=1")
    assert "tensor_parallel_size" not in vllm.model_args(spec_of(own1, tp=2), own1, "/m")  # vLLM's default, 1
    plain = CellSpec("vllm", "bfloat16", 8)
    assert vllm.model_args(spec_of(plain, tp=2), plain, "/m")["tensor_parallel_size"] == 2
    served = cell("s=server:bf16:tensor_parallel_size=2")
    argv = server.serve_argv(spec_of(served), served, "/m", server.server_cell(served))
    assert [argv[i:i + 2] for i, a in enumerate(argv) if "tensor-parallel" in a] == [["--tensor-parallel-size", "2"]]
    with pytest.raises(EvalParityError, match="cannot be applied to the server at"):  # the user's: not evalparity's
        server.server_cell(cell("s=server:bf16:url=http://127.0.0.1:9/v1,tensor_parallel_size=2"))


def test_lm_eval_hands_vllm_s_llm_the_size_once(monkeypatch):
    """lm-eval's vllm model takes ``tensor_parallel_size`` as a parameter of its own and builds vLLM's ``LLM``
    arguments from it: the cell's value arrives there, as a number, once (no model loads: ``LLM`` is faked)."""
    from evalparity.backends import compat

    compat.apply()
    import lm_eval.models.vllm_causallms as lm_vllm  # heavy: lm_eval, vllm (imported, nothing loaded)

    class Stop(Exception):
        pass

    def fake_llm(**kw):
        raise Stop(kw)

    monkeypatch.setattr(lm_vllm, "LLM", fake_llm)
    tp2 = cell(TP2)
    args = backends.get("vllm").model_args(spec_of(tp2), tp2, "/m")
    with pytest.raises(Stop) as got:
        lm_vllm.VLLM(**args)
    assert got.value.args[0]["tensor_parallel_size"] == 2


# ---------------------------------------------------------------- drift
def test_drift_refuses_a_vllm_engine_over_several_gpus_and_run_drift_leaves_it_out(monkeypatch, tmp_path):
    from evalparity import drift
    from evalparity.cli import run as cli_run
    from evalparity.runlog import RunLog

    spec = mixed()
    with pytest.raises(EvalParityError) as err:
        drift.launch_plan("/m", ["vllm-tp2"], "hf-fp32", device="cuda", max_len=64, run_spec=spec)
    assert str(err.value).startswith("drift cannot probe cell vllm-tp2: its engine runs over 2 GPUs")
    assert "\n" not in str(err.value)
    with pytest.raises(EvalParityError, match="cannot probe cell vllm-bf16: its engine runs over 2 GPUs"):
        drift.launch_plan("/m", ["vllm-bf16"], "hf-fp32", device="cuda", max_len=64, run_spec=mixed(tp=2))
    assert drift.cannot_probe(mixed(tp=2), spec.cells[0]) == ""  # HF's probe runs in its own process
    assert set(drift.launch_plan("/m", ["vllm-bf16"], "hf-fp32", device="cuda", max_len=64, run_spec=spec)) == \
        {"hf-fp32", "vllm-bf16"}

    run = tmp_path / "run"
    matrix.prepare_run_dir(run, spec)
    asked = []
    monkeypatch.setattr(drift, "launch_plan", lambda path, cells, ref, **kw: asked.append(cells) or {})
    monkeypatch.setattr(drift, "prompts_from_run", lambda *a: ["x"])
    monkeypatch.setattr(drift, "run_drift", lambda *a, **k: {})
    cli_run.localise_drift(run, "/m", 1, spec.cells, SimpleNamespace(reference="hf-fp32"), "cuda", 64, RunLog())
    assert asked == [["hf-fp32", "vllm-bf16"]]


def test_a_cell_s_record_says_its_own_gpus(monkeypatch):
    """``cell.json``'s placement records the cell's own GPUs, not the run's --tensor-parallel."""
    from evalparity import cells

    monkeypatch.delenv("EVALPARITY_PLACEMENT", raising=False)
    spec = mixed()
    got = {c.name: cells.placement_meta(spec, c)["tensor_parallel"] for c in spec.cells}
    assert got == {"hf-fp32": 1, "vllm-bf16": 1, "vllm-tp2": 2}
    wide = mixed(tp=2)
    assert cells.placement_meta(wide, wide.cells[0])["tensor_parallel"] == 2


class _Cluster(_Fake):
    """A Ray cluster of several hosts: its total GPUs, and its largest host's."""

    def __init__(self, total: int, largest: int):
        super().__init__("ray", largest)
        self.total = total

    def resources(self) -> dict:
        return {"GPU": float(self.total), "CPU": 64.0}


def test_cells_stay_loaded_only_where_a_wide_replica_finds_one_host():
    """Two hosts of 2 GPUs hold hf-fp32, vllm-bf16 and vllm-tp2 by their total (4), but Ray may put the two
    one-GPU cells on different hosts, and the loaded cells would then wait for ever for a host with 2 free
    GPUs: cells stay loaded only where the largest host holds them all; one-GPU replicas count the total."""
    spec = mixed()
    assert not stager.can_hold_all(_Cluster(4, 2), spec, 1, list(spec.cells))
    assert stager.can_hold_all(_Cluster(8, 4), spec, 1, list(spec.cells))
    plain = spec_of(CellSpec("hf", "float32", 8), CellSpec("vllm", "bfloat16", 8), CellSpec("vllm", "float16", 8))
    assert stager.can_hold_all(_Cluster(4, 2), plain, 1, list(plain.cells))
