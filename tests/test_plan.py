"""``evalparity plan``: the docs and GPU time a sign-off needs, read off a run folder (``evalparity/plan.py``).

The run folders are synthetic (no model): one task of 2,000 docs, three cells; ``vllm-fp32`` disagrees with
the reference on 40 docs (20 each way: ψ = 2 %, Δ = 0), ``hf-bf16`` on none. Each plan is held to the staged
planner it must come from and, independently, to the staged rule's exact power; each time to the cell
record's own numbers.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import tamper
from synthetic import make_run, write_cell_record

from evalparity import plan as planning
from evalparity.samples import read_table, write_table
from evalparity.spec import RunSpec
from evalparity.stats import sequential
from evalparity.stats.options import StatsOptions

DOCS, TASK, LEAF_DOCS = 2000, "mmlu_subject_00", 14042
CELLS = ["hf-fp32", "vllm-fp32", "hf-bf16"]
TIMINGS = {"hf-fp32": {"eval_s": 100.0, "load_s": 5.0, "device_name": "NVIDIA H200"},
           "vllm-fp32": {"eval_s": 20.0, "load_s": 40.0, "device_name": "NVIDIA H200"},
           "hf-bf16": {"eval_s": 50.0, "load_s": 4.0, "device_name": "NVIDIA H200"}}


def planted_run(root: Path, *, n_docs: int = DOCS, n_tasks: int = 1, flips: dict[str, tuple[int, int]] | None = None,
                leaf_docs: dict[str, int] | None = None, limit: int | None = None,
                task_limits: dict[str, int] | None = None, timings: dict | None = None, metric: str = "acc") -> Path:
    """A verified run folder (``n_tasks`` of ``n_docs`` docs, members of the group ``mmlu``) whose cells' per-doc
    ``metric`` is the reference's except on chosen docs: ``flips[cell] = (b, c)`` makes b docs right only in the
    reference and c right only in the cell. The spec records ``leaf_docs``, ``limit`` and ``task_limits`` as a
    run does; each cell record carries ``timings[cell]``."""
    make_run(root, n_tasks=n_tasks, cells=CELLS, docs_per_task=n_docs)
    spec = RunSpec.from_json(json.loads((root / "spec.json").read_text())
                             | {"leaf_docs": [[k, v] for k, v in (leaf_docs or {}).items()], "limit": limit,
                                "task_limits": [[k, v] for k, v in (task_limits or {}).items()]})
    (root / "spec.json").write_text(json.dumps(spec.to_json()))
    ref = read_table(root / "cells" / CELLS[0] / "samples.parquet")
    acc = ref.drop_duplicates(["task", "doc_id"]).set_index(["task", "doc_id"])["m:acc"]
    for name in CELLS:
        folder = root / "cells" / name
        t = read_table(folder / "samples.parquet")
        a = acc.copy()
        b, c = (flips or {}).get(name, (0, 0))
        a[acc[acc == 1].index[:b]] = 0.0
        a[acc[acc == 0].index[:c]] = 1.0
        keys = list(zip(t["task"], t["doc_id"]))
        t = t.drop(columns=["m:acc"]).assign(**{f"m:{metric}": a.loc[keys].to_numpy()})
        if metric != "acc":  # a metric that is not 0/1 per doc
            t[f"m:{metric}"] = 0.25 + 0.5 * t[f"m:{metric}"]
        write_table(t, folder / "samples.parquet")
        write_cell_record(folder, spec, name, len(t), **(timings or {}).get(name, {}))
    return root


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return planted_run(tmp_path_factory.mktemp("plan") / "run", flips={"vllm-fp32": (20, 20)},
                       leaf_docs={TASK: LEAF_DOCS}, limit=DOCS, timings=TIMINGS)


@pytest.fixture(scope="module")
def result(run) -> planning.Plan:
    return planning.build_plan(run, StatsOptions(), (0.8, 0.9))


def _one(result: planning.Plan, cell: str) -> planning.ComparisonPlan:
    found = [c for c in result.comparisons if c.cell == cell and c.metric == "acc"]
    assert len(found) == 1, result.comparisons
    return found[0]


def test_the_plan_is_the_staged_planners_at_the_discordance_seen(result):
    c = _one(result, "vllm-fp32")
    assert (c.n, c.reference_only, c.cell_only) == (DOCS, 20, 20)
    assert c.discordance == pytest.approx(0.02) and c.difference == 0.0 and not c.discordance_assumed
    for p, target in zip(c.plans, (0.8, 0.9)):
        want = sequential.n_for_equivalence_staged(0.01, 0.02, power_target=target, alpha=0.05)
        assert p.docs == int(want.total) and p.expected_docs == math.ceil(want.expected_docs - 1e-6)
        assert p.single_look_docs == int(want.single_look_n) and not p.approximate


@pytest.mark.parametrize("target", [0.8, 0.9])
def test_the_planned_size_reaches_the_power_and_a_smaller_one_does_not(result, target):
    """Independently of the planner: the staged rule's exact P(EQUIVALENT) at Δ = 0 is at least the target at N,
    and below it at 0.97·N and at the planner's grid step before N (its P is saw-toothed in N: a grid)."""
    c = _one(result, "vllm-fp32")
    n = next(p.docs for p in c.plans if p.power_target == target)

    def power(docs: int) -> float:
        design = sequential.StagedDesign.for_task(docs, alpha=0.05)
        return sequential.staged_probabilities(design, 0.01, 0.01, margin=0.01).equivalent

    assert power(n) >= target
    assert power(int(0.97 * n)) < target
    single = next(p.single_look_docs for p in c.plans if p.power_target == target)
    grid = [single]
    while grid[-1] < n:
        grid.append(max(grid[-1] + 1, math.ceil(grid[-1] * 1.01)))
    assert grid[-1] == n
    if len(grid) > 1:
        assert power(grid[-2]) < target


def test_a_task_short_of_docs_says_so_with_the_power_it_can_reach(result):
    c = _one(result, "vllm-fp32")
    assert (c.docs_available, c.docs_in_task) == (DOCS, LEAF_DOCS)
    design = sequential.StagedDesign.for_task(DOCS, alpha=0.05)
    reach = sequential.staged_probabilities(design, 0.01, 0.01, margin=0.01).equivalent
    assert c.plans[0].docs > DOCS and c.power_with_available == pytest.approx(reach) and reach < 0.8
    task = next(t for t in result.tasks if t.task == TASK)
    assert task.settles == (False, False) and task.docs == tuple(p.docs for p in c.plans)  # the larger of the two
    assert task.docs_to_score == task.docs  # the task has 14,042: the run's --limit is what is short
    line = result.summary()["line"]
    assert line.startswith(f"to settle all gating comparisons at 80 % power: about {c.plans[0].docs:,} docs per "
                           "task, ")
    assert f"more than this run's {DOCS:,}" in line and f"power {reach:.2f}" in line


def test_no_discordance_is_planned_at_one_in_n(result):
    c = _one(result, "hf-bf16")
    assert c.discordance == 0.0 and c.discordance_assumed and c.discordance_planned == 1 / DOCS
    want = sequential.n_for_equivalence_staged(0.01, 1 / DOCS, power_target=0.8, alpha=0.05)
    assert c.plans[0].docs == int(want.total) and 0 < c.plans[0].docs <= DOCS


def test_cell_seconds_are_load_plus_docs_at_the_measured_rate(result):
    for cell in result.cells:
        t = TIMINGS[cell.cell]
        assert cell.docs_scored == DOCS and cell.device == "NVIDIA H200"
        assert cell.rate == pytest.approx(DOCS / t["eval_s"])
        for i in range(len(result.powers)):
            docs = sum(task.docs_to_score[i] for task in result.tasks)
            expected = sum(task.expected_to_score[i] for task in result.tasks)
            assert cell.docs[i] == docs and cell.seconds[i] == pytest.approx(t["load_s"] + docs / cell.rate)
            assert cell.expected_seconds[i] == pytest.approx(t["load_s"] + expected / cell.rate)
    slowest = max(result.cells, key=lambda c: c.seconds[0])
    assert result.summary()["slowest_cell"] == slowest.cell == "hf-fp32"
    assert f"{slowest.seconds[0]:,.0f} s per cell (slowest cell hf-fp32)" in result.summary()["line"]


def test_the_cli_prints_and_writes_the_plan(run, result):
    code, out, err = tamper.run_cli(["plan", str(run)])
    assert code == 0, err[-3000:]
    assert out.strip() == result.summary()["line"]  # stdout: the summary line alone
    assert "rates measured in this run on its device (NVIDIA H200)" in " ".join(err.split())
    data = json.loads((run / planning.PLAN_FILE).read_text())
    assert data["schema"] == "evalparity.plan/1" and data["powers"] == [0.8, 0.9] and data["alpha"] == 0.05
    assert set(data) >= {"run_dir", "comparisons", "cells", "summary"}
    c = next(x for x in data["comparisons"] if x["cell"] == "vllm-fp32")
    assert c["unit"] == "fraction" and c["discordance"] == 0.02 and c["difference"] == 0.0
    for key in ("n", "reference_only", "cell_only", "docs_available", "docs_in_task"):
        assert type(c[key]) is int, key
    assert all(type(p["docs"]) is int and type(p["expected_docs"]) is int for p in c["plans"])
    assert all(type(x["docs_scored"]) is int for x in data["cells"])
    assert data["summary"]["line"] == result.summary()["line"]
    # piped, as in a CI log (an 80-column console), the tables keep every number whole (was: "4,…")
    assert "…" not in err and all(f"{x['docs_scored']:,}" in err for x in data["cells"]), err
    again = tamper.run_cli(["plan", str(run)])  # its own plan.json is replaced, the run's lock is free again
    assert again[0] == 0 and not (run / ".evalparity.lock").exists()


def _one_line_error(code: int, err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and "Traceback" not in err, (code, err)
    assert lines[-1].startswith("error:") and sum(ln.startswith("error:") for ln in lines) == 1, err
    return lines[-1]


def test_a_tampered_run_is_refused_in_one_line(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / planning.PLAN_FILE).unlink(missing_ok=True)
    tamper.apply(copy, ("table_edit_value", (1, 7, 0)), tmp_path / "none", tmp_path / "outside")
    line = _one_line_error(*tamper.run_cli(["plan", str(copy)])[::2])
    assert "samples.parquet" in line and "not the table its cell wrote" in line
    assert not (copy / planning.PLAN_FILE).exists()
    line = _one_line_error(*tamper.run_cli(["plan", str(tmp_path / "nothing")])[::2])
    assert "is not a run directory" in line


def test_bad_json_paths_and_powers_are_refused_before_anything_runs(run, tmp_path):
    (tmp_path / "file").write_text("x")
    for args, needle in ((["--json", str(tmp_path / "file" / "plan.json")], "does not exist"),
                         (["--json", str(tmp_path)], "is a directory"),
                         (["--json", str(run / "spec.json")], "not a plan"),
                         (["--json", str(run / "cells" / "x.json")], "inside the run's folders"),
                         (["--power", "1.5"], "is not a power")):
        line = _one_line_error(*tamper.run_cli(["plan", str(run), *args])[::2])
        assert needle in line, (args, line)
    assert json.loads((run / "spec.json").read_text())["model"] == "synthetic"


def test_only_non_binary_gating_metrics_are_refused_saying_so(tmp_path):
    root = planted_run(tmp_path / "run", n_docs=200, flips={"vllm-fp32": (3, 2)}, metric="score")
    line = _one_line_error(*tamper.run_cli(["plan", str(root), "--margin", "1pp,score=0.05"])[::2])
    assert "score" in line and "binary" in line
    line = _one_line_error(*tamper.run_cli(["plan", str(root)])[::2])  # no margin for it: nothing gates
    assert "no gating comparison" in line


def test_a_group_is_planned_pooled_with_its_members_docs_summed(tmp_path):
    """A group's pooled comparison gates (not its members): its docs are its member tasks' together, each
    capped by the run's per-task limit (``RunSpec.samples``)."""
    leaves = {f"mmlu_subject_{i:02d}": 1000 + i for i in range(3)}
    root = planted_run(tmp_path / "run", n_docs=300, n_tasks=3, flips={"vllm-fp32": (9, 9)}, leaf_docs=leaves,
                       task_limits={"mmlu": 300})
    result = planning.build_plan(root, StatsOptions(), (0.8,))
    assert {(c.task, c.level) for c in result.comparisons} == {("mmlu", "group")}
    c = _one(result, "vllm-fp32")
    assert c.n == 900 and c.discordance == pytest.approx(18 / 900)
    assert (c.docs_available, c.docs_in_task) == (900, sum(leaves.values()))
    assert result.tasks[0].docs_to_score == (c.plans[0].docs,) and all(x.rate is None for x in result.cells)
    assert "GPU time unknown" in result.summary()["line"]
