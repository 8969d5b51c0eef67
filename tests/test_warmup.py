"""The vLLM warm-up (evalparity/warmup.py, backends/vllm_warmup.py) writes the cache entry vLLM's own
inspection reads back, and a run's warm-up handle waits, gives up at its limit and cleans up."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from evalparity import warmup
from evalparity.backends import vllm as vllm_backend


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
    warm = warmup.start({"hf", "vllm"}, "cuda", tmp_path / "m")
    assert len(warm.running) == 1  # hf has no warm-up
    warm.running[0].wait(timeout=30)
    warm.close()
    assert "warming ['LlamaForCausalLM'] cuda" in (tmp_path / "cache" / "warmup.log").read_text()
    assert warmup.start({"vllm"}, "cuda", tmp_path / "absent").running == []  # no architecture: nothing


def test_the_embedded_models_architecture_is_the_one_prepared():
    """CI prepares the embedded model (README command 1) before the tests: its config names the class the
    warm-up inspects before it is prepared."""
    from evalparity.data import embedded

    try:
        path = embedded.model_path(prepare=False)
    except Exception:  # noqa: BLE001 - not prepared on this machine
        pytest.skip("the embedded model is not prepared here (`evalparity models prepare`)")
    assert tuple(json.loads((path / "config.json").read_text())["architectures"]) == embedded.ARCHITECTURES
