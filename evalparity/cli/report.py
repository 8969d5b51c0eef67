"""``evalparity report``: the statistics and the report of a run directory, again; and the statistics-and-report
step that ``run`` and ``compare`` end with too."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from evalparity import config, rundir
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
    Reference,
    SummaryMd,
    check_ci_outputs,
    stats_options,
)
from evalparity.cli.output import console, safe, sign_off
from evalparity.errors import EvalParityError
from evalparity.printable import visible
from evalparity.rundir import layout
from evalparity.runlog import RunLog


def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `evalparity run` or `compare`.")],
    reference: Reference = STATS.reference,
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
    """Recompute the statistics of a run directory and write report.md, report.html and verdicts.json."""

    if not any(p.exists() for p in (layout.spec_file(run_dir), layout.compare_file(run_dir), layout.cells_dir(run_dir))):
        raise EvalParityError(f"{run_dir} is not a run directory (no spec.json, compare.json or cells/): give the --out "
                              "of a run")
    opts = stats_options(reference=reference, margin=margin, ll_tolerance=ll_tolerance, alpha=alpha,
                         multiple=multiple, direction=direction, cluster=cluster, gate_logprobs=gate_logprobs)
    check_ci_outputs(run_dir, junit_xml, summary_md)
    with rundir.acquire(run_dir, create=False, flag="run directory"):
        raise typer.Exit(stats_and_report(run_dir, opts, fail_on_inconclusive, junit_xml=junit_xml,
                                          summary_md=summary_md))


def stats_and_report(run_dir: Path, opts, fail_on_inconclusive: bool, timings: RunLog | None = None, *,
                     junit_xml: Path | None = None, summary_md: Path | None = None) -> int:
    """Statistics and report, written into a staging folder and published together (``rundir.staged_outputs``):
    a full disk or a kill midway leaves the previous ``stats/`` and ``report/`` as they were, never a new
    ``report.md`` beside an old ``report.html``. A failed write is one line, exit 2. Returns the exit code
    of the sign-off; its line goes to stdout, for scripts, and from then on its code is the command's
    (``output.sign_off``). Then the CI outputs (``report.ci``): ``junit_xml`` and ``summary_md`` when given
    (the verb checked them with ``check_ci_outputs``), the summary appended to ``$GITHUB_STEP_SUMMARY``
    when that is set; one that cannot be written is a warning line, never a change of the exit code."""
    # heavy: pandas, scipy, statsmodels, jinja2 (the statistics and the report)
    from evalparity import cells
    from evalparity.report import write_report
    from evalparity.stats.compare import compute

    timings = timings or RunLog()
    rundir.recover_outputs(run_dir)  # a report whose publish a kill interrupted is finished first
    cells.check_readable(run_dir)
    try:
        with rundir.staged_outputs(run_dir, (config.STATS, config.REPORT)) as stage:
            console.print("statistics ...")
            with timings.stage("statistics"):
                result = compute(stage, opts, source=run_dir)
            console.print("report ...")
            with timings.stage("report"):
                paths = {k: run_dir / Path(v).relative_to(stage) for k, v in write_report(stage).items()}
    except EvalParityError as err:  # messages name the run directory, not the staging folder
        raise EvalParityError(str(err).replace(str(stage), str(run_dir)), err.exit_code) from None
    except OSError as err:
        raise EvalParityError(f"could not write the statistics and report into {run_dir} "
                              f"({err.strerror or err}): free space or make it writable, then rerun "
                              f"`evalparity report {run_dir}` (the previous report, if any, is unchanged)") from None
    code = result.exit_code(fail_on_inconclusive)
    show_verdicts(run_dir)
    sign_off(result.sign_off, result.reason, paths["html"], code)  # its line always reaches stdout
    ci_outputs(run_dir, paths["html"], fail_on_inconclusive, junit_xml, summary_md)
    return code


def show_verdicts(run_dir: Path) -> None:
    """The verdict table on the console (``cli.verdict_table``), from ``verdicts.json`` as written; a table
    that cannot be drawn is a warning, never a changed sign-off."""
    from evalparity.cli.verdict_table import print_verdicts
    from evalparity.files import read_json

    verdicts = read_json(layout.verdicts_file(run_dir))
    if not isinstance(verdicts, dict):
        return
    try:
        print_verdicts(console, verdicts)
    except Exception as err:  # noqa: BLE001 - the sign-off below is what counts
        console.print(f"[yellow]warning: the verdict table could not be drawn ({safe(type(err).__name__)})[/yellow]")


def ci_outputs(run_dir: Path, report: Path, fail_on_inconclusive: bool, junit_xml: Path | None,
               summary_md: Path | None) -> None:
    """The JUnit file and the markdown summary, from ``verdicts.json`` as written, after the sign-off."""
    from evalparity.report.ci import step_summary_path, write_ci_outputs

    for line in write_ci_outputs(layout.verdicts_file(run_dir), junit_xml=junit_xml, summary_md=summary_md,
                                 report=report, fail_on_inconclusive=fail_on_inconclusive,
                                 step_summary=step_summary_path()):
        try:
            console.print(Text.assemble(("warning:", "yellow"), " ", visible(line)), soft_wrap=True, highlight=False)
        except Exception:  # noqa: BLE001 - the console is a courtesy, as for the sign-off
            pass
