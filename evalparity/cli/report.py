"""``evalparity report``: the statistics and the report of a run directory, again."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from evalparity import rundir, signoff
from evalparity.cli.finish import finish
from evalparity.cli.options import Outputs, Statistics, verb
from evalparity.errors import EvalParityError
from evalparity.rundir import layout


@verb
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `evalparity run` or `compare`.")],
    stats: Statistics,
    outputs: Outputs,
) -> None:
    """Recompute the statistics of a run directory and write report.md, report.html and verdicts.json."""

    if not any(p.exists() for p in (layout.spec_file(run_dir), layout.compare_file(run_dir), layout.cells_dir(run_dir))):
        raise EvalParityError(f"{run_dir} is not a run directory (no spec.json, compare.json or cells/): give the --out "
                              "of a run")
    opts = stats.options()
    if opts.pairs:  # --compare names cells of this run folder, checked before anything is computed
        signoff.check_pairs(opts, signoff.run_cells(run_dir))
    outputs.check(run_dir)
    with rundir.acquire(run_dir, create=False, flag="run directory"):
        raise typer.Exit(finish(run_dir, opts, outputs))
