"""``evalparity compare``: plain ``lm_eval --log_samples`` outputs become the cells of a run directory
(``importer``), then the same statistics and report as ``run``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from evalparity import rundir, signoff
from evalparity.cli.finish import finish
from evalparity.cli.options import CompareStatistics, Outputs, verb
from evalparity.errors import EvalParityError


@verb
def compare(
    paths: Annotated[list[Path], typer.Argument(help="lm-eval output directories (--log_samples), one per cell; DIR@START picks one run where lm-eval wrote several into DIR (START: the stamp in its results_<START>.json).")],
    *,
    name: Annotated[list[str] | None, typer.Option(help="Cell names, one per PATH, in order.")] = None,
    out: Annotated[Path | None, typer.Option(help="Run directory to write. Default: results/compare-<timestamp>.")] = None,
    stats: CompareStatistics,
    outputs: Outputs,
) -> None:
    """Compare existing lm-eval outputs (any model type) without rerunning anything."""
    from evalparity.importer import import_lm_eval_dirs  # heavy: pandas (importer -> samples)

    if len(paths) < 2:
        raise EvalParityError("compare needs at least two lm-eval output directories")
    rundir.check_names(name or [], "--name")
    # Checked before anything is written; the reference, by default the first cell, is known after the import.
    opts = stats.options()
    run_dir = out or Path("results") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    outputs.check(run_dir)
    with rundir.acquire(run_dir):
        names = import_lm_eval_dirs(paths, name or [], run_dir)
        opts = signoff.choose_reference(opts, names, fallback=stats.reference is None)
        raise typer.Exit(finish(run_dir, opts, outputs))
