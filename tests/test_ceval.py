"""The mission's command, `evalparity run --tasks hellaswag,ceval --backends vllm,hf`, offline: the typed group
name resolves to lm-eval's `ceval-valid`, and its 52 subjects (a synthetic mirror) fold under its verdict."""

from __future__ import annotations

import json
import time

import ahead
import pytest
from conftest import SHARED_DATA, cli
from synthetic_ceval import HUB_ID, SUBJECTS, write_mirror

from evalparity import tasks
from evalparity.errors import EvalParityError
from evalparity.report import md_escape


@pytest.fixture(scope="module")
def tm():
    return tasks.task_manager()


def test_split_suffixed_group_names_resolve_conservatively(tm):
    names, resolved = tasks.resolve_names(["hellaswag", "ceval", "ceval-valid", "mmmu"], tm)
    assert names == ["hellaswag", "ceval-valid", "mmmu_val"]  # ceval-valid once, in the typed order
    assert resolved == {"ceval": "ceval-valid", "mmmu": "mmmu_val"}
    # Registered names are never rewritten; a single task ending in a split word is a subject, not a split.
    assert tasks.split_suffixed("ceval-valid", tm) is None
    assert tasks.split_suffixed("arabicmmlu_driving", tm) is None
    with pytest.raises(EvalParityError, match="unknown task 'cevall'"):
        tasks.check_names(tasks.resolve_names(["cevall"], tm)[0], tm)


def test_synthetic_mirror_is_lm_evals_ceval_layout(tm, tmp_path):
    """lm-eval's own ceval-valid group reads the generated mirror: every member, its val split, few-shot dev."""
    write_mirror(tmp_path, val=3, dev=2)
    plan = tasks.preflight(["ceval-valid"], tm, [tmp_path], None, num_fewshot=2)
    assert plan.leaves == {f"ceval-valid_{s}": 3 for s in SUBJECTS}
    assert sorted(plan.groups["ceval-valid"]) == sorted(plan.leaves)
    assert "[synthetic]" in (tmp_path / HUB_ID / "law" / "val.jsonl").read_text()


def _mirrored() -> bool:
    return (SHARED_DATA / "Rowan" / "hellaswag").is_dir()


@ahead.job("mission", wanted=_mirrored)
def _mission_run(ctx: ahead.Context):
    root = ctx.mktemp("mission")
    data = write_mirror(root / "datasets")
    (data / "Rowan").symlink_to(SHARED_DATA / "Rowan", target_is_directory=True)
    out = root / "run"
    cmd = cli("run", "--tasks", "hellaswag,ceval", "--backends", "vllm,hf", "--model", str(ctx.fixture("tiny_model")),
              "--datasets-dir", str(data), "--limit", "2", "--dtypes", "fp32", "--out", str(out))

    def work():
        t0 = time.perf_counter()
        proc = ctx.run(cmd, env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
        return out, proc, time.perf_counter() - t0
    return work


@pytest.fixture(scope="module")
def mission(request):
    """The mission's command on the tiny model, offline, on the synthetic mirror and the shared HellaSwag
    mirror (started ahead: tests/ahead.py)."""
    return ahead.take("mission", request)


@pytest.mark.skipif(not _mirrored(), reason="../shared/data is not beside the checkout")
def test_mission_command_offline(mission):
    out, proc, took = mission
    print(f"mission command, 2 cells x 106 docs: {took:.1f} s")
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]  # the verdict on a random model is not the point
    assert "task 'ceval' is lm-eval's group 'ceval-valid'" in proc.stderr
    spec = json.loads((out / "spec.json").read_text())
    assert spec["tasks"] == ["hellaswag", "ceval-valid"] and spec["task_aliases"] == [["ceval", "ceval-valid"]]

    # The group's pooled comparison gates; its members are shown but do not.
    v = json.loads((out / "stats" / "verdicts.json").read_text())
    gating = {(r["task"], r["level"]) for r in v["comparisons"] if r["gating"]}
    assert ("ceval-valid", "group") in gating and not any(t.startswith("ceval-valid_") for t, _ in gating)

    # In the report the group's row comes first and its 52 members are folded under it.
    md = (out / "report" / "report.md").read_text()
    fold = md.index("<details><summary>ceval-valid: 52 member tasks</summary>")
    assert md.index("| ceval-valid |") < fold and md.index("| hellaswag |") < fold
    end = md.index("</details>", fold)
    for s in SUBJECTS:
        assert fold < md.index(f"| {md_escape(f'ceval-valid_{s}')} |") < end, s  # as the report escapes it
