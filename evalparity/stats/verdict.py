"""From adjusted p-values to a verdict with its reason in words.

A comparison is:
- EQUIVALENT when the equivalence test (TOST) rejects "|Δ| >= margin" after adjustment: the data show the
  difference is inside the declared margin. A significant but smaller-than-margin shift is still
  EQUIVALENT, and the reason says so.
- DIFFERENT when the difference test rejects "Δ = 0" after adjustment and equivalence is not shown, or
  when the cell produced non-finite values the reference did not.
- INCONCLUSIVE otherwise: neither claim is supported at this n. The reason gives the minimum detectable
  difference and the n needed to reach the margin, so the user knows what would settle it.

The sign-off passes only when every gating comparison is EQUIVALENT. Because that is an intersection of
claims, it is also a valid level-α test of "all comparisons are within their margins".
"""

from __future__ import annotations

import math
from collections.abc import Iterable

EQUIVALENT, DIFFERENT, INCONCLUSIVE = "EQUIVALENT", "DIFFERENT", "INCONCLUSIVE"
PASS, FAIL = "PASS", "FAIL"


def _fmt(x: float, unit: str) -> str:
    if unit == "pp":
        return f"{100 * x:+.2f} pp"
    return f"{x:+.3g}"


def _span(x: float, unit: str) -> str:
    return f"{100 * x:.2f} pp" if unit == "pp" else f"{x:.3g}"


def decide(
    *,
    effect: float,
    ci_low: float,
    ci_high: float,
    p_diff_adj: float,
    p_equiv_adj: float,
    margin: float,
    alpha: float,
    n: int,
    unit: str = "pp",
    mdd: float | None = None,
    n_needed: float | None = None,
    n_nonfinite: int = 0,
) -> tuple[str, str]:
    """Return (verdict, reason). ``unit`` 'pp' formats a difference of proportions in percentage points."""
    if n_nonfinite:
        return DIFFERENT, f"the cell produced {n_nonfinite} non-finite values where the reference did not"
    if n == 0:
        return INCONCLUSIVE, "no paired samples to compare"
    ci = f"[{_fmt(ci_low, unit)}, {_fmt(ci_high, unit)}]"
    shift = f"Δ = {_fmt(effect, unit)}, CI {ci}"
    if p_equiv_adj < alpha:
        if p_diff_adj < alpha:
            return EQUIVALENT, (f"{shift}: a statistically significant shift, but within ±{_span(margin, unit)} "
                                f"(equivalence p = {p_equiv_adj:.2g})")
        return EQUIVALENT, f"{shift} lies within ±{_span(margin, unit)} (equivalence p = {p_equiv_adj:.2g})"
    if p_diff_adj < alpha:
        return DIFFERENT, f"{shift}: a real change (p = {p_diff_adj:.2g}) not shown to be within ±{_span(margin, unit)}"
    reason = f"{shift}: not shown different (p = {p_diff_adj:.2g}) nor within ±{_span(margin, unit)} at n = {n}"
    extras = []
    if mdd is not None and math.isfinite(mdd):
        extras.append(f"smallest detectable difference at this n ≈ {_span(mdd, unit)}")
    if n_needed is not None and math.isfinite(n_needed):
        extras.append(f"≈ {int(n_needed):,} docs needed to show ±{_span(margin, unit)}")
    if extras:
        reason += "; " + "; ".join(extras)
    return INCONCLUSIVE, reason


def sign_off(verdicts: Iterable[str]) -> tuple[str, str]:
    """Overall sign-off over gating verdicts: PASS only when all are EQUIVALENT.

    Returns (status, reason) where status is PASS, FAIL (some DIFFERENT) or INCONCLUSIVE.
    """
    vs = list(verdicts)
    if not vs:
        return INCONCLUSIVE, "no gating comparisons were made"
    n_diff = vs.count(DIFFERENT)
    n_inc = vs.count(INCONCLUSIVE)
    if n_diff:
        return FAIL, f"{n_diff} of {len(vs)} comparisons DIFFERENT" + (f", {n_inc} INCONCLUSIVE" if n_inc else "")
    if n_inc:
        return INCONCLUSIVE, f"{n_inc} of {len(vs)} comparisons INCONCLUSIVE, none DIFFERENT"
    return PASS, f"all {len(vs)} comparisons EQUIVALENT"
