"""``evalparity compare``: plain ``lm_eval --log_samples`` outputs become the cells of a run directory
(``importer``), then the same statistics and report as ``run``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from evalparity import rundir
from evalparity.cli.options import (
    FAIL_ON_INCONCLUSIVE,
    MARGIN,
    STATS,
    Alpha,
    Cluster,
    Direction,
    FailOnInconclusive,
    GateLogprobs,
    JunitXml,
    LlTolerance,
    Margin,
    Multiple,
    SummaryMd,
    check_ci_outputs,
    stats_options,
)
from evalparity.cli.report import stats_and_report
from evalparity.errors import EvalParityError


def compare(
    paths: Annotated[list[Path], typer.Argument(help="lm-eval output directories (--log_samples), one per cell; DIR@START picks one run where lm-eval wrote several into DIR (START: the stamp in its results_<START>.json).")],
    name: Annotated[list[str] | None, typer.Option(help="Cell names, one per PATH, in order.")] = None,
    out: Annotated[Path | None, typer.Option(help="Run directory to write. Default: results/compare-<timestamp>.")] = None,
    reference: Annotated[str | None, typer.Option(help="Reference cell (default: the first PATH).")] = None,
    margin: Margin = MARGIN,
    ll_tolerance: LlTolerance = STATS.ll_tolerance,
    alpha: Alpha = STATS.alpha,
    multiple: Multiple = STATS.multiple,
    direction: Direction = STATS.direction,
    cluster: Cluster = STATS.cluster,
    gate_logprobs: GateLogprobs = STATS.gate_logprobs,
    fail_on_inconclusive: FailOnInconclusive = FAIL_ON_INCONCLUSIVE,
    junit_xml: JunitXml = None,
    summary_md: SummaryMd = None,
) -> None:
    """Compare existing lm-eval outputs (any model type) without rerunning anything."""
    from evalparity.importer import import_lm_eval_dirs  # heavy: pandas (importer -> samples)

    if len(paths) < 2:
        raise EvalParityError("compare needs at least two lm-eval output directories")
    for n in name or []:
        rundir.check_name(n, "--name")
    # Checked before anything is written; the reference, by default the first cell, is known after the import.
    opts = stats_options(reference=reference or "", margin=margin, ll_tolerance=ll_tolerance, alpha=alpha,
                         multiple=multiple, direction=direction, cluster=cluster, gate_logprobs=gate_logprobs)
    run_dir = out or Path("results") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    check_ci_outputs(run_dir, junit_xml, summary_md)
    with rundir.acquire(run_dir):
        names = import_lm_eval_dirs(paths, name or [], run_dir)
        opts = opts.with_reference(reference or names[0])
        if opts.reference not in names:
            raise EvalParityError(f"--reference {opts.reference} is not one of the cells {', '.join(names)}")
        raise typer.Exit(stats_and_report(run_dir, opts, fail_on_inconclusive, junit_xml=junit_xml,
                                          summary_md=summary_md))
