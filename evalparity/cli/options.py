"""The command line's options, each declared once, and the mechanism that lets verbs share them.

Options come in groups (``dataclasses``): each field is one option, its type an ``Annotated[..., typer.Option]``
that holds its flag, help text and panel, its default the field's, taken from the one place that owns it. A
verb names the groups it takes as parameters (``stats: Statistics``); ``verb`` spreads their fields into the
signature typer reads, and hands the verb each group built from what was typed. Adding an option is one field
plus the code that reads it; a group that several verbs take (``Statistics``, ``Outputs`` here; ``run``'s own
in ``cli/run.py``) is declared once for all of them.

Checking. Ranges and choices are checked by the code that owns them (``StatsOptions``, ``spec``'s parsers,
``devices.resolve_device``) and, for what only the command line knows, in each verb's ``check_arguments``;
a bad value is an ``EvalParityError``, one line saying how to fix it, exit 2 (``cli.main``). typer's
``min``/``max`` and enums are not used: they would add ``[x>=1]`` and choice lists to ``--help`` and answer a
bad value with click's generic "Invalid value" instead (tests/test_cli_errors.py asserts the messages).
The helpers at the end (``at_least``, ``check_seed``, ``positive_finite``) are those checks' shared wording.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from evalparity import config
from evalparity.errors import EvalParityError
from evalparity.rundir import layout
from evalparity.stats.options import MARGIN as MARGIN  # re-exported: --margin's default, as typed
from evalparity.stats.options import StatsOptions

STATS = StatsOptions()  # the statistics defaults (stats/options.py)
STATISTICS, OUTPUTS = "Statistics", "Run folder and outputs"  # help panels


# ------------------------------------------------------------------ groups of options, spread into a verb
def is_group(annotation: object) -> bool:
    """Whether a verb's parameter is a group of options (a dataclass) rather than one option."""
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def verb(func: Callable[..., None]) -> Callable[..., None]:
    """``func`` as typer should see it: each parameter annotated with a group (a dataclass of options)
    replaced by the group's fields, one option each, in their order; called, it gets each group built from
    its fields' values. The other parameters (arguments, a verb's own options) pass through as they are.
    Two groups that declare the same option (or an option named like a group) are a programming error,
    raised at import."""
    hints = typing.get_type_hints(func, include_extras=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, type] = {}
    for p in inspect.signature(func).parameters.values():
        annotation = hints.get(p.name, p.annotation)
        if not is_group(annotation):
            params.append(p.replace(annotation=annotation, kind=inspect.Parameter.KEYWORD_ONLY))
            continue
        groups[p.name] = annotation
        fields = typing.get_type_hints(annotation, include_extras=True)
        params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                     annotation=fields[f.name]) for f in dataclasses.fields(annotation)]
    names = [p.name for p in params] + list(groups)  # a group's name is a keyword of the call too
    if len(set(names)) != len(names):
        raise TypeError(f"{func.__name__}: a name declared twice: {sorted({n for n in names if names.count(n) > 1})}")

    @functools.wraps(func)
    def spread(**values):
        built = {name: group(**{f.name: values.pop(f.name) for f in dataclasses.fields(group)})
                 for name, group in groups.items()}
        return func(**values, **built)

    spread.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    spread.__annotations__ = {p.name: p.annotation for p in params}
    return spread


@dataclass(frozen=True)
class Statistics:
    """The statistics options: ``run``, ``report`` and ``plan`` (``compare``: ``CompareStatistics``)."""

    reference: Annotated[str, typer.Option(rich_help_panel=STATISTICS, help="Reference cell every other cell is compared to.")] = STATS.reference
    margin: Annotated[str, typer.Option(rich_help_panel=STATISTICS, help="Equivalence margin for proportion metrics: 1pp, 1% or 0.01 (one point); per metric: acc=1pp,perplexity=0.05 (non-proportion metrics gate only with a margin of their own).")] = MARGIN
    ll_tolerance: Annotated[float, typer.Option(rich_help_panel=STATISTICS, help="Tolerance for the mean |Δ loglikelihood| per request (nats).")] = STATS.ll_tolerance
    alpha: Annotated[float, typer.Option(rich_help_panel=STATISTICS, help="Level of every test: EQUIVALENT needs the (1-2α) CI inside the margin.")] = STATS.alpha
    multiple: Annotated[str, typer.Option(rich_help_panel=STATISTICS, help="Control of DIFFERENT (beyond-margin) claims over the gating comparisons: holm (family-wise error rate), bh (false discovery rate: the expected share of false DIFFERENT claims), none (each comparison at α).")] = STATS.multiple
    direction: Annotated[str, typer.Option(rich_help_panel=STATISTICS, help="both: a change beyond the margin either way fails; worse: only a drop beyond it (non-inferiority).")] = STATS.direction
    cluster: Annotated[bool, typer.Option(rich_help_panel=STATISTICS, help="A cluster score test over the member tasks of a group (docs of one subject are not independent).")] = STATS.cluster
    gate_logprobs: Annotated[bool, typer.Option(rich_help_panel=STATISTICS, help="Let loglikelihood-shift verdicts gate the sign-off too.")] = STATS.gate_logprobs
    compare: Annotated[list[str] | None, typer.Option("--compare", rich_help_panel=STATISTICS, metavar="A:B", help="Also compare cell B against cell A (repeatable), gating like the comparisons against the reference; e.g. vllm-bf16:vllm-fp8 shows what that one setting changes.")] = None

    def options(self) -> StatsOptions:
        """The statistics options, checked (one line, exit 2, for anything out of range) before a verb starts
        anything: ``StatsOptions`` holds the rules, so that no two verbs can disagree."""
        return StatsOptions.from_cli(**{**dataclasses.asdict(self), "reference": self.reference or ""})


@dataclass(frozen=True)
class CompareStatistics(Statistics):
    """``compare``'s: the same, but its reference defaults to the first lm-eval output it is given."""

    reference: Annotated[str | None, typer.Option(help="Reference cell (default: the first PATH).")] = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Outputs:
    """What a verb that signs off writes besides the run folder, and how its exit code treats INCONCLUSIVE:
    ``run``, ``report`` and ``compare``."""

    fail_on_inconclusive: Annotated[bool, typer.Option(rich_help_panel=OUTPUTS, help="Exit non-zero when the sign-off is INCONCLUSIVE.")] = True
    junit_xml: Annotated[Path | None, typer.Option(rich_help_panel=OUTPUTS, metavar="PATH", help="Also write the sign-off as a JUnit XML file: one testcase per gating comparison, one testsuite per task.")] = None
    summary_md: Annotated[Path | None, typer.Option(rich_help_panel=OUTPUTS, metavar="PATH", help="Also write a short markdown summary of the sign-off (for a PR comment); appended to $GITHUB_STEP_SUMMARY too, whenever that is set.")] = None

    def check(self, run_dir: Path) -> None:
        """The two paths, checked against ``run_dir`` before the verb starts anything (``check_ci_outputs``)."""
        check_ci_outputs(run_dir, self.junit_xml, self.summary_md)


# ------------------------------------------------------------------ single options more than one verb takes
Device = Annotated[str, typer.Option(rich_help_panel="Cells", help="cpu, cuda or auto.")]
DatasetsDir = Annotated[str | None, typer.Option(rich_help_panel="Model and tasks", envvar="EVALPARITY_DATASETS_DIR",
                                                 help="Dataset mirror: DIR/<hub id>/<config>/<split>.jsonl.")]


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
    """``--junit-xml`` and ``--summary-md``, checked before a verb starts anything (``ci_output_problem``),
    and not the same file twice. One line, exit 2."""
    seen: dict[Path, str] = {}
    for flag, path in (("--junit-xml", junit_xml), ("--summary-md", summary_md)):
        if path is None:
            continue
        problem = ci_output_problem(run_dir, flag, path)
        if problem:
            raise EvalParityError(problem)
        real = Path(os.path.realpath(path))
        if real in seen:
            raise EvalParityError(f"{flag} {path} is the file {seen[real]} writes too: give each its own path")
        seen[real] = flag


def ci_output_problem(run_dir: Path, flag: str, path: Path | str) -> str | None:
    """Why a CI output (``--junit-xml``, ``--summary-md``, ``$GITHUB_STEP_SUMMARY``) may not be written at
    ``path``, in one line naming the fix; None where it may. They may point anywhere the user chooses (their
    CI reads them there), but each must be a file in a folder that exists (the run folder itself counts: the
    verb creates it), and not inside the run folder's ``cells/``, ``shards/`` or ``stages/``, whose contents a
    run verifies (a stray file there, or a line appended to a sealed table, would make its next command
    refuse the run), nor one of the records at its top."""
    run = Path(os.path.realpath(run_dir))
    units = [Path(os.path.realpath(d(run_dir))) for d in (layout.cells_dir, layout.shards_dir, layout.stages_dir)]
    real = Path(os.path.realpath(path))  # realpath: a link loop is not an error here
    if str(path) in ("", ".") or real.is_dir():
        return (f"{flag} {path} is a folder: give the path of a file, e.g. {flag} "
                f"{Path(path) / ('junit.xml' if flag == '--junit-xml' else 'summary.md')}")
    if not real.parent.is_dir() and real.parent != run:
        return (f"{flag} {path}: the folder {Path(path).parent} does not exist: create it first, or give a path "
                "in an existing folder")
    for d in units:
        if real == d or d in real.parents:
            return (f"{flag} {path} is inside the run folder's {d.name}/, which a run verifies file by file: give "
                    f"a path outside it (e.g. {run_dir}/{real.name})")
    if run in real.parents and (real.parent != run or real.name in RUN_RECORDS):
        return (f"{flag} {path} would overwrite what evalparity writes in the run folder: give a file name of your "
                f"own at its top (e.g. {run_dir}/junit.xml) or a path outside it")
    return None


# ------------------------------------------------------------------ ranges of numeric options
SEED_MAX = 2**32 - 1  # numpy takes seeds in [0, 2**32 - 1]; a cell given another fails in lm-eval's seeding


def parse_layers(text: str) -> list[int] | None:
    """``--layers`` of ``drift`` and ``hidden``: None for all, else hidden-state entries as integers (0 the
    embeddings, negatives from the end; checked against the model in the worker)."""
    if text.strip().lower() == "all":
        return None
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise EvalParityError(f"--layers {text!r} is not a comma-separated list of integers (e.g. 10,20,-1) "
                              "or all") from None
    if not out:
        raise EvalParityError("--layers is empty: give entries such as 10,20,-1, or all")
    return out


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
