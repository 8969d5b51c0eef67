"""The decision rule: from one comparison's inference and its margin to a verdict, with the interval it was
decided on. Every verdict is read off one printed interval, the (1 − 2α) one (90 % at α = 0.05), against
the margin and 0:

- **EQUIVALENT** when the (1 − 2α) interval lies inside the acceptable region (−m, m): the two one-sided
  tests (TOST) at level α, p_equivalence < α. PASS needs every gating comparison EQUIVALENT, an
  intersection-union test valid at α with no multiplicity adjustment.
- **DIFFERENT** when the interval lies entirely outside [−m, m]. "Δ > m" and "Δ < −m" are one-sided claims,
  each at α, so the interval is the same (1 − 2α) one (the old rule doubled the p-value, Bonferroni over the
  sides, and so read DIFFERENT off a (1 − α) interval: at most half of α was ever spent). One caution keeps
  the level where the interval is wide against the margin: inside the margin both claims are false at once,
  so ``p_beyond`` adds to the near side's p-value the far side's tail in the same direction (the p-value at
  the other end of the margin). That term is below 10⁻⁵ unless the interval's half-width exceeds about
  1.2 m, so there DIFFERENT is the interval outside the margin; when it is wider, the verdict says so. Any
  DIFFERENT fails the sign-off, so these claims are controlled over the family of gating comparisons (Holm
  by default, ``--multiple bh``, ``none``); a comparison rejected at family threshold γ has its (1 − 2γ)
  interval outside the margin, and that interval is the one printed (the (1 − 2α) one for one comparison).
- **SHIFT** (within margin not shown) when a change is detected (Δ ≠ 0: the exact McNemar test for binary
  scores, two-sided at α, with the same family adjustment) but neither of the above holds. Such a test
  rejecting means the printed interval excludes 0 too. It does not fail the sign-off; it keeps it from
  PASS, and the reason gives the n that would settle it at the observed Δ.
- **INCONCLUSIVE** otherwise. Where the interval excludes 0 and the two-sided test does not reject (the
  interval's ends are one-sided 5 % each), the reason says exactly that, never "no change".

Sign-off: PASS when every gating comparison is EQUIVALENT; FAIL when any is DIFFERENT; otherwise
INCONCLUSIVE (exit 4, SHIFT included).

Directions (``--direction``): ``both`` (the default, (−m, m) as above); ``worse`` (non-inferiority: only a
drop beyond m fails; acceptable region (−m, ∞); EQUIVALENT means "not worse by m" and SHIFT means "a drop
is shown"). For a mean |Δ| (loglikelihoods) the region is [0, m). With one finite bound there is no far
side, and a family threshold γ again corresponds to the (1 − 2γ) two-sided interval.

Interval ends are printed with as many digits as it takes to put each on its own side of the margin's ends
and 0 (``ci_str``): two comparisons with different verdicts never print the same interval.
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
    eq = []
    if math.isfinite(margin.high):
        eq.append(inf.pvalue_less(margin.high))
    if math.isfinite(margin.low):
        eq.append(inf.pvalue_greater(margin.low))
    if p_shift is None:
        p_shift = inf.pvalue_zero() if margin.sides == 2 else (
            inf.pvalue_less(0.0) if math.isfinite(margin.low) else inf.pvalue_greater(0.0))
    return Tests(float(max(eq)), beyond_pvalue(inf, margin), float(p_shift))


def beyond_pvalue(inf: PairedInference, margin: Margin) -> float:
    """p-value of "Δ lies beyond the margin": the one-sided p-value at the end the data point past, plus,
    with two finite ends, the far end's tail in the same direction. The claims "Δ > high" and "Δ < low" are
    one-sided (each at α, no doubling), but where Δ lies inside both are false, so the chance of either is
    the sum of two tails; for a symmetric statistic that is what the far end's p-value adds (the exact
    enumeration found 0.081 > α at ψ = 40 %, m = 0.1 pp without it). It is negligible unless the interval
    is wide against the margin. ``verdict.DIFFERENT`` at γ implies the (1 − 2γ) interval lies outside."""
    up = down = math.inf
    if math.isfinite(margin.high):
        up = inf.pvalue_greater(margin.high) + (inf.pvalue_greater(margin.low) if math.isfinite(margin.low) else 0.0)
    if math.isfinite(margin.low):
        down = inf.pvalue_less(margin.low) + (inf.pvalue_less(margin.high) if math.isfinite(margin.high) else 0.0)
    return float(min(1.0, up, down))


def classify(p_equivalence, beyond_rejected, shift_rejected, alpha: float):
    """Vectorised verdicts: EQUIVALENT if p_equivalence < alpha, else DIFFERENT where the family rejected
    "inside the margin", else SHIFT where it rejected "no change", else INCONCLUSIVE."""
    p_eq = np.asarray(p_equivalence, float)
    out = np.where(p_eq < alpha, EQUIVALENT,
                   np.where(np.asarray(beyond_rejected, bool), DIFFERENT,
                            np.where(np.asarray(shift_rejected, bool), SHIFT, INCONCLUSIVE)))
    return out.astype(object) if out.ndim else str(out)


def decisive_level(verdict: str, alpha: float, beyond_threshold: float, sides: int = 2) -> float:
    """The level of the interval a verdict was decided on: (1 − 2γ) for DIFFERENT at family threshold γ
    (one-sided claims, whatever ``sides``: kept for the callers), (1 − 2α) for every other verdict."""
    if verdict == DIFFERENT:
        return 1 - 2 * beyond_threshold
    return 1 - 2 * alpha


# ---------------------------------------------------------------- words
def fmt(x: float, unit: str, decimals: int | None = None) -> str:
    if not math.isfinite(x):
        return "+∞" if x > 0 else "−∞"
    if unit == "pp":
        return f"{100 * x:+.{2 if decimals is None else decimals}f} pp"
    if decimals is not None:
        return f"{x:+.{decimals}g}" + (f" {unit}" if unit else "")
    return f"{x:+.3g}" + (f" {unit}" if unit else "")


def span(x: float, unit: str) -> str:
    if unit == "pp":
        return f"{100 * x:.2f} pp"
    return f"{x:.3g}" + (f" {unit}" if unit else "")


def level_str(level: float) -> str:
    pct = 100 * level
    return f"{pct:.0f}%" if abs(pct - round(pct)) < 1e-9 else f"{pct:.3g}%"


MAX_DECIMALS = 15


def _distinct(x: float, refs: Iterable[float], unit: str) -> str:
    """``x`` with the fewest digits (2 decimals in pp, 3 significant otherwise, at least) at which it prints
    differently from every finite reference point it differs from, so the printed end sits on the same side
    of each as the number does (rounding is monotone): an end of 0.997 pp against a margin of 1 pp prints
    "+0.997 pp", not "+1.00 pp"."""
    start = 2 if unit == "pp" else 3
    for d in range(start, MAX_DECIMALS + 1):
        text = fmt(x, unit, d)
        if all(r == x or fmt(r, unit, d) != text for r in refs if math.isfinite(r)):
            return text
    return fmt(x, unit, MAX_DECIMALS)


def ci_str(ci: ConfidenceInterval, level: float, unit: str, margin: Margin | None = None) -> str:
    """"90% CI [low, high]", the ends printed apart from the margin's ends and 0 when ``margin`` is given."""
    refs = (0.0, margin.low, margin.high) if margin is not None else (0.0,)
    return f"{level_str(level)} CI [{_distinct(ci.low, refs, unit)}, {_distinct(ci.high, refs, unit)}]"


def reason(*, verdict: str, estimate: float, ci: ConfidenceInterval, level: float, margin: Margin,
           t: Tests, p_beyond_adj: float, p_shift_adj: float, alpha: float, multiple: str, n: int,
           estimand: str = "Δ",
           shift_test: str = "", mdd: float | None = None, n_needed: float | None = None,
           n_needed_at_zero: float | None = None) -> str:
    """The verdict in words, naming the interval it was decided on and its level; every statement about
    the interval (inside, beyond, on which side of 0) is true of the interval as printed."""
    u = margin.unit
    head = f"{estimand} = {fmt(estimate, u)}, {ci_str(ci, level, u, margin)}"
    adj = "" if multiple == "none" else f", {multiple}-adjusted"

    def p_adj(raw: float, adjusted: float) -> str:
        return f"{raw:.2g}" if multiple == "none" else f"{raw:.2g}{adj} {adjusted:.2g}"

    if verdict == EQUIVALENT:
        where = _inside_words(margin)
        extra = (f"; a shift is detected ({shift_test} p = {p_shift_adj:.2g}{adj}) but it is within the margin"
                 if p_shift_adj < alpha else "")
        return f"{head} {where} (equivalence p = {t.p_equivalence:.2g}){extra}"
    if verdict == DIFFERENT:
        at = ("" if math.isclose(level, 1 - 2 * alpha) else
              "; the CI's level is 1 − 2 × the family threshold this comparison was rejected at")
        return f"{head} {_outside_words(margin)} (beyond-margin p = {p_adj(t.p_beyond, p_beyond_adj)}{at})"
    tail = _settle_words(margin, estimate, n, mdd, n_needed, n_needed_at_zero)
    beyond = _beyond_note(ci, margin, t, p_beyond_adj, alpha, multiple)
    if not math.isfinite(margin.low):  # a mean |Δ| against a tolerance: the shift test is of mean Δ, not of it
        shown = "a shift in mean Δ is shown" if verdict == SHIFT else "no shift in mean Δ is shown"
        return (f"{head} {_not_inside_words(margin)} and {shown} ({shift_test} p = {p_shift_adj:.2g}{adj}) at "
                f"n = {n:,}{beyond}{tail}")
    zero = _zero_side(ci)
    if verdict == SHIFT:
        return (f"{head}: a change is shown ({shift_test} p = {p_shift_adj:.2g}{adj}) and the CI {zero}, but it "
                f"{_not_inside_words(margin)}, so within-margin is not shown{beyond}{tail}")
    if zero == "contains 0":
        change = f"contains 0: no change is shown ({shift_test} p = {p_shift_adj:.2g}{adj})"
    else:  # its ends are one-sided at α; the change test is two-sided at α (or adjusted over the family)
        change = (f"{zero} (each end is one-sided at {level_str(alpha)}), but a change is not shown by the "
                  f"two-sided test at α ({shift_test} p = {p_shift_adj:.2g}{adj})")
    return f"{head} {_not_inside_words(margin)} and {change} at n = {n:,}{beyond}{tail}"


def _zero_side(ci: ConfidenceInterval) -> str:
    if ci.low > 0:
        return "lies above 0"
    if ci.high < 0:
        return "lies below 0"
    return "contains 0"


def _beyond_note(ci: ConfidenceInterval, m: Margin, t: Tests, p_adj: float, alpha: float, multiple: str) -> str:
    """Why an interval beyond the margin is not DIFFERENT (the wide case, or the family's threshold); what
    DIFFERENT would need otherwise."""
    outside = ci.high < m.low or ci.low > m.high
    if not outside:
        return f" (DIFFERENT would need the CI entirely {_beyond_words(m)})"
    if multiple != "none" and t.p_beyond < alpha <= p_adj:
        return (f" (it lies {_beyond_words(m)}, but not at the family threshold: beyond-margin p = "
                f"{t.p_beyond:.2g}, {multiple}-adjusted {p_adj:.2g})")
    return (f" (it lies {_beyond_words(m)}, but it is wide against the margin: both claims beyond the margin "
            f"are false at once inside it, so the beyond-margin p-value counts the far end's tail too: "
            f"p = {t.p_beyond:.2g} ≥ {alpha:g})")


def _settle_words(m: Margin, estimate: float, n: int, mdd, n_needed, n_needed_at_zero) -> str:
    u = m.unit
    extras = []
    if mdd is not None and math.isfinite(mdd):
        extras.append(f"smallest detectable difference at this n ≈ {span(mdd, u)}")
    on_margin = estimate in (m.low, m.high)
    if n_needed is not None and math.isfinite(n_needed) and n_needed > 1e9:
        extras.append("more than a billion docs would be needed to settle it at the observed Δ")
    elif n_needed is not None and math.isfinite(n_needed) and n_needed > n:
        at0 = (f" ({int(n_needed_at_zero):,} if the true Δ were 0)"
               if n_needed_at_zero is not None and math.isfinite(n_needed_at_zero)
               and int(n_needed_at_zero) != int(n_needed) else "")
        extras.append(f"≈ {int(n_needed):,} docs would settle it at the observed Δ{at0}")
    elif n_needed is not None and not math.isfinite(n_needed):
        extras.append("the observed Δ sits on the margin: no n settles it" if on_margin else
                      "more than a billion docs would be needed to settle it at the observed Δ")
    return ("; " + "; ".join(extras)) if extras else ""


def _beyond_words(m: Margin) -> str:
    if m.sides == 2:
        return f"outside {m.describe()}"
    if math.isfinite(m.low):
        return f"below {fmt(m.low, m.unit)}"
    return f"above {span(m.high, m.unit)}"


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
