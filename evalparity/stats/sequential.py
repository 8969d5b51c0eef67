"""Staged (group-sequential) sign-offs: the decision rule at several looks at accumulating docs, with its
error rates kept at α over all the looks together (issue 26, item 2).

Each task's docs are scored in a fixed order, and the statistics are looked at after n_1 < n_2 < … < n_K = N
docs (``schedule``: 500, 1,000, 2,000, … doubling, the last look at N). Looking several times with the
single-look rule at α each time would inflate both error rates (every look is another chance of a false
claim), so α is *spent* over the looks with a Lan–DeMets spending function f of the information fraction
t = n/N (``spent``: O'Brien–Fleming-like by default, strict early and close to α at the end; Pocock-like
as an option). Look k may use the increment α_k = f(t_k) − f(t_{k−1}); the last look gets what is left,
α − f(t_{K−1}), so the α_k sum to α.

The rule at look k, for one comparison, with the product's own p-values (``paired.binary_tests``):

- stop **EQUIVALENT** when p_equivalence < α_k: the (1 − 2α_k) interval lies inside the margin;
- stop **DIFFERENT** when p_beyond < α_k (``verdict.beyond_pvalue``, the far-end tail included): the
  (1 − 2α_k) interval lies outside it;
- otherwise continue; at the last look what is not settled gets SHIFT or INCONCLUSIVE as in a single-look
  sign-off: the exact McNemar test, at the last look only (neither claim passes or fails a sign-off, so it
  needs no spending), Holm over the gating family (``shift_family``) as the single-look rule's default.

Why the level holds (a union bound over the looks, no normal approximation of the look-to-look
correlation): a false EQUIVALENT at some look means p_equivalence < α_k at that look, so
P(false EQUIVALENT) ≤ Σ_k P(p_eq,k < α_k) ≤ Σ_k α_k = α, provided each single-look test holds its nominal
level; the same for DIFFERENT. Exact dynamic programming over every table at every look
(``staged_probabilities``) checks the whole claim on a grid (``benchmarks/verdict_calibration.py
--staged``). The price against exact group-sequential boundaries is a little power at the last look; the
schedule keeps it small by putting no look after N/2 before the last one (``last_fraction``), so the last
look keeps at least α − f(½) (0.0444 of 0.05 with O'Brien–Fleming, 0.0498 at N = 30,000).

A family of gating comparisons: PASS needs every one EQUIVALENT (intersection-union, no adjustment).
DIFFERENT is controlled over the family by Holm on the stage-adjusted p-values q = p_beyond / s_k, with
s_k = α_k / α the look's share (``settle``); over all K gating comparisons of the sign-off, however many
were settled earlier, and whichever tasks are at a look now. Why: the first false DIFFERENT anywhere can
only have had correct rejections before it, at most K − K₀ of them (K₀ true nulls), so it needs some true
null with q ≤ α / K₀ at some look, and P(that) ≤ Σ_{true nulls} Σ_k s_k α / K₀ = α.

A task stops when every gating comparison on it is settled (``settle(...).stops``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import signal
from scipy import stats as sps

from evalparity import config
from evalparity.errors import EvalParityError
from evalparity.stats import paired, power, verdict
from evalparity.stats.inference import binary_inference
from evalparity.stats.results import ConfidenceInterval

SPENDING = ("obf", "pocock")
FIRST_LOOK = config.FIRST_LOOK
GROWTH, LAST_FRACTION = 2.0, 0.5
TAIL = 1e-13  # each count's marginal tail left out of the exact DP at each look (the mass is reported)


# ---------------------------------------------------------------- the design: looks and α spent at each
def spent(t, alpha: float = 0.05, kind: str = "obf"):
    """Lan–DeMets α-spending: the cumulative α that may be spent by information fraction t (0 at 0, α at 1,
    increasing). ``obf``: 2·(1 − Φ(z_{1−α/2} / √t)), O'Brien–Fleming-like, almost nothing early, so an early
    stop needs overwhelming evidence and the last look keeps nearly all of α; ``pocock``: α·ln(1 + (e − 1)t),
    Pocock-like, nearly even over the looks. Vectorised over t."""
    _check_alpha(alpha)
    t = np.clip(np.asarray(t, dtype=float), 0.0, 1.0)
    if kind == "obf":
        with np.errstate(divide="ignore"):
            out = np.where(t > 0, 2 * sps.norm.sf(sps.norm.isf(alpha / 2) / np.sqrt(np.maximum(t, 1e-300))), 0.0)
    elif kind == "pocock":
        out = alpha * np.log1p((math.e - 1) * t)
    else:
        raise EvalParityError(f"unknown spending function {kind!r}: use one of {', '.join(SPENDING)}")
    out = np.where(t >= 1, alpha, out)
    return float(out) if out.ndim == 0 else out


def schedule(total: int, *, first: int = FIRST_LOOK, growth: float = GROWTH,
             last_fraction: float = LAST_FRACTION) -> tuple[int, ...]:
    """The looks for a task of ``total`` docs: first, first·growth, … while at most last_fraction·total,
    then total. No look between last_fraction·N and N: with the union bound, a look at t near 1 would spend
    nearly all of α (O'Brien–Fleming) for a few docs saved and leave the last look almost none."""
    if not (isinstance(total, (int, np.integer)) and total >= 1):
        raise EvalParityError(f"a staged design needs a whole number of docs ≥ 1, got {total!r}: pass the task's "
                              "document count")
    if first < 1 or growth <= 1 or not 0 < last_fraction <= 1:
        raise EvalParityError(f"bad schedule (first={first}, growth={growth}, last_fraction={last_fraction}): use "
                              "first ≥ 1, growth > 1, 0 < last_fraction ≤ 1")
    looks, n = [], float(first)
    while round(n) <= last_fraction * total and round(n) < total:
        looks.append(int(round(n)))
        n *= growth
    return tuple(looks) + (int(total),)


@dataclass(frozen=True)
class StagedDesign:
    """Looks at cumulative doc counts (the last is the task's N) and the α spent at each. ``levels[k]`` is
    the nominal level of look k for both claims (EQUIVALENT and DIFFERENT); they sum to ``alpha``."""

    looks: tuple[int, ...]
    alpha: float = 0.05
    spending: str = "obf"
    levels: tuple[float, ...] = field(init=False)

    def __post_init__(self) -> None:
        looks = tuple(int(n) for n in self.looks)
        if not looks or looks[0] < 1 or any(b <= a for a, b in zip(looks, looks[1:])):
            raise EvalParityError(f"looks must be increasing whole doc counts ≥ 1, got {self.looks!r}: use "
                                  "sequential.schedule(N)")
        t = np.array(looks[:-1], float) / looks[-1]
        cumulative = np.atleast_1d(spent(t, self.alpha, self.spending)) if t.size else np.array([])
        increments = np.diff(np.r_[0.0, cumulative])
        last = self.alpha - (float(cumulative[-1]) if cumulative.size else 0.0)  # exactly α for a single look
        object.__setattr__(self, "looks", looks)
        object.__setattr__(self, "levels", tuple(float(x) for x in increments) + (last,))

    @classmethod
    def for_task(cls, total: int, *, alpha: float = 0.05, spending: str = "obf", first: int = FIRST_LOOK,
                 growth: float = GROWTH, last_fraction: float = LAST_FRACTION) -> StagedDesign:
        return cls(schedule(total, first=first, growth=growth, last_fraction=last_fraction), alpha, spending)

    @property
    def total(self) -> int:
        return self.looks[-1]

    @property
    def information(self) -> tuple[float, ...]:
        return tuple(n / self.total for n in self.looks)

    def shares(self) -> tuple[float, ...]:
        """Each look's share of α (s_k = α_k / α, summing to 1): the divisor of the stage-adjusted p-value."""
        return tuple(x / self.alpha for x in self.levels)

    def look_index(self, n: int) -> int:
        if n not in self.looks:
            looks = ", ".join(f"{x:,}" for x in self.looks)
            raise EvalParityError(f"{n:,} docs is not a look of this design ({looks}): decide only at a look, "
                                  "after scoring up to it")
        return self.looks.index(n)


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 0.5:
        raise EvalParityError(f"α must lie in (0, 0.5), got {alpha!r}: pass e.g. --alpha 0.05")


# ---------------------------------------------------------------- the rule at one look
@dataclass(frozen=True)
class StagedResult:
    """One comparison at one look, in the style of a ``scipy.stats`` result. ``verdict`` is EQUIVALENT or
    DIFFERENT when settled, None to continue, and SHIFT or INCONCLUSIVE at the last look otherwise.
    ``level`` is α_k, the look's nominal level; ``beyond_threshold`` the level p_beyond was held to (α_k for a
    family of one; the Holm step's share after ``settle``); ``q_beyond`` the stage-adjusted p-value."""

    b: int
    c: int
    n: int
    look: int  # 0-based index into design.looks
    final: bool
    level: float
    p_equivalence: float
    p_beyond: float
    p_shift: float
    q_beyond: float
    beyond_threshold: float
    verdict: str | None

    @property
    def statistic(self) -> float:
        return (self.c - self.b) / self.n

    @property
    def settled(self) -> bool:
        return self.verdict in (verdict.EQUIVALENT, verdict.DIFFERENT)

    def confidence_interval(self, confidence_level: float | None = None) -> ConfidenceInterval:
        """The interval the verdict was read off: (1 − 2γ) at the level γ the claim was held to at this look
        (the Holm step's for DIFFERENT, α_k otherwise), so it lies inside the margin exactly when EQUIVALENT."""
        if confidence_level is None:
            confidence_level = 1 - 2 * (self.beyond_threshold if self.verdict == verdict.DIFFERENT else self.level)
        return binary_inference(self.b, self.c, self.n).confidence_interval(confidence_level)


def decide(b: int, c: int, n: int, design: StagedDesign, *, margin: float = 0.01,
           direction: str = "both") -> StagedResult:
    """The staged rule for one comparison alone (a family of one) at the look of ``n`` docs, from its
    cumulative counts: b docs right only in the reference, c right only in the cell."""
    return decide_all([b], [c], n, design, margin=margin, direction=direction)[0]


def decide_all(b: Sequence[int], c: Sequence[int], n: int, design: StagedDesign, *, margin: float = 0.01,
               direction: str = "both") -> list[StagedResult]:
    """``decide`` for the comparisons of one task at one look (they share its docs, so its n), the p-values
    computed at once (``paired.binary_tests`` is vectorised); each verdict is that of a family of one until
    ``settle`` applies the family rule."""
    b_, c_ = np.asarray(b, dtype=int), np.asarray(c, dtype=int)
    if b_.shape != c_.shape or np.any(b_ < 0) or np.any(c_ < 0) or np.any(b_ + c_ > n):
        raise EvalParityError(f"counts b = {list(b)}, c = {list(c)} do not fit {n} docs: pass each comparison's "
                              "cumulative ref-only and cell-only counts at the look")
    k = design.look_index(n)
    level, share = design.levels[k], design.shares()[k]
    final = k == len(design.looks) - 1
    p_eq, p_beyond, p_shift = (np.atleast_1d(x) for x in paired.binary_tests(b_, c_, n, margin, direction=direction))
    out = []
    for i in range(b_.size):
        q = float(p_beyond[i]) / share if share > 0 else math.inf
        r = StagedResult(int(b_[i]), int(c_[i]), n, k, final, level, float(p_eq[i]), float(p_beyond[i]),
                         float(p_shift[i]), q, level, None)
        out.append(replace(r, verdict=_verdict(r, r.p_beyond < level, design.alpha)))
    return out


def _verdict(r: StagedResult, beyond_rejected: bool, alpha: float) -> str | None:
    if r.p_equivalence < r.level:
        return verdict.EQUIVALENT
    if beyond_rejected:
        return verdict.DIFFERENT
    if not r.final:
        return None
    return verdict.SHIFT if r.p_shift < alpha else verdict.INCONCLUSIVE


@dataclass(frozen=True)
class TaskLook:
    """``settle``'s answer for one task at one look: each open comparison's result (verdict set over the
    family), and whether the task stops (every gating comparison on it settled, or its last look)."""

    results: tuple[StagedResult, ...]
    stops: bool
    new_different: int  # comparisons the family rule settled DIFFERENT now: add to ``already_different``


def settle(results: Sequence[StagedResult], *, alpha: float, family_size: int | None = None,
           already_different: int = 0) -> TaskLook:
    """The family rule at a task's look, over its comparisons still open (``decide`` at this look for each).
    EQUIVALENT needs no adjustment. DIFFERENT is Holm on the stage-adjusted p-values q = p_beyond / s_k over
    the sign-off's whole family of ``family_size`` gating comparisons (default: these), counting the
    ``already_different`` ones settled DIFFERENT before (at earlier looks or on other tasks) as stepped past:
    the j-th smallest q here is rejected at α / (K − r − j) while every smaller one was. The module docstring
    says why that keeps P(any false DIFFERENT) ≤ α over all the looks."""
    _check_alpha(alpha)
    k_family = len(results) if family_size is None else family_size
    if already_different < 0 or k_family < len(results) + already_different:
        raise EvalParityError(f"a family of {k_family} gating comparisons cannot hold {len(results)} open here and "
                              f"{already_different} already DIFFERENT: pass the sign-off's whole gating count")
    open_ = [i for i, r in enumerate(results) if r.p_equivalence >= r.level]
    thresholds = {i: math.nan for i in range(len(results))}
    order = sorted(open_, key=lambda i: results[i].q_beyond)
    for j, i in enumerate(order):
        gamma = alpha / (k_family - already_different - j)
        if not results[i].q_beyond < gamma:
            break
        thresholds[i] = gamma
    out = []
    for i, r in enumerate(results):
        rejected = math.isfinite(thresholds[i])
        step = replace(r, beyond_threshold=r.level / alpha * thresholds[i]) if rejected else r
        out.append(replace(step, verdict=_verdict(step, rejected, alpha)))
    new_different = sum(r.verdict == verdict.DIFFERENT for r in out)
    stops = all(r.settled or r.final for r in out)  # at the last look the task's docs have run out
    return TaskLook(tuple(out), stops, new_different)


def shift_family(results: Sequence[StagedResult], *, alpha: float, family_size: int) -> list[StagedResult]:
    """SHIFT or INCONCLUSIVE for the comparisons a staged sign-off left unsettled at their last look: Holm
    on their McNemar p-values over the whole gating family of ``family_size``, as the single-look rule
    decides SHIFT (``--multiple holm``). The comparisons settled EQUIVALENT or DIFFERENT (at any look) take no
    part; that is Holm over all ``family_size`` with their p-values set to 1, which rejects no more than Holm
    on the p-values every comparison would have had at its last look (Holm is monotone), so P(any false
    SHIFT) ≤ α. Each unsettled comparison's last look is its task's every doc, a fixed n: its p-value is an
    ordinary McNemar p-value. Settled results are returned unchanged, in order."""
    _check_alpha(alpha)
    open_ = [i for i, r in enumerate(results) if r.final and not r.settled]
    if family_size < len(open_):
        raise EvalParityError(f"a family of {family_size} gating comparisons cannot hold {len(open_)} unsettled "
                              "ones: pass the sign-off's whole gating count")
    shifted: set[int] = set()
    for j, i in enumerate(sorted(open_, key=lambda i: results[i].p_shift)):
        if not results[i].p_shift < alpha / (family_size - j):
            break
        shifted.add(i)
    return [replace(r, verdict=verdict.SHIFT if i in shifted else verdict.INCONCLUSIVE) if i in open_ else r
            for i, r in enumerate(results)]


# ---------------------------------------------------------------- exact operating characteristics
@dataclass(frozen=True)
class StagedOperating:
    """P(verdict) for one design point under the staged rule; ``expected_docs`` is E[docs scored];
    ``stop_equivalent``/``stop_different`` give P(stop so at look k); ``skipped`` the mass not enumerated."""

    equivalent: float
    different: float
    shift: float
    inconclusive: float
    expected_docs: float
    stop_equivalent: tuple[float, ...]
    stop_different: tuple[float, ...]
    skipped: float

    @property
    def unsettled(self) -> float:
        return self.shift + self.inconclusive


def _count_range(n: int, p: float) -> tuple[int, int]:
    """The counts of Binomial(n, p) outside whose TAIL on each side the DP does not carry mass."""
    if p <= 0 or n == 0:
        return 0, 0
    if p >= 1:
        return n, n
    return int(sps.binom.ppf(TAIL, n, p)), int(min(n, sps.binom.isf(TAIL, n, p)))


def _increment(m: int, p_b: float, p_c: float) -> tuple[np.ndarray, int, int]:
    """The multinomial pmf of (ref-only, cell-only) among m new docs, on its box of non-negligible counts."""
    i0, i1 = _count_range(m, p_b)
    j0, j1 = _count_range(m, p_c)
    i = np.arange(i0, i1 + 1)[:, None]
    j = np.arange(j0, j1 + 1)[None, :]
    q = p_c / (1 - p_b) if p_b < 1 else 0.0
    pmf = sps.binom.pmf(i, m, p_b) * (sps.binom.pmf(j, m - i, q) if q > 0 else (j == 0))
    return np.asarray(pmf, float), i0, j0


def staged_probabilities(design: StagedDesign, p_ref_only: float, p_cell_only: float, *, margin: float = 0.01,
                         direction: str = "both") -> StagedOperating:
    """Exact P(stop EQUIVALENT), P(stop DIFFERENT), P(SHIFT), P(INCONCLUSIVE) at the end and E[docs] for one
    comparison, by dynamic programming over the looks. The counts added between two looks are independent
    of the past (a multinomial of the new docs), so the distribution of (b, c) over the paths not yet stopped
    is carried from look to look by convolving with that increment; at each look the rule is applied to
    every table (the product's ``paired.binary_tests``) and the stopped mass taken out. Counts beyond each
    marginal's 1e-13 tail are dropped; the mass dropped is ``skipped``. With one look this is
    ``calibration.verdict_probabilities``."""
    p_b, p_c = float(p_ref_only), float(p_cell_only)
    if min(p_b, p_c) < 0 or p_b + p_c > 1:
        raise EvalParityError(f"rates ({p_b}, {p_c}) are not probabilities of a 2×2 table: pass P(ref only) and "
                              "P(cell only)")
    state, b0, c0, prev = np.ones((1, 1)), 0, 0, 0
    eq_k, diff_k = [], []
    shift = inconclusive = expected = 0.0
    for k, (n, level) in enumerate(zip(design.looks, design.levels)):
        kernel, i0, j0 = _increment(n - prev, p_b, p_c)
        state = np.clip(signal.convolve(state, kernel, method="auto"), 0.0, None)
        b0, c0 = b0 + i0, c0 + j0
        (blo, bhi), (clo, chi) = _count_range(n, p_b), _count_range(n, p_c)
        state = state[max(blo - b0, 0):max(bhi - b0 + 1, 0), max(clo - c0, 0):max(chi - c0 + 1, 0)]
        b0, c0 = max(b0, blo), max(c0, clo)
        live = np.nonzero(state > 0)
        w = state[live]
        b, c = live[0] + b0, live[1] + c0
        p_eq, p_beyond, p_shift = paired.binary_tests(b, c, n, margin, direction=direction)
        final = k == len(design.looks) - 1
        if final:  # the single-look rule's own classification, at the level the spending left
            v = verdict.classify(p_eq, p_beyond < level, p_shift < design.alpha, level)
            eq, diff = v == verdict.EQUIVALENT, v == verdict.DIFFERENT
            shift, inconclusive = float(w[v == verdict.SHIFT].sum()), float(w[v == verdict.INCONCLUSIVE].sum())
        else:
            eq = p_eq < level
            diff = ~eq & (p_beyond < level)
        eq_k.append(float(w[eq].sum()))
        diff_k.append(float(w[diff].sum()))
        expected += n * (eq_k[-1] + diff_k[-1])
        state[live[0][eq | diff], live[1][eq | diff]] = 0.0
        prev = n
    expected += design.total * (shift + inconclusive)
    total = sum(eq_k) + sum(diff_k) + shift + inconclusive
    return StagedOperating(sum(eq_k), sum(diff_k), shift, inconclusive, expected, tuple(eq_k), tuple(diff_k),
                           max(0.0, 1.0 - total))


def simulate(design: StagedDesign, p_ref_only: float, p_cell_only: float, *, reps: int, margin: float = 0.01,
             direction: str = "both", rng: np.random.Generator | None = None) -> StagedOperating:
    """Monte Carlo of the same rule (``reps`` paths of docs scored look by look): the check on the exact DP,
    and its stand-in where a point's state space is too big. ``skipped`` is 0; the MC error is the caller's
    to state (binomial, sqrt(p(1 − p)/reps))."""
    rng = rng or np.random.default_rng(0)
    b = np.zeros(reps, int)
    c = np.zeros(reps, int)
    open_ = np.ones(reps, bool)
    eq_k, diff_k, prev = [], [], 0
    shift = inconclusive = 0.0
    for k, (n, level) in enumerate(zip(design.looks, design.levels)):
        draws = rng.multinomial(n - prev, [p_ref_only, p_cell_only, 1 - p_ref_only - p_cell_only], size=reps)
        b, c, prev = b + draws[:, 0], c + draws[:, 1], n
        p_eq, p_beyond, p_shift = paired.binary_tests(b, c, n, margin, direction=direction)
        eq = open_ & (p_eq < level)
        diff = open_ & ~eq & (p_beyond < level)
        eq_k.append(eq.mean())
        diff_k.append(diff.mean())
        open_ &= ~(eq | diff)
        if k == len(design.looks) - 1:
            shift = float((open_ & (p_shift < design.alpha)).mean())
            inconclusive = float(open_.mean()) - shift
    expected = sum(n * (e + d) for n, e, d in zip(design.looks, eq_k, diff_k)) + design.total * (shift + inconclusive)
    return StagedOperating(float(sum(eq_k)), float(sum(diff_k)), shift, inconclusive, float(expected),
                           tuple(map(float, eq_k)), tuple(map(float, diff_k)), 0.0)


# ---------------------------------------------------------------- planner
@dataclass(frozen=True)
class StagedPlan:
    """The task size N to provide, the docs expected to be scored (E[docs], the rule stopping early), the exact
    P(EQUIVALENT) at N, and the single-look rule's n for the same power, for comparison."""

    total: float
    expected_docs: float
    power: float
    single_look_n: float
    design: StagedDesign | None


def n_for_equivalence_staged(margin: float, discordance: float, *, power_target: float = 0.8, alpha: float = 0.05,
                             true_difference: float = 0.0, spending: str = "obf", first: int = FIRST_LOOK,
                             growth: float = GROWTH, last_fraction: float = LAST_FRACTION,
                             step: float = 0.01, max_steps: int = 200) -> StagedPlan:
    """The smallest task size N, on a grid of ``step`` (1 %) from the single-look planner's n up, whose staged
    rule reaches P(EQUIVALENT) ≥ ``power_target`` by the exact DP (the P is saw-toothed in N, so a grid, not
    a root); with the E[docs] scored there. The single-look planner (``power.n_for_equivalence``) is the start:
    the staged rule's last look is stricter (α − f(t_{K−1})), its early looks add a little."""
    if not 0 < power_target < 1:
        raise EvalParityError(f"power must lie in (0, 1), got {power_target!r}: pass e.g. 0.8")
    single = power.n_for_equivalence(margin, discordance, alpha=alpha, power=power_target,
                                     true_difference=true_difference)
    if not math.isfinite(single):
        return StagedPlan(math.inf, math.inf, 0.0, math.inf, None)
    psi = max(discordance, abs(true_difference))
    p_b, p_c = (psi - true_difference) / 2, (psi + true_difference) / 2
    n = int(single)
    for _ in range(max_steps):
        design = StagedDesign.for_task(n, alpha=alpha, spending=spending, first=first, growth=growth,
                                       last_fraction=last_fraction)
        o = staged_probabilities(design, p_b, p_c, margin=margin)
        if o.equivalent >= power_target:
            return StagedPlan(float(n), o.expected_docs, o.equivalent, float(single), design)
        n = max(n + 1, math.ceil(n * (1 + step)))
    raise EvalParityError(f"no task size up to {n:,} docs reaches power {power_target} (margin {margin}, "
                          f"discordance {discordance}): raise the margin or lower the power")
