"""The spec: dtype and backend aliases, the cell matrix, per-task limits, identity."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

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
    with pytest.raises(EvalParityError, match="hf-bf16-bs4, which is a repeat of hf-bf16, which is not a cell of th"):
        check_repeats_have_base(cells, [])
    check_repeats_have_base(cells, ["hf-bf16"])  # the folder's spec holds it: accepted
    check_repeats_have_base(build_cells(["hf"], ["fp32", "bf16"], 8, ["hf:bf16:4"]), [])


# ---------------------------------------------------------------- a cell's part in the comparisons
NAMES = ["q", "hf-fp32-x", "vllm-bf16-sdpa", "hf-fp32-x-y", "vllm-fp32-fp8"]


def _role(c) -> tuple:
    """What a cell is in the statistics' comparisons (``stats.compare._pairs``): gating (untagged), or a
    repeat or TF32 cell of its base."""
    return ("gating",) if not c.tag else ("tf32" if c.tf32 else "repeat", c.base_name)


@st.composite
def _runs(draw):
    """The cells of a run evalparity builds: a matrix with repeats and TF32 cells, named cells (some named
    ``<another cell>-<word>``), repeats of named cells; None where the options are refused."""
    from evalparity import variants

    backends = draw(st.lists(st.sampled_from(["hf", "vllm"]), min_size=1, max_size=2, unique=True))
    dtypes = draw(st.lists(st.sampled_from(["fp32", "bf16", "fp16"]), min_size=1, max_size=3, unique=True))
    bs = draw(st.sampled_from([4, 8]))
    repeats = draw(st.lists(st.builds(lambda b, d, n: f"{b}:{d}:{n}", st.sampled_from(backends),
                                      st.sampled_from(dtypes), st.sampled_from(["2", "16", "dp2"])), max_size=2))
    tf32 = draw(st.lists(st.sampled_from(backends), max_size=1))
    named = draw(st.lists(st.builds(lambda n, b, d, a: f"{n}={b}:{d}" + (f":{a}" if a else ""),
                                    st.sampled_from(NAMES), st.sampled_from(["hf", "vllm"]),
                                    st.sampled_from(["fp32", "bf16"]), st.sampled_from(["", "max_model_len=64"])),
                          max_size=3))
    named_repeats = draw(st.lists(st.builds(lambda n, k: f"{n}:{k}", st.sampled_from(NAMES),
                                            st.sampled_from(["2", "dp3"])), max_size=2))
    try:
        matrix = build_cells(backends, dtypes, bs, repeats, tf32)
        return variants.run_cells(matrix, named, bs, 1, {"hf": "", "vllm": ""}, named_repeats)
    except EvalParityError:
        return None


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(cells=_runs(), pick=st.integers(0, 99), split=st.integers(0, 9), tf32=st.booleans(),
       batch=st.sampled_from([None, 2, 4, 8, 16]), shards=st.sampled_from([None, 1, 2, 3]), args=st.booleans())
def test_no_edit_of_a_cells_tag_and_label_changes_its_part_in_the_comparisons_unrefused(cells, pick, split, tf32,
                                                                                       batch, shards, args):
    """Every run evalparity builds passes ``tagged_cell_problem``. Any edit of one cell's spec entry that keeps
    its name (its folder and its table's rows say it) but re-splits it into label and tag, or changes its TF32
    mark, batch size, shard count or arguments (what an edit of spec.json and cell.json together can do, no
    hash forged) is refused, or leaves the cell's part in the comparisons as it was: no gating cell becomes a
    repeat or a TF32 cell (out of every gating comparison: FAIL became PASS, session 32's review), and no
    repeat becomes a gating cell."""
    from dataclasses import replace

    from evalparity.spec import tagged_cell_problem

    assume(cells is not None)
    assert tagged_cell_problem(cells) is None, [c.name for c in cells]
    c = cells[pick % len(cells)]
    cuts = [i for i, ch in enumerate(c.name) if ch == "-"]
    label, tag = (c.name, "") if not cuts or split % (len(cuts) + 1) == len(cuts) else \
        (c.name[:cuts[split % (len(cuts) + 1)]], c.name[cuts[split % (len(cuts) + 1)] + 1:])
    edited = replace(c, label=label, tag=tag, tf32=tf32, batch_size=batch or c.batch_size,
                     shards=shards or c.shards, args=() if args else c.args)
    assume(edited.name == c.name and edited != c)
    changed = tuple(edited if x is c else x for x in cells)
    if tagged_cell_problem(changed) is None:
        assert _role(edited) == _role(c), (c, edited)


def test_a_repeat_with_other_settings_than_its_base_or_a_tag_no_repeat_has_is_named():
    from dataclasses import replace

    from evalparity import variants
    from evalparity.spec import tagged_cell_problem

    cells = variants.run_cells(build_cells(["vllm"], ["bf16"], 8, []), ["x=vllm:bf16:quantization=fp8"], 8, 1,
                               {"vllm": ""}, ["x:4"])
    assert tagged_cell_problem(cells) is None
    rep = cells[-1]
    for edit, says in ((replace(rep, args=()), "with other settings"), (replace(rep, batch_size=2), "batch size 2"),
                       (replace(rep, tf32=True), "TF32 cell only in part")):
        assert says in tagged_cell_problem((*cells[:-1], edit))[1]
    with pytest.raises(EvalParityError, match="ends like a repeat's or a TF32 cell's"):
        variants.run_cells(cells[:1], ["y-bs4=vllm:bf16"], 8, 1, {"vllm": ""})
