"""The report: statistics over a synthetic 60-task x 6-cell group, rendered in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from synthetic import make_run

from evalparity.errors import EXIT_DIFFERENT, EXIT_INCONCLUSIVE
from evalparity.report import write_report
from evalparity.samples import KEY, read_table
from evalparity.stats.compare import StatsOptions, compute

CELLS = ["hf-fp32", "hf-bf16", "hf-fp16", "vllm-fp32", "vllm-bf16", "vllm-fp16"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def render(html: Path, png: Path) -> str:
    """Open the page in headless Chromium, screenshot it, and return what the browser logged."""
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={png.parent / 'chromium-profile'}", "--enable-logging=stderr", "--v=0",
         "--window-size=1200,2200", "--virtual-time-budget=3000", f"--screenshot={png}", html.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert png.exists(), proc.stderr[-2000:]
    return proc.stderr


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


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="Debian's chromium is not installed")
def test_html_renders_in_chromium_without_errors(big_run, tmp_path):
    assert CHROMIUM, "chromium must be installed in CI (.ci/run installs it)"
    _, _, paths = big_run
    html = paths["html"]
    assert "http://" not in html.read_text() and "https://" not in html.read_text()  # self-contained
    png = tmp_path / "report.png"
    log = render(html, png)
    console = [line for line in log.splitlines() if "CONSOLE" in line]
    assert not [c for c in console if "missing image" in c or "Uncaught" in c], console
    assert png.stat().st_size > 20_000
    shutil.copy(png, Path(os.environ.get("EVALPARITY_SCREENSHOT", tmp_path / "keep.png")))


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_the_self_check_would_catch_a_broken_image(big_run, tmp_path):
    """The check can fail: a page with a corrupt image logs it, and we see it in the browser's log."""
    _, _, paths = big_run
    broken = tmp_path / "broken.html"
    broken.write_text(paths["html"].read_text().replace("data:image/png;base64,", "data:image/png;base64,AAAA", 1))
    log = render(broken, tmp_path / "b.png")
    assert "missing image" in log


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
