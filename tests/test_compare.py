"""`evalparity compare` on outputs of plain `lm_eval` gives the verdicts `evalparity run` gives."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import evalparity, one_line_error


def plain_lm_eval(model: Path, tasks: Path, dtype: str, out: Path) -> Path:
    args = [sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--model_args",
            f"pretrained={model},dtype={dtype},softmax_dtype=float32,max_length=512",
            "--tasks", "tiny_mc,tiny_gen", "--include_path", str(tasks), "--limit", "10", "--batch_size", "8",
            "--seed", "1234", "--log_samples", "--output_path", str(out), "--device", "cpu"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def both(tiny_run, tiny_model, tiny_tasks, tmp_path_factory):
    """The shared tiny run's hf-fp32 and hf-bf16 cells, with their statistics recomputed on their own (a run
    directory is its cells: `report` reads cells/ and nothing else), against plain lm_eval's outputs of
    the same settings."""
    root = tmp_path_factory.mktemp("cmp")
    run = root / "run"
    (run / "cells").mkdir(parents=True)
    # The spec names the cells of the run; this copy is a run of two of them (a cell the spec names but the
    # folder lacks would make the sign-off INCOMPLETE).
    spec = json.loads((tiny_run[0] / "spec.json").read_text())
    spec["cells"] = [c for c in spec["cells"] if c["name"] in ("hf-fp32", "hf-bf16")]
    (run / "spec.json").write_text(json.dumps(spec))
    for cell in ("hf-fp32", "hf-bf16"):
        shutil.copytree(tiny_run[0] / "cells" / cell, run / "cells" / cell)
    proc = evalparity("report", str(run))
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]
    a = plain_lm_eval(tiny_model, tiny_tasks, "float32", root / "plain_fp32")
    b = plain_lm_eval(tiny_model, tiny_tasks, "bfloat16", root / "plain_bf16")
    cmp_dir = root / "compare"
    proc2 = evalparity("compare", str(a), str(b), "--out", str(cmp_dir))
    assert proc2.returncode in (0, 3, 4), proc2.stderr[-3000:]
    return run, cmp_dir, a, b


def _key(r):
    return (r["task"], r["filter"], r["metric"], r["cell"])


def test_compare_names_cells_from_lm_eval_config(both):
    _, cmp_dir, _, _ = both
    assert sorted(p.name for p in (cmp_dir / "cells").iterdir()) == ["hf-bf16", "hf-fp32"]


def test_compare_gives_the_same_verdicts_as_run(both):
    run, cmp_dir, _, _ = both
    vr = {_key(r): r for r in json.loads((run / "stats" / "verdicts.json").read_text())["comparisons"]}
    vc = {_key(r): r for r in json.loads((cmp_dir / "stats" / "verdicts.json").read_text())["comparisons"]}
    assert set(vc) == set(vr)
    for k, r in vr.items():
        c = vc[k]
        assert (c["verdict"], c["n"]) == (r["verdict"], r["n"]), k
        for f in ("effect", "p_shift", "p_equivalence", "p_beyond", "ci_low", "ci_high"):
            assert c[f] == pytest.approx(r[f], abs=1e-9), (k, f)
    assert (cmp_dir / "report" / "report.html").exists()


def test_compare_refuses_bad_inputs(both, tmp_path):
    _, _, a, b = both
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no samples_" in one_line_error(evalparity("compare", str(a), str(empty), "--out", str(tmp_path / "o1")))
    # prompts that differ for the same doc id
    bad = tmp_path / "bad"
    subprocess.run(["cp", "-r", str(b), str(bad)], check=True)
    f = next(bad.rglob("samples_tiny_mc_*.jsonl"))
    lines = f.read_text().splitlines()
    row = json.loads(lines[0])
    row["prompt_hash"] = "0" * 64
    f.write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    line = one_line_error(evalparity("compare", str(a), str(bad), "--out", str(tmp_path / "o2")))
    assert "different prompt" in line and "doc" in line
    # a truncated jsonl line
    f.write_text("\n".join(lines[:-1] + [lines[-1][: len(lines[-1]) // 2]]) + "\n")
    assert "is not valid JSON" in one_line_error(evalparity("compare", str(a), str(bad), "--out", str(tmp_path / "o3")))
    # no task in common
    other = tmp_path / "other"
    subprocess.run(["cp", "-r", str(b), str(other)], check=True)
    for p in other.rglob("samples_*.jsonl"):
        p.rename(p.with_name(p.name.replace("tiny_", "other_")))
    assert "no task in common" in one_line_error(
        evalparity("compare", str(a), str(other), "--out", str(tmp_path / "o4")))
