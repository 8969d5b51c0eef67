"""How numbers, intervals and verdicts read in the report: one place, so the markdown and the HTML report
(and every section) print a value the same way."""

from __future__ import annotations

import math

import pandas as pd

# A verdict's colour in the HTML report: a table cell whose first word is one of these is tinted with it.
COLORS = {"EQUIVALENT": "#1a7f37", "DIFFERENT": "#cf222e", "INCONCLUSIVE": "#bf8700", "SHIFT": "#9a6700",
          "PASS": "#1a7f37", "FAIL": "#cf222e", "INCOMPLETE": "#cf222e"}


def num(x, digits: int = 3) -> str:
    """A number to ``digits`` significant digits; '–' for a missing or non-finite one."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def pp(x) -> str:
    """A proportion as signed percentage points (0.0123 -> '+1.23')."""
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{100 * x:+.2f}"


def effect(r) -> str:
    """A comparison's difference (cell − reference) in its unit: points for proportions, else the metric's."""
    if r.unit == "pp":
        return pp(r.effect)
    return num(r.effect) + (f" {r.unit}" if r.unit else "")


def ci(r) -> str:
    """The interval a comparison's verdict was decided on, with its level ("–" where none applies: a
    disagreement seen directly, such as a value on one side only)."""
    if r.ci_level is None or not math.isfinite(r.ci_level):
        return "–"
    if r.unit == "pp":
        return f"{100 * r.ci_level:.3g}% [{pp(r.ci_low)}, {pp(r.ci_high)}]"
    return f"{100 * r.ci_level:.3g}% [{num(r.ci_low)}, {num(r.ci_high)}]"


def verdict_cell(r, noise_marked: bool) -> str:
    """One cell of the verdict matrix: verdict, difference and, in a run with a noise floor, whether the
    drift is beyond it."""
    nf = "" if not noise_marked or r.beyond_noise is None or pd.isna(r.beyond_noise) else (
        " +noise" if r.beyond_noise else " ≤noise")
    return f"{r.verdict} {effect(r)}{nf}"


def beyond_noise(r) -> str:
    """The noise-floor column: is the cross-backend discordance beyond the repeat pair's, and by how much."""
    if r.beyond_noise is None or pd.isna(r.beyond_noise):
        return "–"
    excess = r.discordance_excess_ci
    ci_s = f" [{pp(excess[0])}, {pp(excess[1])}]" if excess is not None and len(excess) == 2 else ""
    return (f"{'yes' if r.beyond_noise else 'no'} (excess {pp(r.discordance_excess)} pp{ci_s} over "
            f"{r.noise_floor_pair}, p = {num(r.p_beyond_noise)})")
