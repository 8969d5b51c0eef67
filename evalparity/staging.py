"""Staged evaluation: which documents each look of a staged run scores (issue 26, item 1).

A staged run scores each task's documents in one fixed pseudo-random order, in looks of growing size
(500, 1,000, 2,000, … doubling while at most half the task, then all of it: ``stats.sequential.schedule``),
and stops a task as soon as every gating comparison on it is settled (``stats.staged``). This module only
says *which* documents: the statistics are elsewhere.

- A **unit** is one task the user named: a plain task, or a group (MMLU, C-Eval) staged as a whole. A
  group's look of n docs takes from each member in proportion to its size (rounded up, at least one new doc
  per member per look while it has any left), so every subject is in every look.
- Each leaf task's order is a permutation of its first N docs (N: the task's docs, capped by ``--limit`` or
  ``--task-limit``), seeded by the run's seed and the leaf's name, so it is the same in every cell, every
  resume and every rerun; the plan is recorded in ``spec.json`` (``RunSpec.staging``) and is part of the
  run's identity.
- A **round** is one look of every unit still open. Round r scores, for each open unit, the docs of its
  look r that earlier looks did not (``StagingPlan.increment``).

Why a random order: the first 500 docs of a dataset file are often not a fair sample of it (sorted by
source, length or subject); a look is only evidence about the task if its docs are a random subset.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from evalparity.errors import EvalParityError
from evalparity.rundir import rounds
from evalparity.stats.sequential import FIRST_LOOK, GROWTH, LAST_FRACTION, SPENDING, schedule


@dataclass(frozen=True)
class StageUnit:
    """One staged task: its leaves (name, docs available), its looks (cumulative docs over all leaves) and,
    per look, each leaf's cumulative docs (``counts[k][i]`` for leaf i at look k)."""

    name: str
    leaves: tuple[tuple[str, int], ...]
    looks: tuple[int, ...]
    counts: tuple[tuple[int, ...], ...]

    @property
    def total(self) -> int:
        return self.looks[-1]

    def to_json(self) -> dict:
        return {"name": self.name, "leaves": [list(x) for x in self.leaves], "looks": list(self.looks),
                "counts": [list(c) for c in self.counts]}

    @classmethod
    def from_json(cls, d: dict) -> StageUnit:
        return cls(str(d["name"]), tuple((str(a), int(b)) for a, b in d["leaves"]), tuple(int(x) for x in d["looks"]),
                   tuple(tuple(int(x) for x in c) for c in d["counts"]))


@dataclass(frozen=True)
class StagingPlan:
    """The staged design of a run: the order's seed, the schedule's parameters, the α-spending function and
    every unit's looks. ``rounds`` is the most looks any unit has."""

    seed: int
    first: int
    growth: float
    spending: str
    units: tuple[StageUnit, ...]

    @property
    def rounds(self) -> int:
        return max(len(u.looks) for u in self.units)

    def unit(self, name: str) -> StageUnit:
        for u in self.units:
            if u.name == name:
                return u
        raise EvalParityError(f"task {name!r} is not staged in this run (its units: "
                              f"{', '.join(u.name for u in self.units)}): rerun with the same --tasks")

    def unit_of_leaf(self) -> dict[str, str]:
        return {leaf: u.name for u in self.units for leaf, _ in u.leaves}

    def look_docs(self, unit: str, k: int) -> dict[str, list[int]]:
        """Every doc of ``unit``'s look k (cumulative), per leaf, sorted."""
        u = self.unit(unit)
        return {leaf: sorted(order(self.seed, leaf, n)[:u.counts[k][i]].tolist())
                for i, (leaf, n) in enumerate(u.leaves)}

    def increment(self, unit: str, k: int) -> dict[str, list[int]]:
        """The docs look k of ``unit`` adds to look k − 1, per leaf (sorted: lm-eval maps a ``samples`` list
        position to a doc id by index, which is only right for a sorted list)."""
        u = self.unit(unit)
        out = {}
        for i, (leaf, n) in enumerate(u.leaves):
            lo = u.counts[k - 1][i] if k > 0 else 0
            out[leaf] = sorted(order(self.seed, leaf, n)[lo:u.counts[k][i]].tolist())
        return out

    def to_json(self) -> dict:
        return {"seed": self.seed, "first": self.first, "growth": self.growth, "spending": self.spending,
                "units": [u.to_json() for u in self.units]}

    @classmethod
    def from_json(cls, d: dict | None) -> StagingPlan | None:
        if not d:
            return None
        return cls(int(d["seed"]), int(d["first"]), float(d["growth"]), str(d["spending"]),
                   tuple(StageUnit.from_json(u) for u in d["units"]))


def staging_of(run_dir) -> StagingPlan | None:
    """A run folder's staging plan, from its checked spec; None for a comparison of lm-eval outputs (no
    spec) or a run that scored every doc."""
    from evalparity.rundir import layout, records

    if not layout.spec_file(run_dir).exists():
        return None
    data = records.check_spec(layout.spec_file(run_dir))
    try:
        return StagingPlan.from_json(data.get("staging"))
    except (KeyError, TypeError, ValueError) as err:
        raise EvalParityError(f"{layout.spec_file(run_dir)}: its staging plan is not one evalparity can read "
                              f"({type(err).__name__}): restore it, or rerun into a new --out") from None


@lru_cache(maxsize=256)
def _order(seed: int, leaf: str, n: int) -> np.ndarray:
    rng = np.random.default_rng([seed & 0xFFFFFFFF, zlib.crc32(leaf.encode("utf-8"))])
    out = rng.permutation(n)
    out.setflags(write=False)
    return out


def order(seed: int, leaf: str, n: int) -> np.ndarray:
    """The fixed scoring order of a leaf task's first ``n`` docs (a permutation of 0..n−1): the same for the
    same seed and name on any machine (numpy's PCG64 seeded by the seed and the name's CRC-32)."""
    return _order(int(seed), str(leaf), int(n))


def unit_counts(leaves: list[tuple[str, int]], looks: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(realised looks, per-look per-leaf cumulative counts) for a unit whose nominal looks are ``looks``.
    Each member gets ⌈n·N_i/N⌉ of look n, at least one more than at the look before while it has docs left,
    and all of them at the last look; the realised look is the sum (a few docs over n from the rounding)."""
    total = sum(n for _, n in leaves)
    counts, prev = [], [0] * len(leaves)
    for j, n in enumerate(looks):
        last = j == len(looks) - 1
        row = []
        for i, (_, size) in enumerate(leaves):
            c = size if last else min(size, max(math.ceil(n * size / total), prev[i] + 1))
            row.append(c)
        counts.append(tuple(row))
        prev = row
    realised = [sum(r) for r in counts]
    keep = [j for j in range(len(realised)) if j == 0 or realised[j] > realised[j - 1]]
    return tuple(realised[j] for j in keep), tuple(counts[j] for j in keep)


def make_plan(units: dict[str, list[tuple[str, int]]], *, seed: int, first: int = FIRST_LOOK,
              growth: float = GROWTH, spending: str = "obf") -> StagingPlan | None:
    """The staging plan for ``units`` (task name → its leaves and their docs), or None when no unit has
    more than one look (every task fits in its first look: a staged run would be the full run)."""
    if first < 1:
        raise EvalParityError(f"--first-look {first} must be at least 1 doc")
    if spending not in SPENDING:
        raise EvalParityError(f"unknown spending function {spending!r}: use one of {', '.join(SPENDING)}")
    out = []
    for name, leaves in units.items():
        leaves = [(leaf, n) for leaf, n in leaves if n > 0]
        total = sum(n for _, n in leaves)
        if total == 0:
            continue
        nominal = schedule(total, first=first, growth=growth, last_fraction=LAST_FRACTION)
        looks, counts = unit_counts(leaves, nominal)
        out.append(StageUnit(name, tuple(leaves), looks, counts))
    if not out or all(len(u.looks) == 1 for u in out):
        return None
    return StagingPlan(int(seed), int(first), float(growth), spending, tuple(out))


def units_of(tasks: Iterable[str], leaves: dict[str, int], groups: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each task the user named → the leaf tasks under it (itself for a plain task), from the preflight's
    leaves and its group map (group → members, which may be groups)."""
    out = {}
    for task in tasks:
        found, todo, seen = [], [task], set()
        while todo:
            t = todo.pop(0)
            if t in seen:
                continue
            seen.add(t)
            if t in groups and groups[t]:
                todo.extend(groups[t])
            elif t in leaves:
                found.append(t)
        out[task] = sorted(found)
    return out


# ---------------------------------------------------------------- round records from the plan
def request_for(plan: StagingPlan, identity: str, r: int, names: list[str] | tuple[str, ...]) -> rounds.RoundRequest:
    """Round r's record for the units ``names``: the docs look r of each adds (``StagingPlan.increment``)."""
    docs, padding = {}, {}
    for name in names:
        unit = plan.unit(name)
        for leaf, ids in plan.increment(name, r).items():
            if ids:
                docs[leaf] = ids
            else:  # a member with none left while its group goes on: one scored doc, dropped again
                padding[leaf] = [int(order(plan.seed, leaf, dict(unit.leaves)[leaf])[0])]
    return rounds.RoundRequest(r, identity, tuple(names), docs, padding)


def predicted(plan: StagingPlan, last: rounds.RoundRequest) -> rounds.RoundRequest | None:
    """Round ``last.round + 1``'s record if every unit of ``last`` goes on to its next look (what a cell may
    score ahead, ``cells.run_staged``); None where none of them has a next look. The run's own record for
    that round is ``request_for`` the units its decision leaves open: the same record when all stay open."""
    r = last.round + 1
    names = sorted(n for n in last.tasks if r < len(plan.unit(n).looks))  # in the run's order (next_units)
    return request_for(plan, last.identity, r, names) if names else None


def same_request(a: rounds.RoundRequest, b: rounds.RoundRequest) -> bool:
    """Whether two records of a round ask for the same scoring: every field, in the same order (lm-eval is
    called with the units, leaves and docs in the order the record gives them)."""
    return json.dumps(a.to_json()) == json.dumps(b.to_json())
