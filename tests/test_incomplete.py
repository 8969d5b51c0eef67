"""Issue 18, items 5 and 8: a cell the run's spec names that failed, is missing or lost its table makes the
sign-off INCOMPLETE (exit 5), named in the headline, the verdicts and the report; PASS is never printed."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import evalparity_here
from synthetic import make_run

CELLS = ["hf-fp32", "vllm-fp32", "hf-bf16"]


@pytest.fixture(scope="module")
def passing(tmp_path_factory):
    root = make_run(tmp_path_factory.mktemp("inc") / "run", n_tasks=2, cells=CELLS, docs_per_task=1500)
    proc = evalparity_here("report", str(root))
    assert proc.returncode == 0 and proc.stdout.startswith("PASS:"), proc.stderr[-2000:]
    return root


@pytest.mark.parametrize("damage", ["failed", "no_table", "no_folder"])
def test_a_lost_cell_is_incomplete_not_pass(passing, tmp_path, damage):
    root = tmp_path / "run"
    shutil.copytree(passing, root)
    cell = root / "cells" / "vllm-fp32"
    if damage == "failed":
        meta = json.loads((cell / "cell.json").read_text())
        (cell / "cell.json").write_text(json.dumps(meta | {"status": "failed", "error": "RuntimeError: boom"}))
    elif damage == "no_table":
        (cell / "samples.parquet").unlink()
    else:
        shutil.rmtree(cell)
    proc = evalparity_here("report", str(root))
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert proc.stdout.startswith("INCOMPLETE:") and "vllm-fp32" in proc.stdout
    assert "PASS" not in proc.stdout and "sign-off: PASS" not in proc.stderr
    v = json.loads((root / "stats" / "verdicts.json").read_text())
    assert v["sign_off"]["status"] == "INCOMPLETE" and v["sign_off"]["exit_code"] == 5
    assert [c["cell"] for c in v["sign_off"]["incomplete_cells"]] == ["vllm-fp32"]
    md = (root / "report" / "report.md").read_text()
    assert "Sign-off: INCOMPLETE" in md and "Incomplete: cell vllm-fp32" in md
