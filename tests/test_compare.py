"""`evalparity compare` on outputs of plain `lm_eval` gives the verdicts `evalparity run` gives."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import ahead
import pytest
from conftest import evalparity_here, one_line_error
from synthetic import make_lm_eval_dir, run_of_cells
from verdict_schema import check_verdicts


def plain_lm_eval(model: Path, tasks: Path, dtype: str, out: Path) -> list[str]:
    """Plain lm_eval's command for one dtype of the shared tiny run's HF cells, its samples to ``out``."""
    return [sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--model_args",
            f"pretrained={model},dtype={dtype},softmax_dtype=float32,max_length=512",
            "--tasks", "tiny_mc,tiny_gen", "--include_path", str(tasks), "--limit", "10", "--batch_size", "8",
            "--seed", "1234", "--log_samples", "--output_path", str(out), "--device", "cpu"]


@ahead.job("both")
def _plain_runs(ctx: ahead.Context):
    """The two plain lm_eval runs (started ahead: tests/ahead.py)."""
    root = ctx.mktemp("plain")
    model, tasks = ctx.fixture("tiny_model"), ctx.fixture("tiny_tasks")
    outs = {dtype: root / f"plain_{dtype}" for dtype in ("float32", "bfloat16")}
    return lambda: {dtype: (out, ctx.run(plain_lm_eval(model, tasks, dtype, out), timeout=600))
                    for dtype, out in outs.items()}


@pytest.fixture(scope="module")
def both(tiny_run, request, tmp_path_factory):
    """The shared tiny run's hf-fp32 and hf-bf16 cells, with their statistics recomputed on their own (a run
    directory is its cells: `report` reads cells/ and nothing else), against plain lm_eval's outputs of
    the same settings."""
    root = tmp_path_factory.mktemp("cmp")
    # The spec names the cells of the run; this copy is a run of two of them (a cell the spec names but the
    # folder lacks would make the sign-off INCOMPLETE).
    run = run_of_cells(tiny_run[0], root / "run", ("hf-fp32", "hf-bf16"))
    proc = evalparity_here("report", str(run))
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]
    plain = ahead.take("both", request)
    for _, lm in plain.values():
        assert lm.returncode == 0, lm.stderr[-3000:]
    a, b = plain["float32"][0], plain["bfloat16"][0]
    cmp_dir = root / "compare"
    proc2 = evalparity_here("compare", str(a), str(b), "--out", str(cmp_dir))
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
    vc = {_key(r): r for r in check_verdicts(cmp_dir / "stats" / "verdicts.json")["comparisons"]}
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
    line = one_line_error(evalparity_here("compare", str(a), str(empty), "--out", str(tmp_path / "o1")))
    assert "no samples_" in line, line
    # prompts that differ for the same doc id
    bad = tmp_path / "bad"
    subprocess.run(["cp", "-r", str(b), str(bad)], check=True)
    f = next(bad.rglob("samples_tiny_mc_*.jsonl"))
    lines = f.read_text().splitlines()
    row = json.loads(lines[0])
    row["prompt_hash"] = "0" * 64
    f.write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    line = one_line_error(evalparity_here("compare", str(a), str(bad), "--out", str(tmp_path / "o2")))
    assert "different prompt" in line and "doc" in line
    # a truncated jsonl line
    f.write_text("\n".join(lines[:-1] + [lines[-1][: len(lines[-1]) // 2]]) + "\n")
    line = one_line_error(evalparity_here("compare", str(a), str(bad), "--out", str(tmp_path / "o3")))
    assert "is not valid JSON" in line, line
    # no task in common
    other = tmp_path / "other"
    subprocess.run(["cp", "-r", str(b), str(other)], check=True)
    for p in other.rglob("samples_*.jsonl"):
        p.rename(p.with_name(p.name.replace("tiny_", "other_")))
    assert "no task in common" in one_line_error(
        evalparity_here("compare", str(a), str(other), "--out", str(tmp_path / "o4")))


# ---------------------------------------------------------------- what compare cannot pair honestly (issue 25)
# Synthetic lm-eval folders (tests/synthetic.py): no model, a few seconds each.
D1, D2 = "2025-01-01T00-00-00.000000", "2025-01-02T09-30-00.000000"


def test_two_runs_in_one_output_folder_are_listed_and_one_can_be_picked(tmp_path):
    """lm_eval run twice into one --output_path (fp32 on two tasks, then bf16 on one): the folder holds two
    runs side by side, and reading the newest file per task made a cell 'hf-bf16' of fp32 samples."""
    mixed = tmp_path / "mixed"
    make_lm_eval_dir(mixed, dtype="float32", task="syn_a", date=D1)
    make_lm_eval_dir(mixed, dtype="float32", task="syn_b", date=D1, seed=3)
    make_lm_eval_dir(mixed, dtype="bfloat16", task="syn_a", date=D2, seed=1, flip=2)
    other = make_lm_eval_dir(tmp_path / "other", dtype="float16", task="syn_a", seed=2)
    out = tmp_path / "o"
    line = one_line_error(evalparity_here("compare", str(other), str(mixed), "--out", str(out)))
    assert "2 lm-eval runs" in line and D1 in line and D2 in line and f"{mixed}@{D2}" in line, line
    assert not out.exists()
    bad = one_line_error(evalparity_here("compare", str(other), f"{mixed}@2024-12-31T00-00-00.000000", "--out",
                                         str(out)))
    assert "no lm-eval run started 2024-12-31" in bad and D1 in bad and D2 in bad, bad
    for stamp, cell, tasks in ((D1, "hf-fp32", {"syn_a"}), (D2, "hf-bf16", {"syn_a"})):
        o = tmp_path / f"o-{cell}"
        proc = evalparity_here("compare", str(other), f"{mixed}@{stamp}", "--out", str(o), "--no-fail-on-inconclusive")
        assert proc.returncode in (0, 3, 4), proc.stderr[-2000:]
        meta = json.loads((o / "cells" / cell / "cell.json").read_text())
        assert meta["source"] == f"{mixed.resolve()}@{stamp}"
        assert json.loads((o / "compare.json").read_text())["inputs"][1] == f"{mixed.resolve()}@{stamp}"
        import pandas as pd

        table = pd.read_parquet(o / "cells" / cell / "samples.parquet")
        assert set(table["task"]) == tasks  # syn_b: only in the fp32 run, and not in `other`


def test_the_same_input_twice_is_refused(tmp_path):
    a = make_lm_eval_dir(tmp_path / "a", dtype="float32")
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    out = tmp_path / "o"
    line = one_line_error(evalparity_here("compare", str(a), str(a), "--out", str(out)))
    assert "same lm-eval output" in line and str(a) in line, line
    line = one_line_error(evalparity_here("compare", str(a), str(tmp_path / "x" / ".." / "a"), "--out", str(out)))
    assert "same lm-eval output" in line, line
    line = one_line_error(evalparity_here("compare", str(a), str(copy), "--out", str(out)))
    assert "byte-identical samples" in line and str(a) in line and str(copy) in line, line
    line = one_line_error(evalparity_here("compare", str(a), f"{a}@{D1}", "--out", str(out)))  # the one run, picked
    assert "byte-identical samples" in line, line
    assert not out.exists()


def compare_with_a_task_missing(tmp_path: Path):
    """``evalparity compare`` of an fp32 output with tasks syn_a and syn_b and a bf16 one with syn_a only:
    (the second input, the output folder, the command's result)."""
    a = make_lm_eval_dir(tmp_path / "a", dtype="float32", task="syn_a")
    make_lm_eval_dir(a, dtype="float32", task="syn_b", seed=5)
    b = make_lm_eval_dir(tmp_path / "b", dtype="bfloat16", task="syn_a", seed=1)
    out = tmp_path / "o"
    proc = evalparity_here("compare", str(a), str(b), "--out", str(out), "--no-fail-on-inconclusive")
    assert proc.returncode in (0, 3, 4), proc.stderr[-2000:]
    return b, out, proc


def test_tasks_missing_from_some_inputs_are_named_and_recorded(tmp_path):
    b, out, proc = compare_with_a_task_missing(tmp_path)
    warned = [ln for ln in proc.stderr.splitlines() if "not in every input" in ln]
    assert len(warned) == 1 and "syn_b (missing from hf-bf16)" in warned[0], proc.stderr
    record = json.loads((out / "compare.json").read_text())
    assert record["tasks_not_in_every_input"] == [{"task": "syn_b", "missing_from": ["hf-bf16"]}]
    verdicts = json.loads((out / "stats" / "verdicts.json").read_text())
    assert verdicts["sign_off"]["tasks_not_compared"] == [{"task": "syn_b", "missing_from": ["hf-bf16"]}]
    for name in ("report.md", "report.html"):  # and the report says so, beside the sign-off
        text = (out / "report" / name).read_text().replace("\\_", "_")  # report.md escapes markdown's _
        assert "Not compared: task syn_b is missing from hf-bf16" in text, name
    full = make_lm_eval_dir(tmp_path / "c", dtype="float16", task="syn_a", seed=2)
    proc = evalparity_here("compare", str(b), str(full), "--out", str(tmp_path / "o2"), "--no-fail-on-inconclusive")
    assert "not in every input" not in proc.stderr
    assert json.loads((tmp_path / "o2" / "compare.json").read_text())["tasks_not_in_every_input"] == []


@pytest.mark.parametrize("edit", ["emptied", "other cell", "dropped", "one record's list dropped"])
def test_a_comparisons_tasks_left_out_are_held_to_its_cells_inputs(tmp_path, edit):
    """compare.json's tasks_not_in_every_input is not in the comparison's identity (the tables hold only the
    tasks in common), so each cell's record lists its input's tasks and the run's verification holds the two
    together: emptied, pointed at another cell or dropped, the report would stop naming the task some inputs
    lacked (review finding F8). A comparison whose records do not list them (made before) still verifies."""
    _, out, _ = compare_with_a_task_missing(tmp_path)
    cells = sorted(p.name for p in (out / "cells").iterdir())
    listed = {c: json.loads((out / "cells" / c / "cell.json").read_text())["input_tasks"] for c in cells}
    assert listed == {c: ["syn_a"] if c == "hf-bf16" else ["syn_a", "syn_b"] for c in cells} and len(cells) == 2
    path = out / "compare.json"
    record = json.loads(path.read_text())
    if edit == "one record's list dropped":  # with the list emptied to match: one compare writes every cell
        rec = json.loads((out / "cells" / "hf-bf16" / "cell.json").read_text())
        del rec["input_tasks"]
        (out / "cells" / "hf-bf16" / "cell.json").write_text(json.dumps(rec))
        record["tasks_not_in_every_input"] = []
        path.write_text(json.dumps(record))
        line = one_line_error(evalparity_here("report", str(out), "--no-fail-on-inconclusive"))
        assert "hf-bf16/cell.json: its input_tasks is not a list of task names" in line, line
        return
    if edit == "emptied":
        record["tasks_not_in_every_input"] = []
    elif edit == "other cell":
        record["tasks_not_in_every_input"][0]["missing_from"] = [n for n in record["names"] if n != "hf-bf16"]
    else:
        del record["tasks_not_in_every_input"]
    path.write_text(json.dumps(record))
    line = one_line_error(evalparity_here("report", str(out), "--no-fail-on-inconclusive"))
    assert "compare.json: its tasks_not_in_every_input is not what its cells' inputs had (they say: syn_b " \
           "missing from hf-bf16)" in line, line
    for c in cells:  # a comparison made before the records listed their inputs' tasks
        rec = json.loads((out / "cells" / c / "cell.json").read_text())
        del rec["input_tasks"]
        (out / "cells" / c / "cell.json").write_text(json.dumps(rec))
    proc = evalparity_here("report", str(out), "--no-fail-on-inconclusive")
    assert proc.returncode in (0, 3, 4), proc.stderr[-2000:]
