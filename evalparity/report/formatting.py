"""How numbers, intervals and verdicts read in the report, and the colour of each verdict: one place, so the
markdown and the HTML report (and every section and figure) print a value, and tint a verdict, the same way."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Tone:
    """A verdict's colours: its text on its tinted background in a table cell and the legend (WCAG AA: at
    least 4.5:1, tests/test_report_look.py computes it from the page's CSS), and the text colour alone for
    its marks in every figure, so a verdict has one colour wherever it is shown."""

    text: str
    background: str


# Distinct hues: green, red, violet (a change is shown, its size against the margin is not) and amber
# (not enough docs); grey for a metric reported without a margin.
TONES = {"EQUIVALENT": Tone("#116329", "#dafbe1"), "DIFFERENT": Tone("#a40e26", "#ffebe9"),
         "SHIFT": Tone("#6639ba", "#fbefff"), "INCONCLUSIVE": Tone("#7d4e00", "#fff8c5"),
         "NO MARGIN": Tone("#424a53", "#eaeef2")}
# The sign-off's statuses in the verdicts' colours: PASS reads as EQUIVALENT, FAIL and INCOMPLETE (neither
# is a pass) as DIFFERENT.
SIGN_OFF_TONES = {"PASS": TONES["EQUIVALENT"], "FAIL": TONES["DIFFERENT"], "INCOMPLETE": TONES["DIFFERENT"],
                  "INCONCLUSIVE": TONES["INCONCLUSIVE"]}
# What each verdict means, for the legend beside the matrix and the figures.
MEANING = {"EQUIVALENT": "the CI lies inside the margin",
           "DIFFERENT": "the CI lies outside the margin",
           "SHIFT": "a change is shown, its size against the margin is not",
           "INCONCLUSIVE": "neither, at this number of docs",
           "NO MARGIN": "reported without a margin: no verdict, never gates"}


def tone_class(word: str) -> str:
    """The CSS class that tints a verdict or a sign-off status ('NO MARGIN' -> 'tone-no-margin')."""
    return "tone-" + word.lower().replace(" ", "-")


def tone_of(text: str) -> str | None:
    """The verdict or status ``text`` starts with, when it has a colour ('DIFFERENT -1.25' -> 'DIFFERENT')."""
    for word in (*TONES, *SIGN_OFF_TONES):
        if text == word or text.startswith(word + " "):
            return word
    return None


def metric_label(metric: str, filt: str) -> str:
    """A metric and, unless it is lm-eval's 'none', its filter: gsm8k's two filters read apart."""
    return metric + ("" if filt == "none" else f" ({filt})")


def num(x, digits: int = 3) -> str:
    """A number to ``digits`` significant digits; '–' for a missing or non-finite one."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def count(x) -> str:
    """A whole number of docs with thousands separators; '–' for a missing one."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{int(x):,}"


def pp(x) -> str:
    """A proportion as signed percentage points (0.0123 -> '+1.23')."""
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{100 * x:+.2f}"


def effect(r) -> str:
    """A comparison's difference (cell − reference) in its unit: points for proportions, else the metric's."""
    if r.unit == "pp":
        return pp(r.effect) + " pp"
    return num(r.effect) + (f" {r.unit}" if r.unit else "")


def interval(r) -> str:
    """The bounds of the interval a comparison's verdict was decided on ('[-7.22, +7.22]'), '–' where none
    applies (a disagreement seen directly, such as a value on one side only)."""
    if r.ci_level is None or not math.isfinite(r.ci_level):
        return "–"
    if r.unit == "pp":
        return f"[{pp(r.ci_low)}, {pp(r.ci_high)}]"
    return f"[{num(r.ci_low)}, {num(r.ci_high)}]"


def level(r) -> str:
    """The interval's level ('90%'); '' where there is no interval."""
    return "" if r.ci_level is None or not math.isfinite(r.ci_level) else f"{100 * r.ci_level:.3g}%"


def ci(r) -> str:
    """The interval with its level ('90% [-7.22, +7.22]')."""
    bounds = interval(r)
    return bounds if bounds == "–" else f"{level(r)} {bounds}"


def noise_mark(r, noise_marked: bool) -> str:
    """In a run with a noise floor: '+noise' (drift beyond the backend's own noise), '≤noise', or ''."""
    if not noise_marked or r.beyond_noise is None or pd.isna(r.beyond_noise):
        return ""
    return "+noise" if r.beyond_noise else "≤noise"


def beyond_noise(r) -> str:
    """The noise-floor column: is the cross-backend discordance beyond the repeat pair's, and by how much."""
    if r.beyond_noise is None or pd.isna(r.beyond_noise):
        return "–"
    excess = r.discordance_excess_ci
    ci_s = f" [{pp(excess[0])}, {pp(excess[1])}]" if excess is not None and len(excess) == 2 else ""
    return (f"{'yes' if r.beyond_noise else 'no'} (excess {pp(r.discordance_excess)} pp{ci_s} over "
            f"{r.noise_floor_pair}, p = {num(r.p_beyond_noise)})")
