"""``evalparity plan``: how many docs, and how much GPU time, a sign-off needs, read off a pilot (or any
earlier) run folder.

Why: a pilot of a few hundred docs per task already shows how often each cell disagrees with the reference
(the discordance ψ), and how fast each cell scores on its device. That is all it takes to size the real run:
the staged planner (``stats.sequential.n_for_equivalence_staged``) turns ψ and the margin into the task size N
that settles EQUIVALENT with the power asked, and the docs E[docs] it is expected to score when tasks stop
early; each cell's measured rate turns docs into seconds. Nothing here is new statistics: the comparisons are
the product's own (``stats.compare.compute``, run into a temporary folder so that the run's ``stats/`` is not
touched), the plan is the staged planner's, the power with fewer docs the staged rule's exact probabilities
(``sequential.staged_probabilities``).

Planning is at Δ = 0 (the question "are they equivalent?"): a true difference makes EQUIVALENT harder and is
the report's ``n_needed`` at the observed Δ. A comparison whose pilot saw no discordant doc is planned at
ψ = 1/n (one discordant doc in n), not at ψ = 0, which would plan a size of 0 and promise more than the pilot
showed. The plan is per comparison (a family of one): PASS needs every gating comparison EQUIVALENT at once, so
the chance that all of K settle is below each one's power.

Pure functions and typed records: the command line (``cli/plan.py``) prints and writes them.
"""

from __future__ import annotations

import functools
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from evalparity import config
from evalparity.errors import EvalParityError
from evalparity.rundir import layout, records
from evalparity.samples import check_table
from evalparity.spec import RunSpec
from evalparity.stats import power as power_mod
from evalparity.stats import sequential
from evalparity.stats.compare import StatsSummary, compute
from evalparity.stats.options import StatsOptions

SCHEMA = "evalparity.plan/1"
PLAN_FILE = config.PLAN_FILE  # written at the top of the run folder by default (``--json`` elsewhere)
DEFAULT_POWERS = (0.8, 0.9)
# The staged planner runs the exact DP over every table at every look, once per grid step; its cost grows with
# ψ·N (the box of counts it carries). Past these products it would take minutes per comparison: the planner
# is then replaced by the single-look n, which the staged N exceeds by about 0–3 % (README, "Staged
# sign-offs"), and marked approximate; the power with fewer docs (one DP) is left out past the second.
PLANNER_WORK_CAP = 20_000
POWER_WORK_CAP = 60_000


# ---------------------------------------------------------------- records
@dataclass(frozen=True)
class PowerPlan:
    """One comparison's plan at one power target. ``docs`` is the task size N to provide (None: no size
    reaches the target, ``note`` says why); ``expected_docs`` the docs the staged rule is expected to score
    (it stops early once settled); ``power`` the exact P(EQUIVALENT) at N; ``single_look_docs`` what the
    single-look rule would need, for comparison. ``approximate``: the staged DP was skipped as too costly and
    N is the single-look n (a slight under-estimate)."""

    power_target: float
    docs: int | None
    expected_docs: int | None
    power: float | None
    single_look_docs: int | None
    looks: tuple[int, ...] = ()
    approximate: bool = False
    note: str = ""

    def to_json(self) -> dict:
        return {"power_target": self.power_target, "docs": self.docs, "expected_docs": self.expected_docs,
                "power": _num(self.power), "single_look_docs": self.single_look_docs, "looks": list(self.looks),
                "approximate": self.approximate, "note": self.note}


@dataclass(frozen=True)
class ComparisonPlan:
    """One gating comparison of the run, what the run saw, and its plan at each power target.

    ψ (``discordance``) and Δ (``difference``) are fractions of the n docs compared, as the statistics count
    them; ``discordance_planned`` is the ψ the plan used (1/n when none was seen: ``discordance_assumed``).
    ``docs_available`` is what this run lets the task score (its leaf tasks' docs, capped by ``--limit`` /
    ``--task-limit``); ``docs_in_task`` the task's whole size. Both are None where the folder does not record
    them (an ``evalparity compare`` of lm-eval outputs). ``power_with_available`` (``power_with_task``) is the
    staged rule's exact P(EQUIVALENT) with all the available (all the task's) docs, computed where some plan
    needs more than that."""

    task: str
    level: str
    filter: str
    metric: str
    cell: str
    reference: str
    n: int
    reference_only: int
    cell_only: int
    discordance: float
    difference: float
    discordance_planned: float
    discordance_assumed: bool
    margin: float
    verdict: str
    docs_available: int | None
    docs_in_task: int | None
    plans: tuple[PowerPlan, ...]
    power_with_available: float | None = None
    power_with_task: float | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"task": self.task, "level": self.level, "filter": self.filter, "metric": self.metric,
                "cell": self.cell, "reference": self.reference, "n": self.n, "reference_only": self.reference_only,
                "cell_only": self.cell_only, "unit": "fraction", "discordance": self.discordance,
                "difference": self.difference, "discordance_planned": self.discordance_planned,
                "discordance_assumed": self.discordance_assumed, "margin": self.margin, "verdict": self.verdict,
                "docs_available": self.docs_available, "docs_in_task": self.docs_in_task,
                "plans": [p.to_json() for p in self.plans],
                "power_with_available": _num(self.power_with_available),
                "power_with_task": _num(self.power_with_task), "notes": list(self.notes)}


@dataclass(frozen=True)
class TaskPlan:
    """A task (or a group, pooled) as one unit of scoring: every cell scores its docs together, and it stops
    only when every gating comparison on it is settled, so it needs the largest N of its comparisons.
    ``docs[i]`` is that N at ``powers[i]`` (None: some comparison cannot be planned); ``docs_to_score[i]`` what
    a cell would score for it, N capped at the task's size (all of it where N is more); ``settles[i]`` whether
    N fits in the docs this run makes available."""

    task: str
    level: str
    comparisons: int
    docs_available: int | None
    docs_in_task: int | None
    docs: tuple[int | None, ...]
    expected_docs: tuple[int | None, ...]
    docs_to_score: tuple[int | None, ...]
    expected_to_score: tuple[int | None, ...]
    settles: tuple[bool | None, ...]
    power_with_available: float | None = None  # the lowest over its comparisons
    power_with_task: float | None = None

    def to_json(self, powers: Sequence[float]) -> dict:
        return {"task": self.task, "level": self.level, "comparisons": self.comparisons,
                "docs_available": self.docs_available, "docs_in_task": self.docs_in_task,
                "plans": [{"power_target": p, "docs": d, "expected_docs": e, "docs_to_score": s,
                           "expected_docs_to_score": es, "fits_available": ok}
                          for p, d, e, s, es, ok in zip(powers, self.docs, self.expected_docs, self.docs_to_score,
                                                        self.expected_to_score, self.settles)],
                "power_with_available": _num(self.power_with_available),
                "power_with_task": _num(self.power_with_task)}


@dataclass(frozen=True)
class CellTiming:
    """One cell's measured speed in the run, and the time it would take for the plan. The rate is the cell
    record's ``eval_s`` over the docs it scored (unique task and doc in its table), for the run's mix of
    tasks on the run's device; ``load_s`` (loading the model) is paid once per cell, as all tasks score in one
    process. ``seconds[i]`` is load_s + docs / rate for every planned task's docs at ``powers[i]``,
    ``expected_seconds[i]`` the same for E[docs]; None where the record has no timing."""

    cell: str
    docs_scored: int
    eval_s: float | None
    load_s: float | None
    device: str | None
    rate: float | None  # docs per second
    docs: tuple[int, ...]
    expected_docs: tuple[int, ...]
    seconds: tuple[float | None, ...]
    expected_seconds: tuple[float | None, ...]

    def to_json(self, powers: Sequence[float]) -> dict:
        return {"cell": self.cell, "docs_scored": self.docs_scored, "eval_s": _num(self.eval_s),
                "load_s": _num(self.load_s), "device": self.device, "rate_docs_per_s": _num(self.rate),
                "estimates": [{"power_target": p, "docs": d, "seconds": _num(s), "expected_docs": ed,
                               "expected_seconds": _num(es)}
                              for p, d, s, ed, es in zip(powers, self.docs, self.seconds, self.expected_docs,
                                                         self.expected_seconds)]}


@dataclass(frozen=True)
class Plan:
    """The whole plan of one run folder: what ``plan`` prints and writes (``to_json``: ``evalparity.plan/1``)."""

    run_dir: str
    alpha: float
    powers: tuple[float, ...]
    direction: str
    comparisons: tuple[ComparisonPlan, ...]
    tasks: tuple[TaskPlan, ...]
    cells: tuple[CellTiming, ...]
    not_planned: tuple[dict, ...] = ()      # gating comparisons with no binary scores: {task, metric, cell, why}
    incomplete: tuple[tuple[str, str], ...] = ()  # (cell, why): named cells the run could not use
    notes: tuple[str, ...] = field(default=())

    @property
    def devices(self) -> list[str]:
        return sorted({c.device for c in self.cells if c.device})

    def rates_note(self) -> str:
        where = ", ".join(self.devices) or "a device it did not record"
        return (f"times are rates measured in this run on its device ({where}), for its mix of tasks, plus each "
                "cell's model load once; another device, batch size or task mix scores at another rate")

    def summary(self) -> dict:
        """The first power target's totals and the one line that says them."""
        p = self.powers[0]
        docs = [t.docs[0] for t in self.tasks if t.docs[0] is not None]
        timed = [(c.seconds[0], c.cell) for c in self.cells if c.seconds[0] is not None]
        slowest = max(timed) if timed else None
        expected = [c.expected_seconds[0] for c in self.cells if c.expected_seconds[0] is not None]
        short = [t for t in self.tasks if t.settles[0] is False]
        unplannable = [t for t in self.tasks if t.docs[0] is None]
        approx = any(pp.approximate for c in self.comparisons for pp in c.plans[:1])
        if docs:
            lo, hi = min(docs), max(docs)
            per_task = f"{'≈ ' if approx else ''}{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"
        else:
            per_task = "an unknown number of"
        line = f"to settle all gating comparisons at {pct(p)} power: about {per_task} docs per task, "
        if slowest:
            line += f"{seconds_text(slowest[0])} per cell (slowest cell {slowest[1]})"
        else:
            line += "GPU time unknown (no cell of the run recorded its eval time)"
        if short:
            line += "; short of docs: " + ", ".join(_short_text(t, p) for t in short)
        if unplannable:
            line += "; no task size reaches it: " + ", ".join(t.task for t in unplannable)
        return {"power_target": p, "docs_per_task_min": min(docs) if docs else None,
                "docs_per_task_max": max(docs) if docs else None,
                "docs_per_cell": sum(t.docs_to_score[0] or 0 for t in self.tasks),
                "expected_docs_per_cell": sum(t.expected_to_score[0] or 0 for t in self.tasks),
                "seconds_per_cell_max": _num(slowest[0]) if slowest else None,
                "slowest_cell": slowest[1] if slowest else None,
                "expected_seconds_per_cell_max": _num(max(expected)) if expected else None,
                "tasks_short_of_docs": [t.task for t in short],
                "tasks_not_plannable": [t.task for t in unplannable],
                "approximate": approx, "line": line}

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "run_dir": self.run_dir, "alpha": self.alpha, "powers": list(self.powers),
                "direction": self.direction,
                "planning": {"true_difference": 0.0, "rule": "staged (stats.sequential.n_for_equivalence_staged)",
                             "zero_discordance": "planned at ψ = 1/n",
                             "docs_available": "leaf tasks' docs capped by the run's --limit/--task-limit"},
                "comparisons": [c.to_json() for c in self.comparisons],
                "tasks": [t.to_json(self.powers) for t in self.tasks],
                "cells": [c.to_json(self.powers) for c in self.cells],
                "times": self.rates_note(),
                "not_planned": list(self.not_planned),
                "incomplete_cells": [{"cell": c, "why": w} for c, w in self.incomplete],
                "notes": list(self.notes),
                "summary": self.summary()}


# ---------------------------------------------------------------- small helpers
def _num(x: float | None) -> float | None:
    """A plain JSON number: None for a missing or non-finite one."""
    return None if x is None or not math.isfinite(float(x)) else float(x)


def pct(p: float) -> str:
    """0.8 → '80 %' (as the README writes powers)."""
    return f"{100 * p:g} %"


def seconds_text(s: float) -> str:
    """Seconds with the hours beside them when that many: '4,980 s (1.4 h)'."""
    text = f"{s:,.0f} s"
    return f"{text} ({s / 3600:.1f} h)" if s >= 3600 else text


def _short_text(t: TaskPlan, p: float) -> str:
    """A task whose N at the summary's power is more than this run makes available, in a few words."""
    have, whole, need = t.docs_available, t.docs_in_task, t.docs[0]
    reach = f", power {t.power_with_available:.2f} with them" if t.power_with_available is not None else ""
    if whole is not None and have is not None and whole > have:
        more = "" if whole >= need else (f", power {t.power_with_task:.2f} with all"
                                         if t.power_with_task is not None else "")
        return f"{t.task} needs {need:,}, more than this run's {have:,}{reach} (the task has {whole:,}{more})"
    return f"{t.task} needs {need:,}, more than the {have:,} it has{reach}"


def parse_powers(text: str) -> tuple[float, ...]:
    """``--power 0.8,0.9`` (or ``80%``) → (0.8, 0.9), each in (0, 1), in the order given, duplicates dropped; the
    first is the summary's."""
    out: list[float] = []
    for item in (x.strip() for x in str(text).split(",")):
        if not item:
            continue
        try:
            value = float(item[:-1]) / 100 if item.endswith("%") else float(item)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value < 1):
            raise EvalParityError(f"--power {item!r} is not a power: give probabilities in (0, 1), e.g. --power "
                                  "0.8,0.9 (or 80%)")
        if value not in out:
            out.append(value)
    if not out:
        raise EvalParityError(f"--power {text!r} names no power: give e.g. --power 0.8,0.9")
    return tuple(out)


# ---------------------------------------------------------------- the planner, per comparison
@functools.lru_cache(maxsize=4096)
def plan_power(margin: float, discordance: float, power_target: float, alpha: float) -> PowerPlan:
    """The staged planner's N and E[docs] for one (margin, ψ) at one power, at Δ = 0. Cached: a run's cells
    often share a ψ (and every cell with no discordant doc in n docs shares 1/n)."""
    single = power_mod.n_for_equivalence(margin, discordance, alpha=alpha, power=power_target)
    if not math.isfinite(single):
        return PowerPlan(power_target, None, None, None, None,
                         note=f"no task size reaches power {power_target:g} at ψ {discordance:.4g}, margin {margin:g}")
    single = int(single)
    if discordance * single > PLANNER_WORK_CAP:
        return PowerPlan(power_target, single, single, None, single, approximate=True,
                         note=f"≈ the single-look n: the staged planner's exact DP is skipped past ψ·N = "
                              f"{PLANNER_WORK_CAP:,} (it would take minutes); the staged N is about 0–3 % more")
    try:
        sp = sequential.n_for_equivalence_staged(margin, discordance, power_target=power_target, alpha=alpha)
    except EvalParityError as err:  # the planner's grid ran out: no size it tried reaches the power
        return PowerPlan(power_target, None, None, None, single, note=str(err))
    if not math.isfinite(sp.total):
        return PowerPlan(power_target, None, None, None, None,
                         note=f"no task size reaches power {power_target:g} at ψ {discordance:.4g}, margin {margin:g}")
    return PowerPlan(power_target, int(sp.total), int(math.ceil(sp.expected_docs - 1e-6)), float(sp.power),
                     int(sp.single_look_n), tuple(sp.design.looks) if sp.design else ())


@functools.lru_cache(maxsize=4096)
def power_with(docs: int, discordance: float, margin: float, alpha: float) -> float | None:
    """The staged rule's exact P(EQUIVALENT) at Δ = 0 when the task has only ``docs`` docs; None past the work
    cap (``POWER_WORK_CAP``) or with no docs."""
    if docs < 1 or discordance * docs > POWER_WORK_CAP:
        return None
    design = sequential.StagedDesign.for_task(int(docs), alpha=alpha)
    return float(sequential.staged_probabilities(design, discordance / 2, discordance / 2, margin=margin).equivalent)


def plan_comparison(row: dict, *, powers: Sequence[float], alpha: float, docs_available: int | None,
                    docs_in_task: int | None) -> ComparisonPlan:
    """The plan of one gating comparison with binary scores (a row of ``StatsSummary.comparisons``)."""
    n = int(row["n"])
    b, c = int(row["reference_only"]), int(row["cell_only"])
    margin = float(row["margin"])
    psi, delta = (b + c) / n, (c - b) / n
    assumed = b + c == 0
    psi_plan = 1.0 / n if assumed else psi
    notes = [f"no discordant doc in {n:,}: planned at ψ = 1/n = {psi_plan:.4g}"] if assumed else []
    plans = tuple(plan_power(margin, psi_plan, p, alpha) for p in powers)
    notes += [f"at {pct(p.power_target)}: {p.note}" for p in plans if p.note]
    needed = [p.docs for p in plans]
    short_avail = docs_available is not None and any(d is None or d > docs_available for d in needed)
    short_task = docs_in_task is not None and any(d is None or d > docs_in_task for d in needed)
    with_avail = power_with(docs_available, psi_plan, margin, alpha) if short_avail and docs_available else None
    with_task = None
    if short_task and docs_in_task and docs_in_task != docs_available:
        with_task = power_with(docs_in_task, psi_plan, margin, alpha)
    return ComparisonPlan(str(row["task"]), str(row["level"]), str(row["filter"]), str(row["metric"]),
                          str(row["cell"]), str(row["reference"]), n, b, c, psi, delta, psi_plan, assumed, margin,
                          str(row.get("verdict") or ""), docs_available, docs_in_task, plans, with_avail, with_task,
                          tuple(notes))


# ---------------------------------------------------------------- a run's docs
def task_sizes(spec: dict | None, kind: str, members: dict[str, list[str]]) -> dict[str, tuple[int | None, int | None]]:
    """Per planned unit (a task, or a group with its member tasks): (docs this run makes available, docs in the
    task). A run's ``spec.json`` records each leaf task's size (``leaf_docs``) and how the run limits it
    (``RunSpec.samples()`` with per-task limits, else ``limit`` per leaf task, as lm-eval applies it); a group's
    are its members' summed. (None, None) where a member's size is not recorded (a comparison of lm-eval
    outputs, or a run folder older than ``leaf_docs``)."""
    if kind != "run" or not spec:
        return {unit: (None, None) for unit in members}
    rs = RunSpec.from_json(spec)
    whole = dict(rs.leaf_docs)
    samples = rs.samples()
    limited = {leaf: (len(samples[leaf]) if samples is not None and leaf in samples
                      else min(n, rs.limit) if rs.limit else n) for leaf, n in whole.items()}
    out = {}
    for unit, leaves in members.items():
        if leaves and all(leaf in whole for leaf in leaves):
            out[unit] = (sum(limited[leaf] for leaf in leaves), sum(whole[leaf] for leaf in leaves))
        else:
            out[unit] = (None, None)
    return out


def _doc_frames(run_dir: Path, cells: Sequence[str]) -> dict[str, pd.DataFrame]:
    """Each usable cell's (task, group, doc_id) rows, deduplicated: the docs it scored."""
    out = {}
    for name in cells:
        path = layout.table(layout.cell_dir(run_dir, name))
        table = pd.read_parquet(path, columns=["task", "group", "doc_id"], engine="pyarrow")
        out[name] = table.drop_duplicates(["task", "doc_id"]).reset_index(drop=True)
    return out


def _members(units: Sequence[tuple[str, str]], docs: pd.DataFrame) -> dict[str, list[str]]:
    """The leaf tasks of each planned unit: itself for a task, the tasks under it for a group."""
    out = {}
    for unit, level in units:
        if level == "group":
            out[unit] = sorted(map(str, docs.loc[docs["group"] == unit, "task"].unique()))
        else:
            out[unit] = [unit]
    return out


# ---------------------------------------------------------------- the plan of a run folder
def _comparisons(run_dir: Path, opts: StatsOptions) -> StatsSummary:
    """The product's own comparisons of the run, computed into a temporary folder (the run's ``stats/`` stays
    as it is); error messages name the run, not the temporary folder."""
    with tempfile.TemporaryDirectory(prefix="evalparity-plan-") as tmp:
        try:
            return compute(Path(tmp), opts, source=run_dir)
        except EvalParityError as err:
            raise EvalParityError(str(err).replace(tmp, str(run_dir)), err.exit_code) from None


def check_is_run(run_dir: Path) -> None:
    """A folder with a run's or a comparison's records (or cells), else one line, before anything else."""
    if not any(p.exists() for p in (layout.spec_file(run_dir), layout.compare_file(run_dir),
                                    layout.cells_dir(run_dir))):
        raise EvalParityError(f"{run_dir} is not a run directory (no spec.json, compare.json or cells/): give the "
                              "--out of a run (a pilot, or any earlier run)")


def verify(run_dir: Path) -> records.VerifiedRun:
    """The run folder as ``records.verify_run`` accepts it (one line, exit 2, for what it refuses), each finished
    table readable as a per-sample table, and a comparison folder whole (its rerun redoes it all)."""
    check_is_run(run_dir)
    run = records.verify_run(run_dir)
    if run.kind == "compare" and run.incomplete:
        raise records.incomplete_error(run, "rerun the same `evalparity compare` to redo it")
    for name in run.cells:
        check_table(layout.table(layout.cell_dir(run_dir, name)))
    return run


def build_plan(run_dir: Path, opts: StatsOptions, powers: Sequence[float] = DEFAULT_POWERS) -> Plan:
    """The plan of ``run_dir``: its gating comparisons with binary scores, each planned at every power; the
    tasks they are on, sized; each cell's time for them. Raises a one-line ``EvalParityError`` for a folder
    that does not verify, and for one with no gating comparison to plan."""
    run_dir = Path(run_dir)
    powers = tuple(powers)
    run = verify(run_dir)
    summary = _comparisons(run_dir, opts)
    comp = summary.comparisons
    gating = comp[comp["gating"].astype(bool)]
    if gating.empty:
        verdicts = ", ".join(sorted(set(map(str, comp["verdict"])) - {""})) or "none"
        raise EvalParityError(f"{run_dir} has no gating comparison to plan (its comparisons' verdicts: {verdicts}): "
                              "give its metrics a margin (--margin acc=1pp,METRIC=VALUE), or --reference another cell")
    binary = gating["reference_only"].notna() & gating["cell_only"].notna() & (gating["n"] > 0)
    not_planned = tuple({"task": str(r["task"]), "metric": str(r["metric"]), "cell": str(r["cell"]),
                         "why": "no binary (0/1) scores on both sides: the staged planner is for binary scores"}
                        for r in gating[~binary].to_dict("records"))
    if not binary.any():
        metrics = ", ".join(sorted(set(map(str, gating["metric"]))))
        raise EvalParityError(f"{run_dir}: every gating comparison is on a metric without binary (0/1) scores "
                              f"({metrics}); the staged planner plans binary scores only, so there is nothing to plan")
    rows = gating[binary].to_dict("records")
    docs = _doc_frames(run_dir, list(run.cells))
    ref_docs = docs.get(opts.reference, next(iter(docs.values())))
    units = list(dict.fromkeys((str(r["task"]), str(r["level"])) for r in rows))
    members = _members(units, ref_docs)
    sizes = task_sizes(run.spec, run.kind, members)
    plans = tuple(plan_comparison(r, powers=powers, alpha=opts.alpha, docs_available=sizes[str(r["task"])][0],
                                  docs_in_task=sizes[str(r["task"])][1]) for r in rows)
    tasks = tuple(_task_plan(unit, level, [p for p in plans if p.task == unit], sizes[unit], len(powers))
                  for unit, level in units)
    cells = tuple(_cell_timing(name, rec, docs[name], tasks, len(powers)) for name, rec in run.cells.items())
    notes = []
    if opts.direction == "worse":
        notes.append("planned for two-sided equivalence: under --direction worse only the lower end counts, so "
                     "these sizes are on the safe side")
    if opts.cluster:
        notes.append("planned with docs independent: --cluster's test over a group's member tasks can need more")
    if len(plans) > 1:
        notes.append(f"each plan is one comparison's power; PASS needs all {len(plans)} EQUIVALENT at once, which "
                     "is less likely than any one of them")
    return Plan(str(run_dir), float(opts.alpha), powers, opts.direction, plans, tasks, cells, not_planned,
                tuple(run.incomplete), tuple(notes))


def _task_plan(unit: str, level: str, plans: list[ComparisonPlan], size: tuple[int | None, int | None],
               k: int) -> TaskPlan:
    available, whole = size
    docs, expected, to_score, expected_to_score, settles = [], [], [], [], []
    for i in range(k):
        need = [p.plans[i].docs for p in plans]
        n = None if any(d is None for d in need) else max(need)
        e = None if n is None else max(p.plans[i].expected_docs or 0 for p in plans)
        docs.append(n)
        expected.append(e)
        score = whole if n is None or (whole is not None and n > whole) else n
        to_score.append(score)
        expected_to_score.append(None if score is None else min(e, score) if e is not None else score)
        settles.append(None if available is None else (n is not None and n <= available))
    with_avail = [p.power_with_available for p in plans if p.power_with_available is not None]
    with_task = [p.power_with_task for p in plans if p.power_with_task is not None]
    return TaskPlan(unit, level, len(plans), available, whole, tuple(docs), tuple(expected), tuple(to_score),
                    tuple(expected_to_score), tuple(settles), min(with_avail) if with_avail else None,
                    min(with_task) if with_task else None)


def _cell_timing(name: str, rec: records.CellRecord, docs: pd.DataFrame, tasks: Sequence[TaskPlan],
                 k: int) -> CellTiming:
    extra = rec.extra
    eval_s, load_s = _seconds(extra.get("eval_s")), _seconds(extra.get("load_s"))
    scored = int(len(docs))
    rate = scored / eval_s if eval_s and scored else None
    device = extra.get("device_name") or extra.get("device")
    to_score = tuple(sum(t.docs_to_score[i] or 0 for t in tasks) for i in range(k))
    expected = tuple(sum(t.expected_to_score[i] or 0 for t in tasks) for i in range(k))

    def time_for(n: int) -> float | None:
        return None if rate is None else (load_s or 0.0) + n / rate

    return CellTiming(name, scored, eval_s, load_s, str(device) if device else None, rate, to_score, expected,
                      tuple(time_for(n) for n in to_score), tuple(time_for(n) for n in expected))


def _seconds(x) -> float | None:
    """A timing from a cell record: a finite number ≥ 0, else None (a hand-written or older record)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        return None
    return float(x)
