"""The report: statistics over a synthetic 60-task x 6-cell group (its look in a browser: test_report_look)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from synthetic import make_run

from evalparity.errors import EXIT_DIFFERENT, EXIT_INCONCLUSIVE
from evalparity.report import write_report
from evalparity.samples import KEY, read_table
from evalparity.stats.compare import StatsOptions, compute

CELLS = ["hf-fp32", "hf-bf16", "hf-fp16", "vllm-fp32", "vllm-bf16", "vllm-fp16"]


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    root = make_run(tmp_path_factory.mktemp("big") / "run", n_tasks=60, cells=CELLS, docs_per_task=40,
                    drift={"vllm-fp16": 0.08})
    summary = compute(root, StatsOptions())
    paths = write_report(root)
    return root, summary, paths


def test_group_verdict_first_members_folded(big_run):
    root, summary, paths = big_run
    v = json.loads((root / "stats" / "verdicts.json").read_text())
    gating = [r for r in v["comparisons"] if r["gating"]]
    # One pooled comparison per cell gates (the group); the 60 members are shown but do not gate.
    assert {(r["task"], r["level"]) for r in gating} == {("mmlu", "group")}
    assert len(gating) == 5
    fp16 = next(r for r in gating if r["cell"] == "vllm-fp16")
    assert fp16["verdict"] == "DIFFERENT"
    assert summary.sign_off == "FAIL" and summary.exit_code() == EXIT_DIFFERENT
    md = paths["md"].read_text()
    assert md.index("| mmlu |") < md.index("<details><summary>mmlu: 60 member tasks")


def test_exit_codes_for_each_outcome(tmp_path):
    passing = make_run(tmp_path / "pass", n_tasks=2, cells=["hf-fp32", "vllm-fp32"], docs_per_task=1500)
    s = compute(passing, StatsOptions())
    assert s.sign_off == "PASS" and s.exit_code() == 0
    small = make_run(tmp_path / "small", n_tasks=1, cells=["hf-fp32", "vllm-fp32"], docs_per_task=30)
    s = compute(small, StatsOptions())
    assert s.sign_off == "INCONCLUSIVE" and s.exit_code() == EXIT_INCONCLUSIVE and s.exit_code(False) == 0
    different = make_run(tmp_path / "diff", n_tasks=1, cells=["hf-fp32", "vllm-fp32"], docs_per_task=800,
                         drift={"vllm-fp32": 0.2})
    s = compute(different, StatsOptions())
    assert s.sign_off == "FAIL" and s.exit_code() == EXIT_DIFFERENT


def test_cli_report_exit_code_matches_sign_off(big_run):
    from conftest import evalparity

    root, summary, _ = big_run
    proc = evalparity("report", str(root))
    assert proc.returncode == EXIT_DIFFERENT, proc.stderr
    assert proc.stdout.startswith("FAIL:")


def test_delta_histogram_is_in_stats_and_the_figure_needs_no_cell_tables(big_run, tmp_path):
    root, _, _ = big_run
    hist = pd.read_parquet(root / "stats" / "delta_histogram.parquet")
    ref = read_table(root / "cells" / "hf-fp32" / "samples.parquet")
    fp16 = read_table(root / "cells" / "vllm-fp16" / "samples.parquet")
    assert hist.loc[hist["cell"] == "vllm-fp16", "count"].sum() == len(ref.merge(fp16, on=KEY)) == len(ref)
    # the report stage redraws it from stats/ alone: a copy without any cell table still gets the figure
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("samples.parquet", "*.png"))
    paths = write_report(copy)
    assert (copy / "report" / "figures" / "delta_loglikelihood.png").stat().st_size > 5_000
    assert "figures/delta_loglikelihood.png" in paths["md"].read_text()
