"""The staged sign-off on a run's tables: replay the looks, decide each task's stop, and give its verdicts.

A staged run (``staging``) scores each task in looks; after each, the statistics decide which tasks go on.
That decision is a pure function of the cells' tables and the spec: ``replay`` recomputes it, look by look
in the order the run made them (round by round, tasks in name order within a round), with the
group-sequential rule of ``sequential`` (α spent over the looks, Holm over the whole gating family for
DIFFERENT, and for SHIFT at the last look). The same function serves both sides:

- the run, after each round, on the rounds scored so far: which tasks stop and which need the next look;
- the statistics stage, on the finished tables: the verdicts of the gating comparisons, and a check that
  the tables hold exactly the docs the decisions called for. A table with docs beyond the look where its
  task settled, or short of it, is not what a staged run writes: refused (edited or mixed tables), or
  INCOMPLETE (a run killed between rounds), never signed off.

Only 0/1 metrics are staged (``sequential`` is exact for paired binary scores). When a gating comparison is
on another kind of metric (a ``--margin`` for a continuous metric, ``--gate-logprobs``), no task stops
early and the single-look rule decides at the end: looking without acting spends no α (``Trace.off``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pandas as pd

from evalparity.errors import EvalParityError
from evalparity.staging import StagingPlan, order
from evalparity.stats import verdict
from evalparity.stats.sequential import StagedDesign, StagedResult, decide, settle, shift_family

ONE_SIDED = 2  # in a comparison's ``signed`` series: a doc with a value on one side only


@dataclass
class UnitTrace:
    """One staged task: its looks (cumulative docs), the last look its docs reach, and where and why it
    stopped (``stopped`` is the look index, None while it is still open)."""

    unit: str
    looks: tuple[int, ...]
    reached: int
    stopped: int | None = None
    why: str = "open"
    results: dict[int, StagedResult] = field(default_factory=dict)  # gating row index -> its deciding result
    direct: set[int] = field(default_factory=set)  # rows DIFFERENT by a disagreement seen directly

    @property
    def open(self) -> bool:
        return self.stopped is None

    def needs_next(self) -> bool:
        """Open, and its docs end at a look that is not its last: the run owes it the next look."""
        return self.open and self.reached + 1 < len(self.looks)

    def to_json(self) -> dict:
        at = self.stopped if self.stopped is not None else self.reached
        return {"task": self.unit, "looks": list(self.looks), "stopped_at_look": at + 1, "of_looks": len(self.looks),
                "docs": self.looks[at], "docs_available": self.looks[-1], "why": self.why}


@dataclass
class Trace:
    """``replay``'s answer: every staged task's trace, and ``off``, the reason no task may stop early
    (None when the staged rule applies)."""

    units: dict[str, UnitTrace]
    off: str | None = None

    def next_units(self) -> list[str]:
        return sorted(u.unit for u in self.units.values() if u.needs_next())

    def unfinished(self) -> list[UnitTrace]:
        """Open tasks whose docs end before their last look (``needs_next``): a staged run stopped between
        rounds, or statistics asked with a tighter margin (or α) than the run decided its stops with. Their
        verdicts would be single-look ones on docs the staged rule did not stop at: the sign-off is
        INCOMPLETE. (It was never: this said "open, not needing a next look, before its last", which no
        task is, and a report with a tighter margin signed off PASS; session 32's review.)"""
        return [u for u in self.units.values() if u.needs_next()]

    def to_json(self) -> dict:
        return {"rule": None if self.off else "group-sequential", "off": self.off,
                "tasks": [self.units[k].to_json() for k in sorted(self.units)]}


@lru_cache(maxsize=256)
def _positions(seed: int, leaf: str, n: int) -> np.ndarray:
    """Each doc's place in its leaf's staged order (the inverse of ``staging.order``), computed once per leaf:
    ``reached_look`` and ``replay`` both read it, at every round of a run."""
    pos = np.empty(n, dtype=np.int64)
    pos[order(seed, leaf, n)] = np.arange(n)
    pos.setflags(write=False)
    return pos


def reached_look(plan: StagingPlan, unit: str, docs: pd.MultiIndex, where: str) -> int:
    """The look whose docs are exactly ``docs`` ((leaf, doc_id) pairs of one unit); a one-line refusal when
    they are no look of the staged order (docs added, removed or mixed in by hand)."""
    u = plan.unit(unit)
    leaves = dict(u.leaves)
    frame = pd.DataFrame({"leaf": docs.get_level_values(0).astype(str), "doc": docs.get_level_values(1).astype(int)})
    stray = sorted(set(frame["leaf"]) - set(leaves))
    if stray:
        raise EvalParityError(f"{where}: task {stray[0]} is not a member of staged task {unit}: the tables are of "
                              "another run; rerun into a new --out")
    counts, top = {}, {}
    for leaf, g in frame.groupby("leaf"):
        ids = g["doc"].to_numpy()
        if ids.min() < 0 or ids.max() >= leaves[leaf]:
            raise EvalParityError(f"{where}: task {leaf} has doc {int(ids.max())} beyond the {leaves[leaf]} it "
                                  "was staged with: rerun into a new --out")
        pos = _positions(plan.seed, leaf, leaves[leaf])[ids]
        counts[leaf], top[leaf] = len(np.unique(ids)), int(pos.max()) + 1
    for k, row in enumerate(u.counts):
        want = dict(zip((leaf for leaf, _ in u.leaves), row))
        if all(counts.get(leaf, 0) == c and top.get(leaf, 0) <= c for leaf, c in want.items()):
            return k
    raise EvalParityError(f"{where}: the docs of task {unit} ({len(frame):,}) are not a look of its staged order "
                          f"(looks: {', '.join(f'{n:,}' for n in u.looks)} docs): the table was edited or mixed "
                          "with another run's; remove that cell and rerun the same command to redo it")


@dataclass(frozen=True)
class GatingRow:
    """What the replay needs of one gating comparison: its index among the stage's comparisons, its task
    (a staged unit), margin, and per doc −1 (right only in the reference), +1 (only in the cell), 0, or
    ``ONE_SIDED``; ``problem``: a disagreement seen directly (no statistic needed)."""

    index: int
    unit: str
    margin: float
    signed: pd.Series | None
    problem: bool = False


def replay(rows: Sequence[GatingRow], plan: StagingPlan, *, alpha: float, direction: str = "both",
           off: str | None = None, where: str = "the cells' tables") -> Trace:
    """The staged decisions on the data: see the module docstring. ``off``: a reason the rule must not stop
    a task early (then every task goes to its last look and nothing is decided here)."""
    by_unit: dict[str, list[GatingRow]] = {u.name: [] for u in plan.units}
    for r in rows:
        if r.unit not in by_unit:
            raise EvalParityError(f"{where}: a gating comparison is on task {r.unit!r}, which is not a staged task "
                                  f"of this run ({', '.join(by_unit)}): rerun into a new --out")
        by_unit[r.unit].append(r)
    units: dict[str, UnitTrace] = {}
    for u in plan.units:
        docs = next((r.signed.index for r in by_unit[u.name] if r.signed is not None), None)
        reached = reached_look(plan, u.name, docs, where) if docs is not None and len(docs) else len(u.looks) - 1
        units[u.name] = UnitTrace(u.name, u.looks, reached)
    if off is not None:
        for t in units.values():
            if not t.needs_next():
                t.stopped, t.why = t.reached, f"scored to its last look ({off})"
        return Trace(units, off)
    family = len(rows)
    already = 0
    positions = {}
    for u in plan.units:
        for leaf, n in u.leaves:
            positions[leaf] = _positions(plan.seed, leaf, n)
    located = {r.index: _look_of_docs(r.signed, positions, plan.unit(r.unit)) for r in rows if r.signed is not None}
    for k in range(plan.rounds):
        for u in plan.units:
            t = units[u.name]
            if not t.open or k > t.reached or k >= len(u.looks):
                continue
            design = StagedDesign(u.looks, alpha, plan.spending)
            pending = [r for r in by_unit[u.name] if r.index not in t.results and r.index not in t.direct]
            if not by_unit[u.name]:
                t.stopped, t.why = k, "no gating comparison on it"
                continue
            looked = []
            for r in pending:
                inside = _in_look(r.signed, located[r.index], u, k) if r.signed is not None else None
                if r.problem or (inside is not None and bool(np.any(inside == ONE_SIDED))):
                    t.direct.add(r.index)
                    already += 1
                    continue
                v = inside
                looked.append((r, decide(int(np.sum(v == -1)), int(np.sum(v == 1)), u.looks[k], design,
                                         margin=r.margin, direction=direction)))
            if looked:
                step = settle([res for _, res in looked], alpha=alpha, family_size=family, already_different=already)
                already += step.new_different
                for (r, _), res in zip(looked, step.results):
                    if res.settled or res.final:
                        t.results[r.index] = res
                    elif k == t.reached:
                        t.results[r.index] = res  # open: its state at the last look scored
            done = all(r.index in t.direct or (r.index in t.results and (t.results[r.index].settled
                                                                          or t.results[r.index].final))
                       for r in by_unit[u.name])
            if done:
                last = k == len(u.looks) - 1
                settled_all = all(r.index in t.direct or t.results[r.index].settled for r in by_unit[u.name])
                t.stopped = k
                t.why = ("every gating comparison settled" if settled_all
                         else "its docs ran out (last look): what is not settled gets the single-look verdict")
                if settled_all and last:
                    t.why = "every gating comparison settled at its last look"
    _shift_over_the_family(units, alpha=alpha, family=family)
    return Trace(units, None)


def _shift_over_the_family(units: dict[str, UnitTrace], *, alpha: float, family: int) -> None:
    """SHIFT or INCONCLUSIVE, over every task at once, for what its last look left unsettled
    (``sequential.shift_family``: Holm over the whole gating family, as a single-look sign-off decides SHIFT)."""
    where = [(t, i) for t in units.values() for i in sorted(t.results)]
    decided = shift_family([t.results[i] for t, i in where], alpha=alpha, family_size=family)
    for (t, i), res in zip(where, decided):
        t.results[i] = res


def _look_of_docs(signed: pd.Series, positions: dict[str, np.ndarray], u) -> tuple[np.ndarray, np.ndarray]:
    """Per doc of ``signed``: its position in its leaf's order, and its leaf's index in ``u.leaves``; a doc is
    in look k when its position is below ``u.counts[k][leaf]``."""
    names = [leaf for leaf, _ in u.leaves]
    leaf = pd.Categorical(signed.index.get_level_values(0).astype(str), categories=names).codes
    doc = signed.index.get_level_values(1).to_numpy(dtype=np.int64)
    pos = np.empty(len(doc), dtype=np.int64)
    for i, name in enumerate(names):
        mine = leaf == i
        pos[mine] = positions[name][doc[mine]]
    return pos, leaf


def _in_look(signed: pd.Series, where: tuple[np.ndarray, np.ndarray], u, k: int) -> np.ndarray:
    pos, leaf = where
    return signed.to_numpy()[pos < np.asarray(u.counts[k])[leaf]]


def staged_reason(res: StagedResult, t: UnitTrace, unit: str, estimate: str) -> str:
    """The verdict's reason for a comparison the staged rule decided."""
    at = f"look {res.look + 1} of {len(t.looks)} ({res.n:,} of {t.looks[-1]:,} docs)"
    ci = res.confidence_interval()
    lvl = 1 - 2 * (res.beyond_threshold if res.verdict == verdict.DIFFERENT else res.level)
    interval = f"{lvl:.4%} CI [{ci.low * 100:+.2f}, {ci.high * 100:+.2f}] pp"
    if res.verdict == verdict.EQUIVALENT:
        why = f"p_equivalence {res.p_equivalence:.2g} < α_k {res.level:.3g}"
    elif res.verdict == verdict.DIFFERENT:
        why = f"stage-adjusted p_beyond {res.q_beyond:.2g} below its Holm step"
    else:
        why = (f"not settled at the last look (p_equivalence {res.p_equivalence:.2g} ≥ α_k {res.level:.3g}); "
               + ("McNemar shows a change (Holm over the gating comparisons)" if res.verdict == verdict.SHIFT
                  else "no change shown either"))
    return f"staged, {unit} stopped at {at}: {estimate} = {res.statistic * 100:+.2f} pp, {interval}; {why}"


def check_multiple(multiple: str) -> None:
    """A staged sign-off's family rule is Holm (DIFFERENT at every look, SHIFT at the last: the design its
    error rates were worked out for); another ``--multiple`` would be printed and recorded but not applied:
    refused in one line."""
    if multiple != "holm":
        raise EvalParityError(f"--multiple {multiple}: a staged run's verdicts are decided by its group-sequential "
                              "rule, which is Holm over the gating comparisons; drop --multiple, or pass --full "
                              f"to score every document and decide once with {multiple}")


def incomplete_reason(trace: Trace) -> str | None:
    """Why a staged run's sign-off is INCOMPLETE (tasks stopped between rounds), or None."""
    left = trace.unfinished()
    if not left:
        return None
    names = ", ".join(f"{u.unit} (look {u.reached + 1} of {len(u.looks)}, not settled)" for u in left)
    return (f"the staged run stopped before its tasks settled: {names}; rerun the same command to resume (with "
            "other statistics options than the run's, rerun `evalparity run` with them: it scores the looks "
            "they need)")
