"""Options that more than one verb takes, each declared once as a ``typing.Annotated`` type, with its default
taken from the one place that owns it: a verb writes ``alpha: Alpha = STATS.alpha`` and gets the same flag,
help text and default as every other verb.

Checking. Ranges and choices are checked by the code that owns them (``StatsOptions``, ``spec``'s parsers,
``devices.resolve_device``) and, for what only the command line knows, in each verb's ``check_arguments``;
a bad value is an ``EvalParityError``, one line saying how to fix it, exit 2 (``cli.main``). typer's
``min``/``max`` and enums are not used: they would add ``[x>=1]`` and choice lists to ``--help`` and answer a
bad value with click's generic "Invalid value" instead (tests/test_cli_errors.py asserts the messages).
The helpers at the end (``at_least``, ``check_seed``, ``positive_finite``) are those checks' shared wording.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated

import typer

from evalparity import config
from evalparity.errors import EvalParityError
from evalparity.rundir import layout
from evalparity.stats.options import MARGIN as MARGIN  # re-exported: --margin's default, as typed
from evalparity.stats.options import StatsOptions

STATS = StatsOptions()  # the statistics defaults (stats/options.py)

# ------------------------------------------------------------------ statistics: run, report, compare
Reference = Annotated[str, typer.Option(rich_help_panel="Statistics", help="Reference cell every other cell is compared to.")]
Margin = Annotated[str, typer.Option(rich_help_panel="Statistics", help="Equivalence margin for proportion metrics: 1pp, 1% or 0.01 (one point); "
                                          "per metric: acc=1pp,perplexity=0.05 (non-proportion metrics gate only "
                                          "with a margin of their own).")]
LlTolerance = Annotated[float, typer.Option(rich_help_panel="Statistics", help="Tolerance for the mean |Δ loglikelihood| per request (nats).")]
Alpha = Annotated[float, typer.Option(rich_help_panel="Statistics", help="Level of every test: EQUIVALENT needs the (1-2α) CI inside the margin.")]
Multiple = Annotated[str, typer.Option(rich_help_panel="Statistics", help="Control of DIFFERENT (beyond-margin) claims over the gating comparisons: "
                                            "holm (family-wise error rate), bh (false discovery rate: the expected "
                                            "share of false DIFFERENT claims), none (each comparison at α).")]
Direction = Annotated[str, typer.Option(rich_help_panel="Statistics", help="both: a change beyond the margin either way fails; worse: only a drop "
                                             "beyond it (non-inferiority).")]
Cluster = Annotated[bool, typer.Option(rich_help_panel="Statistics", help="A cluster score test over the member tasks of a group (docs of one "
                                            "subject are not independent).")]
GateLogprobs = Annotated[bool, typer.Option(rich_help_panel="Statistics", help="Let loglikelihood-shift verdicts gate the sign-off too.")]
FailOnInconclusive = Annotated[bool, typer.Option(rich_help_panel="Run folder and outputs", help="Exit non-zero when the sign-off is INCONCLUSIVE.")]
FAIL_ON_INCONCLUSIVE = True
JunitXml = Annotated[Path | None, typer.Option(rich_help_panel="Run folder and outputs", metavar="PATH", help="Also write the sign-off as a JUnit XML file: one "
                                               "testcase per gating comparison, one testsuite per task.")]
SummaryMd = Annotated[Path | None, typer.Option(rich_help_panel="Run folder and outputs", metavar="PATH", help="Also write a short markdown summary of the "
                                                "sign-off (for a PR comment); appended to $GITHUB_STEP_SUMMARY "
                                                "too, whenever that is set.")]

# ------------------------------------------------------------------ others shared by verbs
Device = Annotated[str, typer.Option(rich_help_panel="Cells", help="cpu, cuda or auto.")]
DatasetsDir = Annotated[str | None, typer.Option(rich_help_panel="Model and tasks", envvar="EVALPARITY_DATASETS_DIR",
                                                 help="Dataset mirror: DIR/<hub id>/<config>/<split>.jsonl.")]


def stats_options(*, reference: str, margin: str, ll_tolerance: float, alpha: float, multiple: str,
                  direction: str, cluster: bool, gate_logprobs: bool) -> StatsOptions:
    """The statistics options, checked (one line, exit 2, for anything out of range) before a verb starts
    anything: ``StatsOptions`` holds the rules, so ``run``, ``report`` and ``compare`` cannot disagree."""
    return StatsOptions.from_cli(reference=reference, margin=margin, ll_tolerance=ll_tolerance, alpha=alpha,
                                 multiple=multiple, cluster=cluster, gate_logprobs=gate_logprobs, direction=direction)


# lm-eval's own command-line spellings, for users who come from `lm_eval`: what evalparity calls each.
LMEVAL_SPELLINGS = {
    "--model_args": "--hf-args k=v,... and --vllm-args k=v,... (extra model arguments per backend; --model for "
                    "the model itself)",
    "--output_path": "--out DIR (the run folder)", "--num_fewshot": "--num-fewshot", "--batch_size": "--batch-size",
    "--log_samples": "nothing: every cell keeps its samples (cells/<cell>/lm_eval/)",
    "--include_path": "--include-path", "--gen_kwargs": "--max-gen-toks N (generation is greedy on every cell)",
    "--apply_chat_template": "--apply-chat-template", "--fewshot_as_multiturn": "--fewshot-as-multiturn",
    "--system_instruction": "--system-instruction", "--use_cache": "nothing: lm-eval's request cache is never used "
                                                                     "(its key ignores model and dtype)",
}


def lmeval_hint(message: str) -> str | None:
    """For click's "No such option: --x_y", the evalparity spelling of an lm-eval option, or None."""
    if not message.startswith("No such option: "):
        return None
    flag = message[len("No such option: "):].split()[0]
    hint = LMEVAL_SPELLINGS.get(flag)
    return f"{flag} is lm-eval's spelling: here it is {hint}" if hint else None


# The names evalparity writes at the top of a run folder (config's layout): never a CI output's.
RUN_RECORDS = frozenset({config.SPEC_FILE, config.COMPARE_FILE, config.RUN_FILE, config.PLAN_FILE, config.LOCK_NAME,
                         "ray.log", "ray-head.log"})


def check_ci_outputs(run_dir: Path, junit_xml: Path | None, summary_md: Path | None) -> None:
    """``--junit-xml`` and ``--summary-md``, checked before a verb starts anything. They may point anywhere
    the user chooses (their CI reads them there), but each must be a file in a folder that exists (the run
    folder itself counts: the verb creates it), not the same file twice, and not inside the run folder's
    ``cells/``, ``shards/`` or ``stages/``, whose contents a run verifies (a stray file there would make
    its next command refuse the run). One line, exit 2."""
    run = Path(os.path.realpath(run_dir))
    units = [Path(os.path.realpath(d(run_dir))) for d in (layout.cells_dir, layout.shards_dir, layout.stages_dir)]
    seen: dict[Path, str] = {}
    for flag, path in (("--junit-xml", junit_xml), ("--summary-md", summary_md)):
        if path is None:
            continue
        real = Path(os.path.realpath(path))  # realpath: a link loop is not an error here
        if str(path) in ("", ".") or real.is_dir():
            raise EvalParityError(f"{flag} {path} is a folder: give the path of a file, e.g. {flag} "
                                  f"{Path(path) / ('junit.xml' if flag == '--junit-xml' else 'summary.md')}")
        if not real.parent.is_dir() and real.parent != run:
            raise EvalParityError(f"{flag} {path}: the folder {Path(path).parent} does not exist: create it "
                                  "first, or give a path in an existing folder")
        for d in units:
            if real == d or d in real.parents:
                raise EvalParityError(f"{flag} {path} is inside the run folder's {d.name}/, which a run verifies "
                                      f"file by file: give a path outside it (e.g. {run_dir}/{real.name})")
        if run in real.parents and (real.parent != run or real.name in RUN_RECORDS):
            raise EvalParityError(f"{flag} {path} would overwrite what evalparity writes in the run folder: give "
                                  f"a file name of your own at its top (e.g. {run_dir}/junit.xml) or a path "
                                  "outside it")
        if real in seen:
            raise EvalParityError(f"{flag} {path} is the file {seen[real]} writes too: give each its own path")
        seen[real] = flag


# ------------------------------------------------------------------ ranges of numeric options
SEED_MAX = 2**32 - 1  # numpy takes seeds in [0, 2**32 - 1]; a cell given another fails in lm-eval's seeding


def at_least(flag: str, value: int | None, low: int, what: str = "") -> None:
    """An integer option (None: not given) is ``low`` or more, else one line naming the flag and the
    smallest value, exit 2; ``what`` says what the number counts, for the message."""
    if value is not None and value < low:
        raise EvalParityError(f"{flag} {value} must be at least {low}{f' ({what})' if what else ''}")


def check_seed(flag: str, seed: int) -> None:
    """A seed that numpy, torch and lm-eval all take."""
    if not 0 <= seed <= SEED_MAX:
        raise EvalParityError(f"{flag} {seed} is not a seed: give a whole number from 0 to {SEED_MAX}")


def positive_finite(flag: str, value: float, example: str) -> None:
    """A float option that must be a finite number above 0 (typer reads 'nan' and 'inf' as floats)."""
    if not (math.isfinite(value) and value > 0):
        raise EvalParityError(f"{flag} {value:g} must be a finite number above 0, e.g. {flag} {example}")
