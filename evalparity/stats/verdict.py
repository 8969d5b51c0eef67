"""The decision rule: from one comparison's inference and its margin to a verdict, with the interval it was
decided on.

Per comparison, with margin m in the metric's own unit and level α (``--alpha``, default 0.05):

- **EQUIVALENT** when the (1 − 2α) confidence interval lies inside the acceptable region (−m, m). This is
  the two one-sided tests (TOST) at level α: p_equivalence < α.
- **DIFFERENT** when the change is shown to exceed the margin: the interval lies entirely outside
  [−m, m]. Any DIFFERENT fails the sign-off, so "some comparison is beyond its margin" is a union claim
  and its error is controlled over the family of gating comparisons (Holm by default, ``--multiple bh``
  for Benjamini-Hochberg, ``none``). The p-value of "|Δ| > m" is 2 · min of the two one-sided p-values
  at ±m (Bonferroni over the two sides, valid however small m is); a comparison rejected at family
  threshold γ has its (1 − γ) interval outside [−m, m], and that interval, at that level, is the one
  printed.
- **SHIFT** (within margin not shown) when a change is detected (Δ ≠ 0: exact McNemar for binary scores,
  the same family adjustment) but neither of the above holds. It does not fail the sign-off; it keeps it
  from PASS, and the reason gives the n that would settle it at the observed Δ.
- **INCONCLUSIVE** otherwise, with the smallest detectable difference and the n needed.

Sign-off: PASS when every gating comparison is EQUIVALENT. That is an intersection-union test, valid at α
with no multiplicity adjustment, so no Holm is applied to the equivalence p-values and a comparison's
verdict does not depend on how many others ran. FAIL when any is DIFFERENT; otherwise INCONCLUSIVE (exit 4,
SHIFT included).

Directions (``--direction``): ``both`` (the default, (−m, m) as above); ``worse`` (non-inferiority: only a
drop beyond m fails; acceptable region (−m, ∞); EQUIVALENT means "not worse by m" and SHIFT means "a drop
is shown"). For a mean |Δ| (loglikelihoods) the region is [0, m): one bound, so the one-sided tests carry
no doubling. With one finite bound a family threshold γ corresponds to the (1 − 2γ) two-sided interval.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from evalparity.stats.inference import PairedInference
from evalparity.stats.results import ConfidenceInterval

EQUIVALENT, DIFFERENT, SHIFT, INCONCLUSIVE = "EQUIVALENT", "DIFFERENT", "SHIFT", "INCONCLUSIVE"
NO_MARGIN = "NO MARGIN"  # a metric reported without a margin: no verdict, never gates
PASS, FAIL, INCOMPLETE = "PASS", "FAIL", "INCOMPLETE"
VERDICTS = (EQUIVALENT, DIFFERENT, SHIFT, INCONCLUSIVE, NO_MARGIN)


@dataclass(frozen=True)
class Margin:
    """The acceptable region (low, high) for the estimand, in its own unit; one end may be infinite."""

    low: float
    high: float
    unit: str = "pp"  # "pp": a difference of proportions; "nats"; "": the metric's own unit

    @classmethod
    def around_zero(cls, m: float, direction: str = "both", unit: str = "pp") -> Margin:
        if direction == "worse":
            return cls(-m, math.inf, unit)
        if direction != "both":
            raise ValueError(f"unknown direction {direction!r}: use both or worse")
        return cls(-m, m, unit)

    @classmethod
    def below(cls, m: float, unit: str) -> Margin:
        """For a non-negative estimand (a mean |Δ|): acceptable below m."""
        return cls(-math.inf, m, unit)

    @property
    def sides(self) -> int:
        return int(math.isfinite(self.low)) + int(math.isfinite(self.high))

    @property
    def size(self) -> float:
        return min(abs(x) for x in (self.low, self.high) if math.isfinite(x))

    def describe(self) -> str:
        if math.isfinite(self.low) and math.isfinite(self.high) and self.low == -self.high:
            return f"±{span(self.high, self.unit)}"
        if math.isfinite(self.low) and math.isfinite(self.high):
            return f"({fmt(self.low, self.unit)}, {fmt(self.high, self.unit)})"
        if math.isfinite(self.low):
            return f"above {fmt(self.low, self.unit)}"
        return f"below {span(self.high, self.unit)}"


@dataclass(frozen=True)
class Tests:
    """One comparison's p-values before any family adjustment."""

    p_equivalence: float  # H0: outside the region; < α is EQUIVALENT (no adjustment: intersection-union)
    p_beyond: float  # H0: inside [low, high]; small = beyond the margin (adjusted over the family)
    p_shift: float  # H0: Δ = 0 (or, for ``worse``, Δ ≥ 0)


def tests(inf: PairedInference, margin: Margin, *, p_shift: float | None = None) -> Tests:
    eq, out = [], []
    if math.isfinite(margin.high):
        eq.append(inf.pvalue_less(margin.high))
        out.append(inf.pvalue_greater(margin.high))
    if math.isfinite(margin.low):
        eq.append(inf.pvalue_greater(margin.low))
        out.append(inf.pvalue_less(margin.low))
    if p_shift is None:
        p_shift = inf.pvalue_zero() if margin.sides == 2 else (
            inf.pvalue_less(0.0) if math.isfinite(margin.low) else inf.pvalue_greater(0.0))
    return Tests(float(max(eq)), float(min(1.0, len(out) * min(out))), float(p_shift))


def classify(p_equivalence, beyond_rejected, shift_rejected, alpha: float):
    """Vectorised verdicts: EQUIVALENT if p_equivalence < alpha, else DIFFERENT where the family rejected
    "inside the margin", else SHIFT where it rejected "no change", else INCONCLUSIVE."""
    p_eq = np.asarray(p_equivalence, float)
    out = np.where(p_eq < alpha, EQUIVALENT,
                   np.where(np.asarray(beyond_rejected, bool), DIFFERENT,
                            np.where(np.asarray(shift_rejected, bool), SHIFT, INCONCLUSIVE)))
    return out.astype(object) if out.ndim else str(out)


def decisive_level(verdict: str, alpha: float, beyond_threshold: float, sides: int) -> float:
    """The level of the interval a verdict was decided on: (1 − 2α) for EQUIVALENT (and printed for SHIFT
    and INCONCLUSIVE, whose margin question it leaves open); (1 − 2γ/sides) for DIFFERENT at family
    threshold γ."""
    if verdict == DIFFERENT:
        return 1 - 2 * beyond_threshold / sides
    return 1 - 2 * alpha


# ---------------------------------------------------------------- words
def fmt(x: float, unit: str) -> str:
    if not math.isfinite(x):
        return "+∞" if x > 0 else "−∞"
    if unit == "pp":
        return f"{100 * x:+.2f} pp"
    return f"{x:+.3g}" + (f" {unit}" if unit else "")


def span(x: float, unit: str) -> str:
    if unit == "pp":
        return f"{100 * x:.2f} pp"
    return f"{x:.3g}" + (f" {unit}" if unit else "")


def level_str(level: float) -> str:
    pct = 100 * level
    return f"{pct:.0f}%" if abs(pct - round(pct)) < 1e-9 else f"{pct:.3g}%"


def ci_str(ci: ConfidenceInterval, level: float, unit: str) -> str:
    return f"{level_str(level)} CI [{fmt(ci.low, unit)}, {fmt(ci.high, unit)}]"


def reason(*, verdict: str, estimate: float, ci: ConfidenceInterval, level: float, margin: Margin,
           t: Tests, p_beyond_adj: float, p_shift_adj: float, alpha: float, multiple: str, n: int,
           estimand: str = "Δ",
           shift_test: str = "", mdd: float | None = None, n_needed: float | None = None,
           n_needed_at_zero: float | None = None) -> str:
    """The verdict in words, naming the interval it was decided on and its level."""
    u = margin.unit
    head = f"{estimand} = {fmt(estimate, u)}, {ci_str(ci, level, u)}"
    adj = "" if multiple == "none" else f", {multiple}-adjusted"

    def p_adj(raw: float, adjusted: float) -> str:
        return f"{raw:.2g}" if multiple == "none" else f"{raw:.2g}{adj} {adjusted:.2g}"

    if verdict == EQUIVALENT:
        where = _inside_words(margin)
        extra = (f"; a shift is detected ({shift_test} p = {p_shift_adj:.2g}{adj}) but it is within the margin"
                 if p_shift_adj < alpha else "")
        return f"{head} {where} (equivalence p = {t.p_equivalence:.2g}){extra}"
    if verdict == DIFFERENT:
        return (f"{head} {_outside_words(margin)} (beyond-margin p = {p_adj(t.p_beyond, p_beyond_adj)}; "
                "the CI's level is the family threshold this comparison was rejected at)")
    extras = []
    if mdd is not None and math.isfinite(mdd):
        extras.append(f"smallest detectable difference at this n ≈ {span(mdd, u)}")
    if n_needed is not None and math.isfinite(n_needed) and n_needed > 1e9:
        extras.append("more than a billion docs would be needed to settle it at the observed Δ")
    elif n_needed is not None and math.isfinite(n_needed) and n_needed > n:
        at0 = (f" ({int(n_needed_at_zero):,} if the true Δ were 0)"
               if n_needed_at_zero is not None and math.isfinite(n_needed_at_zero)
               and int(n_needed_at_zero) != int(n_needed) else "")
        extras.append(f"≈ {int(n_needed):,} docs would settle it at the observed Δ{at0}")
    elif n_needed is not None and not math.isfinite(n_needed):
        extras.append("the observed Δ sits on the margin: no n settles it")
    tail = ("; " + "; ".join(extras)) if extras else ""
    # DIFFERENT would need a wider interval (at the family threshold, 95% or more) outside the margin.
    need = (f"DIFFERENT would need the {level_str(1 - 2 * alpha / margin.sides)} or stricter CI entirely beyond "
            "the margin")
    if verdict == SHIFT:
        return (f"{head}: a change is shown ({shift_test} p = {p_shift_adj:.2g}{adj}) but the CI "
                f"{_not_inside_words(margin)}, so within-margin is not shown ({need}){tail}")
    return (f"{head} {_not_inside_words(margin)} and no change is shown ({shift_test} p = "
            f"{p_shift_adj:.2g}{adj}) at n = {n:,} ({need}){tail}")


def _inside_words(m: Margin) -> str:
    if m.sides == 2:
        return f"lies inside {m.describe()}"
    if math.isfinite(m.low):
        return f"has its lower end above {fmt(m.low, m.unit)}"
    return f"has its upper end below {span(m.high, m.unit)}"


def _not_inside_words(m: Margin) -> str:
    if m.sides == 2:
        return f"is not inside {m.describe()}"
    if math.isfinite(m.low):
        return f"does not have its lower end above {fmt(m.low, m.unit)}"
    return f"does not have its upper end below {span(m.high, m.unit)}"


def _outside_words(m: Margin) -> str:
    if m.sides == 2:
        return f"lies outside {m.describe()}"
    if math.isfinite(m.low):
        return f"has its upper end below {fmt(m.low, m.unit)}"
    return f"has its lower end above {span(m.high, m.unit)}"


def sign_off(verdicts: Iterable[str]) -> tuple[str, str]:
    """Overall sign-off over gating verdicts: PASS only when all are EQUIVALENT.

    Returns (status, reason) where status is PASS, FAIL (some DIFFERENT) or INCONCLUSIVE (some SHIFT or
    INCONCLUSIVE, none DIFFERENT).
    """
    vs = list(verdicts)
    if not vs:
        return INCONCLUSIVE, "no gating comparisons were made"
    counts = {v: vs.count(v) for v in (DIFFERENT, SHIFT, INCONCLUSIVE)}
    rest = ", ".join(f"{k} {v}" for v, k in counts.items() if k and v != DIFFERENT)
    if counts[DIFFERENT]:
        return FAIL, f"{counts[DIFFERENT]} of {len(vs)} comparisons DIFFERENT" + (f", {rest}" if rest else "")
    if counts[SHIFT] or counts[INCONCLUSIVE]:
        return INCONCLUSIVE, f"{rest} of {len(vs)} comparisons, none DIFFERENT"
    return PASS, f"all {len(vs)} comparisons EQUIVALENT"
