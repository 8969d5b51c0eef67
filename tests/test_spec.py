"""The spec: dtype and backend aliases, the cell matrix, per-task limits, identity."""

from __future__ import annotations

import pytest

from evalparity.errors import EvalParityError
from evalparity.spec import (
    RunSpec,
    build_cells,
    parse_batch_size,
    parse_dtype,
    parse_task_limits,
)


@pytest.mark.parametrize("alias,name", [("fp32", "float32"), ("FLOAT32", "float32"), ("bf16", "bfloat16"),
                                        ("bfloat16", "bfloat16"), ("fp16", "float16"), ("half", "float16")])
def test_dtype_aliases(alias, name):
    assert parse_dtype(alias) == name


def test_cells_repeats_and_tf32():
    cells = build_cells(["vllm", "hf"], ["fp32", "bf16"], 8, ["hf:fp32:1"], ["vllm"])
    names = [c.name for c in cells]
    assert names == ["vllm-fp32", "vllm-bf16", "hf-fp32", "hf-bf16", "hf-fp32-bs1", "vllm-fp32-tf32"]
    assert cells[-1].tf32 and cells[-1].base_name == "vllm-fp32" and cells[-2].batch_size == 1
    with pytest.raises(EvalParityError, match="listed twice"):
        build_cells(["hf", "hf"], ["fp32"], 8, [])
    with pytest.raises(EvalParityError, match="another batch size"):
        build_cells(["hf"], ["fp32"], 8, ["hf:fp32:8"])


def test_batch_size_and_task_limits_parse():
    assert parse_batch_size("auto") == "auto" and parse_batch_size("16") == 16
    with pytest.raises(EvalParityError, match="positive number or auto"):
        parse_batch_size("0")
    assert parse_task_limits(["gsm8k=300"]) == (("gsm8k", 300),)
    with pytest.raises(EvalParityError, match="TASK=N"):
        parse_task_limits(["gsm8k"])


def test_samples_from_task_limits():
    spec = RunSpec(model="m", tasks=("hellaswag", "gsm8k", "mmlu"), cells=(), limit=None,
                   task_limits=(("gsm8k", 3), ("mmlu", 2)),
                   leaf_docs=(("hellaswag", 5), ("gsm8k", 10), ("mmlu_anatomy", 4)))
    assert spec.samples() == {"hellaswag": [0, 1, 2, 3, 4], "gsm8k": [0, 1, 2], "mmlu_anatomy": [0, 1]}
    assert RunSpec(model="m", tasks=("x",), cells=()).samples() is None


def test_identity_ignores_cells_but_not_settings():
    cells = build_cells(["hf"], ["fp32"], 8, [])
    a = RunSpec(model="m", tasks=("t",), cells=cells, limit=5)
    b = RunSpec(model="m", tasks=("t",), cells=cells + build_cells(["vllm"], ["fp32"], 8, []), limit=5)
    c = RunSpec(model="m", tasks=("t",), cells=cells, limit=6)
    assert a.identity() == b.identity() != c.identity()
    assert RunSpec.from_json(b.to_json()) == b
