"""The vLLM warm-ups (evalparity/warmup.py, backends/vllm_warmup.py): the model-info one writes the cache entry
vLLM's own inspection reads back; the kernel warm-ups build the cells' own engine, cut to one layer of random
weights, only once told to, under the cells' environment, and stay out of the memory plan; a run's warm-up
handle cleans up."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time

import ahead
import pytest

from evalparity import memplan, warmup
from evalparity.backends import vllm as vllm_backend
from evalparity.cellenv import cell_environment
from evalparity.shapes import GiB, ModelShape
from evalparity.spec import Alignment, CellSpec, RunSpec, build_cells


def test_the_warmup_writes_the_model_info_vllm_reads_back(tmp_path):
    pytest.importorskip("vllm")
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm"), "VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"}
    argv = vllm_backend.warm_caches(["LlamaForCausalLM"], "cuda")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "warm for: LlamaForCausalLM" in proc.stdout, proc.stdout + proc.stderr
    files = list((tmp_path / "vllm" / "modelinfos").glob("*LlamaForCausalLM.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["modelinfo"]["architecture"] == "LlamaForCausalLM"
    # vLLM's own lookup (a fresh process, its subprocess forbidden) answers from that file: a hit, not a miss
    check = ("from vllm.model_executor.models import registry\n"
             "def no(fn): raise SystemExit('vLLM inspected in a subprocess: the cache missed')\n"
             "registry._run_in_subprocess = no\n"
             "print(registry.ModelRegistry._try_inspect_model_cls('LlamaForCausalLM').architecture)\n")
    hit = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300, env=env)
    assert hit.returncode == 0 and hit.stdout.strip().endswith("LlamaForCausalLM"), hit.stdout + hit.stderr


def test_an_unknown_architecture_or_a_broken_vllm_costs_nothing(tmp_path):
    from evalparity.backends import vllm_warmup

    assert vllm_warmup.main(["NoSuchArchitectureForCausalLM"]) == 0
    assert vllm_backend.warm_caches(["LlamaForCausalLM"], "cpu") is None
    assert vllm_backend.warm_caches([], "cuda") is None


def test_architectures_come_from_config_or_the_embedded_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    assert warmup.architectures(tmp_path) == ["Qwen2ForCausalLM"]
    assert warmup.architectures(tmp_path / "absent") == []
    assert warmup.architectures(None) == ["LlamaForCausalLM"]


def test_close_stops_what_still_runs_and_forgets_what_ended():
    from evalparity import procs

    quick = procs.popen([sys.executable, "-c", "pass"])
    slow = procs.popen([sys.executable, "-c", "import time; time.sleep(60)"])
    quick.wait(timeout=30)
    warm = warmup.Warmup(running=[quick, slow])
    t0 = time.monotonic()
    warm.close()
    assert slow.poll() is not None and quick.poll() == 0 and warm.running == []
    assert time.monotonic() - t0 < 10
    assert slow.pid not in procs._children and quick.pid not in procs._children


def test_start_runs_each_backends_warmup_with_its_output_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALPARITY_CACHE", str(tmp_path / "cache"))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    monkeypatch.setattr(vllm_backend, "warm_caches",
                        lambda archs, device: [sys.executable, "-c", f"print('warming', {archs!r}, {device!r})"])
    monkeypatch.setattr(vllm_backend, "kernel_warmup_argv", lambda device: None)
    cells = build_cells(["hf", "vllm"], ["fp32"], "auto", [])
    warm = warmup.start(cells, "cuda", tmp_path / "m", true_fp32=True, run_key="r")
    assert len(warm.running) == 1  # hf has no warm-up
    warm.running[0].wait(timeout=30)
    warm.close()
    assert "warming ['LlamaForCausalLM'] cuda" in (tmp_path / "cache" / "warmup.log").read_text()
    assert warmup.start(cells[1:], "cuda", tmp_path / "absent", true_fp32=True,
                        run_key="r").running == []  # no architecture: nothing


def test_the_embedded_models_architecture_is_the_one_prepared():
    """CI prepares the embedded model (README command 1) before the tests: its config names the class the
    warm-up inspects before it is prepared."""
    from evalparity.data import embedded

    try:
        path = embedded.model_path(prepare=False)
    except Exception:  # noqa: BLE001 - not prepared on this machine
        pytest.skip("the embedded model is not prepared here (`evalparity models prepare`)")
    assert tuple(json.loads((path / "config.json").read_text())["architectures"]) == embedded.ARCHITECTURES


# ---------------------------------------------------------------- kernel warm-ups
SMOLLM2 = ModelShape(134_515_008, 30, 576, 1536, 49152, 3, 64)
QWEN14B = ModelShape(14_770_033_664, 48, 5120, 13824, 152064, 8, 128)
H200 = int(139.8 * GiB)


def test_cells_that_compile_the_same_kernels_share_one_warmup():
    cells = list(build_cells(["hf", "vllm"], ["fp32", "bf16", "fp16"], "auto", []))
    variant = CellSpec("vllm", "bfloat16", "auto", label="fp8", args=(("quantization", "fp8"),))
    same = CellSpec("vllm", "float32", "auto", label="again")  # the same kernels as vllm-fp32
    other_model = CellSpec("vllm", "float16", "auto", label="ft", model="/ckpt")
    other_python = CellSpec("vllm", "float16", "auto", label="old", python="old")
    tf32 = CellSpec("vllm", "float32", "auto", tag="tf32", tf32=True)
    groups = warmup.kernel_groups(cells + [variant, same, other_model, other_python, tf32], "cuda")
    names = [[c.name for c in g] for g in groups]
    assert names == [["vllm-fp32", "again"], ["vllm-bf16"], ["vllm-fp16"], ["fp8"]]  # tf32's is a fifth: over the cap
    assert len(names) == warmup.MAX_KERNEL_WARMUPS
    assert warmup.kernel_groups(cells, "cpu") == []  # vLLM's CPU engine compiles nothing at start


def test_a_warmup_builds_the_cells_own_engine_cut_to_one_layer_of_random_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "architectures": ["X"]}))
    cells = (CellSpec("vllm", "float32", "auto", label="v", args=(("max_num_seqs", "64"),
                                                                  ("hf_overrides", "{'rope_theta': 5.0}"))),)
    spec = RunSpec(model="m", tasks=("t",), cells=cells, device="cuda", alignment=Alignment(max_length=2048),
                   memory_plan={"cells": {"v": {"gpu_memory_utilization": 0.15,
                                                "kv_cache_memory_bytes": 19 * GiB}}})
    own = vllm_backend.model_args(spec, cells[0], str(tmp_path))
    warm = vllm_backend.kernel_warmup_args(spec, cells[0], str(tmp_path), SMOLLM2)
    changed = {k for k in warm if warm[k] != own.get(k)}
    assert changed == {"load_format", "hf_overrides", "gpu_memory_utilization", "kv_cache_memory_bytes"}
    assert warm["load_format"] == "dummy" and warm["hf_overrides"]["num_hidden_layers"] == 1
    assert warm["kv_cache_memory_bytes"] < 1 * GiB and warm["gpu_memory_utilization"] <= 0.01
    assert warm["max_num_seqs"] == own["max_num_seqs"] and warm["dtype"] == "float32"
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 30}}))
    assert vllm_backend.kernel_warmup_args(spec, cells[0], str(tmp_path), SMOLLM2) is None  # nothing to cut


def test_a_warmup_compiles_under_the_cells_own_variables():
    """Triton keys its cache by the compile options, among them ``TRITON_F32_DEFAULT``: a warm-up under other
    variables than its cell's would fill entries the cell never reads."""
    cells = build_cells(["vllm"], ["fp32", "bf16"], "auto", []) + (
        CellSpec("vllm", "float32", "auto", tag="tf32", tf32=True),)
    for device in ("cuda", "cpu"):
        for true_fp32 in (True, False):
            spec = RunSpec(model="m", tasks=("t",), cells=cells, device=device,
                           alignment=Alignment(true_fp32=true_fp32))
            for cell in cells:
                assert vllm_backend.process_environment(device, cell, true_fp32) == \
                    vllm_backend.environment(spec, cell)


def test_the_warmups_memory_is_bounded_and_a_large_model_gets_none():
    small = sum(vllm_backend.kernel_warmup_bytes(SMOLLM2, d, 2048) for d in ("float32", "bfloat16", "float16"))
    assert 1.5 * GiB < small < warmup.KERNEL_SHARE * H200  # three CUDA contexts at least; a tenth of an H200 at most
    big = vllm_backend.kernel_warmup_bytes(QWEN14B, "float32", 2048)
    assert big > 7 * GiB  # its embeddings and output layer alone, in fp32
    assert vllm_backend.kernel_warmup_kv_bytes(SMOLLM2, "float32", 2048) == vllm_backend.WARMUP_MIN_KV


FAKE_ENGINE = ("import json, os, sys\n"
               "line = sys.stdin.readline()\n"
               "m = json.loads(line) if line.strip() else {'skip': 'nothing'}\n"
               "print('engine warm-up', 'go' if 'args' in m else 'skip', json.dumps(m, sort_keys=True),"
               " os.environ.get('TRITON_F32_DEFAULT'), os.environ.get('EVALPARITY_PORT_BASE'), flush=True)\n")


def _fake_engines(monkeypatch, tmp_path, script=FAKE_ENGINE):
    monkeypatch.setenv("EVALPARITY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(vllm_backend, "warm_caches", lambda archs, device: None)
    monkeypatch.setattr(vllm_backend, "kernel_warmup_argv",
                        lambda device: None if device == "cpu" else [sys.executable, "-c", script])


def test_kernel_warmups_wait_for_the_plan_then_build_what_they_are_told(tmp_path, monkeypatch):
    _fake_engines(monkeypatch, tmp_path)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "architectures": ["LlamaForCausalLM"]}))
    cells = build_cells(["hf", "vllm"], ["fp32", "bf16"], "auto", [])
    warm = warmup.start(cells, "cuda", model, true_fp32=True, run_key=str(tmp_path))
    assert [[c.name for c in k.cells] for k in warm.kernels] == [["vllm-fp32"], ["vllm-bf16"]]
    time.sleep(0.5)
    assert all(k.proc.poll() is None for k in warm.kernels)  # waiting for the run's word, holding no GPU
    held = warm.fit(SMOLLM2, 2048, H200)
    assert held == sum(vllm_backend.kernel_warmup_bytes(SMOLLM2, d, 2048) for d in ("float32", "bfloat16"))
    spec = RunSpec(model="m", tasks=("t",), cells=cells, device="cuda", alignment=Alignment(max_length=2048))
    warm.go(spec, str(model), pending={"vllm-fp32", "hf-fp32"})
    for k in warm.kernels:
        k.proc.wait(timeout=30)
    fp32, bf16 = warm.record()
    assert fp32["sent"] == "go" and bf16["sent"] == "skip: its cells are done already"
    assert fp32["said"].startswith("engine warm-up go") and bf16["said"].startswith("engine warm-up skip")
    lines = [k.log_path.read_text().strip() for k in warm.kernels]
    said = json.loads(lines[0].split(" ", 3)[3].rsplit(" ", 2)[0])
    vllm_fp32 = next(c for c in cells if c.name == "vllm-fp32")
    assert said["args"] == vllm_backend.kernel_warmup_args(spec, vllm_fp32, str(model), SMOLLM2)
    assert lines[0].split()[-2] == "ieee" and lines[1].split()[-2] == "None"  # each its cell's variables
    ports = {ln.split()[-1] for ln in lines}
    assert len(ports) == 2 and all(int(p) >= 1024 for p in ports)  # a port range each
    assert fp32["ended"] == "exit 0" and fp32["cells"] == ["vllm-fp32"]
    warm.close()


def test_a_warmup_too_large_for_its_share_or_without_a_plan_is_told_to_skip(tmp_path, monkeypatch):
    _fake_engines(monkeypatch, tmp_path)
    cells = build_cells(["vllm"], ["fp32"], "auto", [])
    warm = warmup.start(cells, "cuda", None, true_fp32=True, run_key="r")
    assert warm.fit(QWEN14B, 2048, 80 * GiB) == 0  # its one layer and embeddings: more than a tenth of 80 GiB
    warm.go(RunSpec(model="m", tasks=("t",), cells=cells, device="cuda"), "m", pending={"vllm-fp32"})
    warm.kernels[0].proc.wait(timeout=30)
    rec = warm.record()[0]
    assert rec["sent"].startswith("skip: ") and "GiB for the warm-up engines" in rec["said"]
    assert "args" not in rec["said"]
    warm.close()
    warm = warmup.start(cells, "cuda", None, true_fp32=True, run_key="r")
    warm.go(RunSpec(model="m", tasks=("t",), cells=cells, device="cuda"), "m", pending={"vllm-fp32"})
    warm.kernels[0].proc.wait(timeout=30)
    assert warm.record()[0]["sent"] == "skip: no memory plan made room for it"
    warm.close()


def test_the_end_of_the_run_stops_a_warmup_whatever_it_does(tmp_path, monkeypatch):
    _fake_engines(monkeypatch, tmp_path, "import time\ntime.sleep(120)\n")  # never reads its input
    warm = warmup.start(build_cells(["vllm"], ["fp32"], "auto", []), "cuda", None, true_fp32=True, run_key="r")
    proc = warm.kernels[0].proc
    t0 = time.monotonic()
    assert warm.record()[0]["ended"] == "still running: stopped"
    warm.close()
    assert proc.poll() is not None and time.monotonic() - t0 < 10
    assert warm.record()[0]["sent"] == "skip: the run ended first"


def test_the_memory_plan_leaves_the_warmups_what_they_hold(tmp_path, monkeypatch):
    """The plan hands out what is free less what the warm-ups will hold, measured before they hold it."""
    from evalparity.cli import run as run_cli

    _fake_engines(monkeypatch, tmp_path)
    gpu = memplan.Gpu(total=H200, free=H200 - 2 * GiB)
    monkeypatch.setattr(memplan, "gpus_here", lambda: [gpu])
    monkeypatch.setattr(memplan, "read_shape", lambda path: SMOLLM2)
    cells = build_cells(["hf", "vllm"], ["fp32", "bf16", "fp16"], "auto", [])
    seen = []
    real_plan = memplan.plan
    monkeypatch.setattr(memplan, "plan", lambda *a, **kw: seen.append(a[2]) or real_plan(*a, **kw))
    warm = warmup.start(cells, "cuda", None, true_fp32=True, run_key="r")
    run_cli.plan_memory("cuda", None, "m", cells, 2048, 1, None, warm)
    held = sum(vllm_backend.kernel_warmup_bytes(SMOLLM2, d, 2048) for d in ("float32", "bfloat16", "float16"))
    assert seen[-1] == [memplan.Gpu(total=H200, free=gpu.free - held)] and warm.shape == SMOLLM2
    warm.close()
    bare = warmup.start(cells, "cpu", None, true_fp32=True, run_key="r")  # no warm-ups on the CPU: nothing held
    run_cli.plan_memory("cuda", None, "m", cells, 2048, 1, None, bare)
    assert seen[-1] == [gpu]


@ahead.job("engine_warmup", wanted=lambda: importlib.util.find_spec("vllm") is not None)
def _engine_warmup(ctx: ahead.Context):
    """The real warm-up process on vLLM's CPU engine and the tiny model: it builds the one-layer engine."""
    model = ctx.fixture("tiny_model")
    spec = RunSpec(model="m", tasks=("t",), cells=build_cells(["vllm"], ["fp32"], 8, []), device="cpu",
                   alignment=Alignment(max_length=256))
    args = vllm_backend.kernel_warmup_args(spec, spec.cells[0], str(model), memplan.read_shape(model))
    env = cell_environment(vllm_backend.environment(spec, spec.cells[0]), True, spec.cells[0])
    cmd = [sys.executable, "-c", "import sys, json; from evalparity.backends import vllm_warmup; "
           f"sys.stdin = __import__('io').StringIO({json.dumps(json.dumps({'args': args}) + chr(10))}); "
           "vllm_warmup.main(['--engine'])"]
    return lambda: ctx.run(cmd, env=env, timeout=600)


@pytest.fixture(scope="module")
def engine_warmup(request):
    pytest.importorskip("vllm")
    return ahead.take("engine_warmup", request)


def test_the_warmup_process_builds_a_one_layer_engine_of_random_weights(engine_warmup):
    out = engine_warmup.stdout
    assert engine_warmup.returncode == 0, out[-2000:] + engine_warmup.stderr[-2000:]
    said = [ln for ln in out.splitlines() if ln.startswith("engine warm-up")]
    assert len(said) == 1 and "done" in said[0] and "1 layer(s), dummy weights, torch.float32" in said[0], said
