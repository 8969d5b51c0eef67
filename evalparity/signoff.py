"""The end of every verb that signs off (``run``, ``report``, ``compare``): which cell is the reference, whether
there is anything to compare, the statistics and the report published together, and the exit code.

Why a module of its own: these are rules about a run folder's verdicts, not about a command line. They lived
in ``cli/run.py`` and ``cli/report.py``, so ``run`` and ``compare`` called into the ``report`` verb's module;
here every verb (and a test) reaches them the same way, and the CLI only prints what they return.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from evalparity import config, rundir, variants
from evalparity.errors import EXIT_CELL_FAILED, EvalParityError
from evalparity.rundir import layout, records
from evalparity.runlog import RunLog
from evalparity.stats.options import StatsOptions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SignOff:
    """What the statistics decided, and where it is written."""

    status: str  # PASS, FAIL, INCONCLUSIVE, INCOMPLETE
    reason: str
    code: int  # the exit code the sign-off asks for
    html: Path  # report.html in the run folder
    verdicts: Path  # verdicts.json in the run folder


def choose_reference(opts: StatsOptions, cells: Sequence[str], *, fallback: bool) -> StatsOptions:
    """``opts`` with a reference that is one of ``cells``, and its ``--compare`` pairs checked against them
    (``check_pairs``). When the reference is none of them and was not asked for (``fallback``: ``run``'s
    default hf-fp32, ``compare``'s none), the first cell, so that a run without that cell still compares (a
    warning says so when a name was replaced); a reference asked for and absent is an error, before any cell
    runs."""
    if opts.reference not in cells:
        if not fallback:
            raise EvalParityError(f"--reference {opts.reference} is not a cell of this run: use one of "
                                  f"{', '.join(cells)}")
        if opts.reference:
            logger.warning(f"{opts.reference} is not in this run: comparing against {cells[0]}")
        opts = opts.with_reference(cells[0])
    check_pairs(opts, cells)
    return opts


def check_pairs(opts: StatsOptions, cells: Sequence[str]) -> None:
    """Each ``--compare A:B`` names two cells of the run (``variants.check_pair``: one line listing them)
    and is not a comparison the run makes anyway: every cell is compared with the reference, so a pair
    with the reference on either side repeats one (or mirrors it) and would gate twice on the same docs.
    Called before any cell starts (``choose_reference``) and, by ``report`` and ``plan``, against the run
    folder's cells (``run_cells``)."""
    for a, b in opts.pairs:
        variants.check_pair(a, b, list(cells))
        if opts.reference in (a, b):
            other = b if a == opts.reference else a
            raise EvalParityError(f"--compare {a}:{b}: every cell is already compared with the reference "
                                  f"{opts.reference}, {other} too: drop this --compare (or pass --reference "
                                  "to compare against another cell)")


def run_cells(run_dir: Path) -> list[str]:
    """The cells a run folder names (its spec.json, or an ``evalparity compare``'s compare.json), in their
    order; [] when it has neither (the statistics refuse such a folder in one line of their own)."""
    if layout.spec_file(run_dir).exists():
        return [c.name for c in records.read_spec(run_dir).cells]
    if layout.compare_file(run_dir).exists():
        return list(records.read_compare(run_dir).names)
    return []


def enough_cells(finished: Collection[str], reference: str) -> bool:
    """Whether the statistics have something to compare: two finished cells, the reference among them."""
    return len(finished) >= 2 and reference in finished


def exit_code(failed: Collection[str], code: int) -> int:
    """The sign-off's code, unless it passed while some cell failed: then 5, so CI never reads a PASS over
    cells that did not run."""
    return EXIT_CELL_FAILED if failed and code == 0 else code


def stats_and_report(run_dir: Path, opts: StatsOptions, fail_on_inconclusive: bool,
                     timings: RunLog | None = None) -> SignOff:
    """Statistics and report, written into a staging folder and published together (``rundir.staged_outputs``):
    a full disk or a kill midway leaves the previous ``stats/`` and ``report/`` as they were, never a new
    ``report.md`` beside an old ``report.html``. A failed write is one line, exit 2."""
    # heavy: pandas, scipy, statsmodels, jinja2 (the statistics and the report)
    from evalparity import cells
    from evalparity.report import write_report
    from evalparity.stats.compare import compute

    timings = timings or RunLog()
    rundir.recover_outputs(run_dir)  # a report whose publish a kill interrupted is finished first
    cells.check_readable(run_dir)
    try:
        with rundir.staged_outputs(run_dir, (config.STATS, config.REPORT)) as stage:
            logger.info("statistics ...")
            with timings.stage("statistics"):
                result = compute(stage, opts, source=run_dir)
            logger.info("report ...")
            with timings.stage("report"):
                html = run_dir / Path(write_report(stage)["html"]).relative_to(stage)
    except EvalParityError as err:  # messages name the run directory, not the staging folder
        raise EvalParityError(str(err).replace(str(stage), str(run_dir)), err.exit_code) from None
    except OSError as err:
        raise EvalParityError(f"could not write the statistics and report into {run_dir} "
                              f"({err.strerror or err}): free space or make it writable, then rerun "
                              f"`evalparity report {run_dir}` (the previous report, if any, is unchanged)") from None
    return SignOff(result.sign_off, result.reason, result.exit_code(fail_on_inconclusive), html,
                   layout.verdicts_file(run_dir))
