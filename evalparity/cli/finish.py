"""What ``run``, ``report`` and ``compare`` end with, printed: the statistics and the report (``signoff``),
then the verdict table, the sign-off line and the CI outputs. Shared here, so that no verb calls another
verb's module."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text

from evalparity import signoff
from evalparity.cli.options import Outputs, ci_output_problem
from evalparity.cli.output import console, safe, sign_off
from evalparity.printable import visible
from evalparity.runlog import RunLog
from evalparity.stats.options import StatsOptions


def finish(run_dir: Path, opts: StatsOptions, outputs: Outputs, timings: RunLog | None = None) -> int:
    """The statistics and report of ``run_dir`` (``signoff.stats_and_report``); then the verdict table, the
    sign-off (its line goes to stdout, for scripts, and from then on its code is the command's:
    ``output.sign_off``), and the CI outputs: ``--junit-xml`` and ``--summary-md`` when given (the verb
    checked them with ``Outputs.check``), the summary appended to ``$GITHUB_STEP_SUMMARY`` when that is set;
    one that cannot be written is a warning line, never a change of the exit code. Returns that code."""
    result = signoff.stats_and_report(run_dir, opts, outputs.fail_on_inconclusive, timings)
    show_verdicts(result.verdicts)
    sign_off(result.status, result.reason, result.html, result.code)  # its line always reaches stdout
    ci_outputs(run_dir, result, outputs)
    return result.code


def show_verdicts(verdicts_file: Path) -> None:
    """The verdict table on the console (``cli.verdict_table``), from ``verdicts.json`` as written; a table
    that cannot be drawn is a warning, never a changed sign-off."""
    from evalparity.cli.verdict_table import print_verdicts
    from evalparity.files import read_json

    verdicts = read_json(verdicts_file)
    if not isinstance(verdicts, dict):
        return
    try:
        print_verdicts(console, verdicts)
    except Exception as err:  # noqa: BLE001 - the sign-off below is what counts
        console.print(f"[yellow]warning: the verdict table could not be drawn ({safe(type(err).__name__)})[/yellow]")


def ci_outputs(run_dir: Path, result: signoff.SignOff, outputs: Outputs) -> None:
    """The JUnit file and the markdown summary, from ``verdicts.json`` as written, after the sign-off; the
    summary appended to ``$GITHUB_STEP_SUMMARY`` where the options' own rules allow it there
    (``ci_output_problem``: never into the run's verified folders or records), else a warning line."""
    from evalparity.report.ci import STEP_SUMMARY_ENV, step_summary_path, write_ci_outputs

    lines, step = [], step_summary_path()
    problem = ci_output_problem(run_dir, f"${STEP_SUMMARY_ENV}", step) if step else None
    if problem:
        lines.append(f"{problem}; the summary was not appended there, the sign-off above stands")
        step = None
    lines += write_ci_outputs(result.verdicts, junit_xml=outputs.junit_xml, summary_md=outputs.summary_md,
                              report=result.html, fail_on_inconclusive=outputs.fail_on_inconclusive,
                              step_summary=step)
    for line in lines:
        try:
            console.print(Text.assemble(("warning:", "yellow"), " ", visible(line)), soft_wrap=True, highlight=False)
        except Exception:  # noqa: BLE001 - the console is a courtesy, as for the sign-off
            pass
