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


def test_shards_split_every_document_once_and_repeats_name_them():
    spec = RunSpec(model="m", tasks=("t",), cells=(), limit=10, leaf_docs=(("a", 7), ("b", 30)))
    parts = [spec.shard_samples(k, 3) for k in range(3)]
    for leaf, n in (("a", 7), ("b", 10)):
        ids = sorted(i for p in parts for i in p[leaf])
        assert ids == list(range(n))  # each document in exactly one shard, the limit kept
    assert parts[1]["a"] == [1, 4]
    cells = build_cells(["vllm"], ["fp32"], 8, ["vllm:fp32:dp2"], shards=1)
    assert [(c.name, c.shards) for c in cells] == [("vllm-fp32", 1), ("vllm-fp32-dp2", 2)]
    with pytest.raises(EvalParityError, match="another shard count"):
        build_cells(["vllm"], ["fp32"], 8, ["vllm:fp32:dp2"], shards=2)
    with pytest.raises(EvalParityError, match="dpN"):
        build_cells(["vllm"], ["fp32"], 8, ["vllm:fp32:dpx"])
    back = RunSpec.from_json(RunSpec(model="m", tasks=("t",), cells=cells, tensor_parallel=2).to_json())
    assert back.cells == cells and back.tensor_parallel == 2


def test_precision_environment_of_fp32_and_tf32_cells():
    from evalparity.backends import precision

    assert precision.environment("bfloat16", True) == {}
    true = precision.environment("float32", True)
    assert true == {"TRITON_F32_DEFAULT": "ieee", "VLLM_FLOAT32_MATMUL_PRECISION": "highest"}
    tf32 = precision.environment("float32", False)
    assert tf32 == {"TRITON_F32_DEFAULT": "tf32", "VLLM_FLOAT32_MATMUL_PRECISION": "high"}


def test_the_precision_probe_answers_when_the_new_tf32_api_was_mixed_in():
    """vLLM's batch-invariant mode sets TF32 through torch's new per-backend API; torch then refuses to answer
    the legacy ``allow_tf32`` question, which crashed every such cell on an H200 (VLLM_BATCH_INVARIANT=1).
    The probe records the new settings instead and says the legacy flag is mixed. Run in a child process:
    the switches are process-wide."""
    import json
    import subprocess
    import sys

    code = ("import json, torch; from evalparity.backends import precision; "
            "torch.backends.cuda.matmul.fp32_precision = 'tf32'; print(json.dumps(precision.probe()))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["cuda_matmul_allow_tf32"] == "mixed: see the fp32_precision entries"
    assert got["cuda_matmul_fp32_precision"] == "tf32"
    assert got["float32_matmul_precision"] == "mixed: see the fp32_precision entries"


def test_a_repeat_needs_its_base_among_the_cells_or_the_folders():
    """A repeat without its base cell measures no noise floor and joins no comparison: refused before
    anything starts, unless the run folder holds the base already (a run may add cells to a folder)."""
    from evalparity.errors import EvalParityError
    from evalparity.spec import build_cells, check_repeats_have_base

    cells = build_cells(["hf"], ["fp32"], 8, ["hf:bf16:4"], tf32=["hf"])
    with pytest.raises(EvalParityError, match="hf-bf16-bs4, a repeat of hf-bf16, which is not a cell of this run"):
        check_repeats_have_base(cells, [])
    check_repeats_have_base(cells, ["hf-bf16"])  # the folder's spec holds it: accepted
    check_repeats_have_base(build_cells(["hf"], ["fp32", "bf16"], 8, ["hf:bf16:4"]), [])
