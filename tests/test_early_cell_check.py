"""``evalparity run`` checks the names of its cells twice: in its argument checks, before anything starts,
with the batch size it knows then (``auto`` where none is given), and again in ``plan_cells`` with the
device's default (8 on the CPU). The early check is only honest if it refuses exactly what the later one
refuses: a generated property, not a list of cases. Generated option sets (backends, dtypes, TF32 lists,
matrix and named repeats, ``--cell`` variants and per-backend arguments, well- and ill-formed, misspelt and
hostile) are asked both ways; either both refuse, with the same one-line message, or both accept the same
cells apart from the batch size."""

from __future__ import annotations

import dataclasses
import random

import pytest

from evalparity.cli.run import CellOptions, PlacementOptions, named_cells
from evalparity.errors import EvalParityError

# (valid, ill-formed or hostile) values of each option; a generated option set takes an ill-formed one
# for each option with a small probability, so that both accepted and refused sets are common
BACKENDS = (["vllm", "hf", "vllm,hf", "hf,vllm"], ["tgi", "VLLM", "vllm,,hf", "hf;rm -rf /", "vlm", ""])
DTYPES = (["fp32", "bf16", "fp16", "float32", "bfloat16", "fp32,bf16", "bf16,fp16,fp32"],
          ["int8", "FP 16", "fp16,", "f16", ""])
TF32 = (["", "vllm", "hf", "vllm,hf"], ["tgi", "vllm,vllm"])
REPEATS = (["hf:fp32:dp2", "hf:fp32:4", "vllm:bf16:16", "v8:4", "v8:dp2"],
           ["hf:fp32:dp0", "hf:fp32:-1", "hf:fp33:2", "tgi:fp32:2", "hf:fp32", "nope:2", "v8:dpx",
            "hf:fp32:dp2:extra", ""])
CELLS = (["v8=vllm:bf16", "v8=vllm:bf16:quantization=fp8", "h16=hf:fp16:batch_size=4",
          "v8=vllm:bf16:env.VLLM_X=1", "v8=vllm:bf16:batch_size=auto", "hq=hf:fp32:attn_implementation=eager"],
         ["bad=hf:int8", "hq=hf:fp32:max_length=256", "x=tgi:fp32", "noequals", "=hf:fp32", "sp ace=hf:fp32",
          "h=hf:fp32:batch_size=0", "hf-fp32=hf:fp32", "../up=hf:fp32", "k=hf:fp32:k", "v8=vllm:bf16:env.=1"])
HF_ARGS = (["", "attn_implementation=eager", "trust_remote_code=True"], ["noequals", "=1", "a=1,a=2", "max_length=9"])
VLLM_ARGS = (["", "gpu_memory_utilization=0.5", "enforce_eager=true"], ["noequals", "max_model_len=512", "=1"])


def generated(seed: int, n: int, bad: float = 0.06) -> list[CellOptions]:
    rng = random.Random(seed)

    def one(pool: tuple[list[str], list[str]]) -> str:
        return rng.choice(pool[1] if rng.random() < bad else pool[0])

    out = []
    for _ in range(n):
        cells = list(dict.fromkeys(one(CELLS) for _ in range(rng.randint(0, 2))))
        named = {c.partition("=")[0] for c in cells}
        repeats = [r for r in (one(REPEATS) for _ in range(rng.randint(0, 2)))
                   if not r.startswith("v8:") or "v8" in named or rng.random() < bad]
        out.append(CellOptions(
            backends=one(BACKENDS) if rng.random() < 0.7 else None,
            dtypes=one(DTYPES) if rng.random() < 0.7 else None,
            tf32=one(TF32), repeat=list(dict.fromkeys(repeats)) or None, cell=cells or None,
            hf_args=one(HF_ARGS), vllm_args=one(VLLM_ARGS)))
    return out


def outcome(cells: CellOptions, bs) -> tuple[str, object]:
    """('refused', message) or ('cells', names and settings without the batch size)."""
    try:
        specs = named_cells(cells, bs, PlacementOptions())
    except EvalParityError as err:
        return "refused", str(err)
    return "cells", [dataclasses.replace(c, batch_size=None) if c.batch_size in ("auto", 8) else c for c in specs]


@pytest.mark.parametrize("seed", range(4))
def test_the_early_cell_check_refuses_exactly_what_the_plan_refuses(seed):
    seen = {"refused": 0, "cells": 0}
    for cells in generated(seed, 150):
        early, late = outcome(cells, "auto"), outcome(cells, 8)
        assert early[0] == late[0], f"{cells}: early {early}, with the device's batch size {late}"
        if early[0] == "refused":
            assert early[1] == late[1] and "\n" not in early[1], (cells, early, late)
        seen[early[0]] += 1
    assert seen["refused"] >= 20 and seen["cells"] >= 20, seen  # both sides of the property were exercised


def test_with_cell_one_of_backends_and_dtypes_takes_the_other_from_the_reference():
    """``--help`` says so ("with --cell, only the reference's"); it was refused ("no dtypes given")."""
    opts = CellOptions(cell=["x=vllm:bf16:quantization=fp8"], backends="vllm,hf")
    assert [c.name for c in named_cells(opts, 8, PlacementOptions(), "hf-fp32")] == ["vllm-fp32", "hf-fp32", "x"]
    opts = CellOptions(cell=["x=vllm:bf16:quantization=fp8"], dtypes="bf16,fp32")
    assert [c.name for c in named_cells(opts, 8, PlacementOptions(), "hf-fp32")] == ["hf-bf16", "hf-fp32", "x"]
    with pytest.raises(EvalParityError, match="give both --backends and --dtypes"):
        named_cells(CellOptions(cell=["x=vllm:bf16"], dtypes="bf16"), 8, PlacementOptions(), "x")
