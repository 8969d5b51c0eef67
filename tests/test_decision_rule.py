"""The tightened decision rule (issue 25, item 7): EQUIVALENT and DIFFERENT are both read off the one
(1 − 2α) interval, the wording says only what is true of the interval as printed, and the printed digits
tell apart intervals whose verdicts differ. Checked over exhaustive grids of small (n, b, c) tables, by
exact enumeration of every table, and on the audit's own cases."""

from __future__ import annotations

import math
import re
from functools import cache

import numpy as np
import pytest
from decide import decide_counts

from evalparity.stats import calibration, inference, multiplicity, paired, verdict
from evalparity.stats.options import StatsOptions

ALPHA = 0.05
NUMBER = r"([+\-−]?\d+(?:\.\d+)?)"
CI_RE = re.compile(rf"(\d+(?:\.\d+)?)% CI \[{NUMBER} pp, {NUMBER} pp\]")


@cache
def decide(n: int, b: int, c: int, margin: float = 0.01, direction: str = "both"):
    """One comparison decided as ``compare.decide_all`` decides a family of one: the same functions
    (``tests`` with McNemar for the change, the family thresholds, ``classify``, ``decisive_level``, the
    interval and ``reason``) without building per-doc arrays, so whole grids of tables stay fast.
    ``test_the_direct_path_equals_the_product_path`` checks it against the product's path."""
    inf = inference.binary_inference(b, c, n)
    m = verdict.Margin.around_zero(margin, direction)
    t = verdict.tests(inf, m, p_shift=paired.mcnemar_exact_pvalue(b, c) if direction == "both" else None)
    thr_b = float(multiplicity.rejection_thresholds(np.array([t.p_beyond]), ALPHA, "holm")[0])
    thr_s = float(multiplicity.rejection_thresholds(np.array([t.p_shift]), ALPHA, "holm")[0])
    v = verdict.classify(t.p_equivalence, math.isfinite(thr_b), math.isfinite(thr_s), ALPHA)
    level = verdict.decisive_level(v, ALPHA, thr_b, m.sides)
    ci = inf.confidence_interval(level)
    why = verdict.reason(verdict=v, estimate=inf.estimate, ci=ci, level=level, margin=m, t=t,
                         p_beyond_adj=t.p_beyond, p_shift_adj=t.p_shift, alpha=ALPHA, multiple="holm", n=n,
                         shift_test="McNemar exact")
    return v, level, ci, why, t


def small_tables(max_n: int):
    for n in range(1, max_n + 1):
        for b in range(n + 1):
            for c in range(n + 1 - b):
                yield n, b, c


def printed_interval(why: str) -> tuple[float, float, float]:
    """(level, low, high) as the reason prints them, in pp."""
    m = CI_RE.search(why)
    assert m, why
    return tuple(float(x.replace("−", "-")) for x in m.groups())  # type: ignore[return-value]


GRID = [(n, b, c, m) for m in (0.01, 0.05, 0.2) for n, b, c in small_tables(22)] + [
    (n, b, c, 0.01) for n in (100, 298, 299, 300, 1000, 3000) for b in range(0, 40, 3) for c in range(0, 40, 3)]


@pytest.mark.parametrize("margin", [0.01, 0.05, 0.2])
def test_each_verdict_reads_off_the_printed_interval(margin):
    """Over every table of up to 22 docs (and a grid up to 3,000), with one comparison: EQUIVALENT exactly
    when the printed interval lies inside the margin, DIFFERENT exactly when it lies outside (unless the
    reason says the interval is wide against the margin, half-width above 1.2 m), the (1 − 2α) interval
    for both; SHIFT only beside an interval that excludes 0; "no change is shown" only beside one that
    contains 0. The comparisons use the numbers as printed: the printed ends must sit on the same side of
    the margin and 0 as the real ones."""
    for n, b, c, m in GRID:
        if m != margin:
            continue
        v, level, ci, why, _ = decide(n, b, c, m)
        lvl, lo, hi = printed_interval(why)
        mp = 100 * m
        assert lvl == pytest.approx(100 * (1 - 2 * ALPHA)), why  # one comparison: always the 90% interval
        inside, outside = -mp < lo and hi < mp, hi < -mp or lo > mp
        assert (v == verdict.EQUIVALENT) == inside, (n, b, c, why)
        assert (-margin < ci.low and ci.high < margin) == inside, (n, b, c, ci, why)
        if v == verdict.DIFFERENT:
            assert outside, (n, b, c, why)
        elif outside:
            assert "wide against the margin" in why, (n, b, c, why)
            assert (ci.high - ci.low) / 2 > 1.2 * m, (n, b, c, why)  # only a wide interval: see verdict.py
        if v == verdict.SHIFT:
            assert lo > 0 or hi < 0, (n, b, c, why)
        if "no change is shown" in why:
            assert lo <= 0 <= hi, (n, b, c, why)
        if v == verdict.INCONCLUSIVE and (lo > 0 or hi < 0):
            assert "a change is not shown by the two-sided test" in why, (n, b, c, why)


def test_two_verdicts_never_print_the_same_interval():
    """The audit: n = 299 with no discordant doc was EQUIVALENT, n = 298 INCONCLUSIVE, both printed
    "[−1.00, +1.00] pp". Over the grid, an interval printed with two verdicts would need one side of the
    margin or 0 to be printed wrong. SHIFT and INCONCLUSIVE may share an interval: McNemar's two-sided test
    tells them apart, and its p-value is printed."""
    seen: dict[tuple, set] = {}
    for n, b, c, m in GRID:
        v, _, _, why, _ = decide(n, b, c, m)
        seen.setdefault((m, CI_RE.search(why).group(0)), set()).add(v)
    for key, vs in seen.items():
        gate = {v if v in (verdict.EQUIVALENT, verdict.DIFFERENT) else "neither" for v in vs}
        assert len(gate) == 1, (key, vs)
    assert decide(299, 0, 0)[0] == verdict.EQUIVALENT and decide(298, 0, 0)[0] == verdict.INCONCLUSIVE
    assert printed_interval(decide(299, 0, 0)[3]) != printed_interval(decide(298, 0, 0)[3])


def test_the_direct_path_equals_the_product_path():
    """The fast ``decide`` above is what ``compare`` does for one comparison."""
    for n, b, c in [(298, 0, 0), (299, 0, 0), (3000, 60, 75), (30000, 1336, 1745), (100, 3, 12), (20, 0, 9)]:
        r = decide_counts(n, b, c)
        v, level, ci, why, _ = decide(n, b, c)
        assert (r.verdict, r.ci_level, r.ci_low, r.ci_high) == (v, pytest.approx(level), pytest.approx(ci.low),
                                                                pytest.approx(ci.high))
        assert CI_RE.search(r.reason).group(0) == CI_RE.search(why).group(0)


def test_shift_beyond_the_margin_is_now_different():
    """The audit: n = 30,000, b = 1,336, c = 1,745 printed SHIFT beside "Δ = +1.36 pp, 90 % CI [+1.06, +1.67]".
    The beyond-margin claims are one-sided, each at α: it is DIFFERENT, on that same 90 % interval."""
    r = decide_counts(30000, 1336, 1745)
    assert r.verdict == verdict.DIFFERENT and r.ci_level == pytest.approx(0.90)
    assert "90% CI [+1.06 pp, +1.67 pp] lies outside ±1.00 pp" in r.reason


def test_inconclusive_never_says_no_change_beside_an_interval_off_zero():
    """The audit: INCONCLUSIVE said "no change is shown" beside a 90 % CI excluding 0 (≈ 10 % of outcomes
    at n = 3,000, ψ = 5 %, Δ = 0.5 pp). Every such table of that design, by its probability."""
    n, psi, d = 3000, 0.05, 0.005
    hits = mass = 0.0
    for k in range(100, 210):
        for b in range(max(0, (k - 40) // 2), min(k, (k + 40) // 2) + 1):
            c = k - b
            v, _, ci, why, _ = decide(n, b, c)
            off_zero = ci.low > 0 or ci.high < 0
            if v == verdict.INCONCLUSIVE and off_zero:
                w = float(calibration.sps.multinomial.pmf([b, c, n - k], n, [(psi - d) / 2, (psi + d) / 2,
                                                                              1 - psi]))
                mass += w
                assert "no change is shown" not in why and ("lies above 0" in why or "lies below 0" in why), why
                hits += 1
    assert hits > 0 and mass > 0.02  # the case exists in numbers, and is worded truthfully


@pytest.mark.parametrize("psi,m,n", [(0.4, 0.001, 1000), (0.2, 0.001, 1000), (0.4, 0.002, 300), (0.4, 0.01, 300),
                                     (0.05, 0.001, 3000), (0.02, 0.01, 3000)])
def test_false_different_stays_under_alpha_where_the_interval_is_wide(psi, m, n):
    """Without the far end's tail, "each side at α" reached P(DIFFERENT) = 0.081 at ψ = 40 %, m = 0.1 pp,
    n = 1,000 (inside the margin both one-sided claims are false at once). Exact enumeration, |Δ| ≤ m."""
    for ratio in (0.0, 0.5, 1.0):
        o = calibration.verdict_probabilities(n, (psi - ratio * m) / 2, (psi + ratio * m) / 2, margin=m)
        assert o.different <= ALPHA, (ratio, o)


@pytest.mark.parametrize("psi,n", [(0.05, 3000), (0.05, 10000), (0.2, 10000)])
def test_false_different_at_the_margin_is_close_to_alpha(psi, n):
    """The old rule spent at most half of α (worst P(FAIL | inside) 0.024); at a true Δ on the margin it is
    now near α, and never above."""
    o = calibration.verdict_probabilities(n, (psi - 0.01) / 2, (psi + 0.01) / 2)
    assert 0.035 < o.different <= ALPHA, o


def test_family_threshold_prints_its_own_interval():
    """Under Holm, a DIFFERENT rejected at γ prints its (1 − 2γ) interval, outside the margin; one not
    rejected at its threshold while its 90 % interval lies beyond the margin says so."""
    from decide import META, table

    from evalparity.stats import compare

    opts = StatsOptions()
    pend = [compare.score_comparison(META | {"metric": "acc", "task": f"t{i}"}, *table(3000, b, c), opts)
            for i, (b, c) in enumerate([(30, 120), (30, 80), (40, 40), (40, 42), (40, 44)])]
    recs = compare.decide_all(pend, np.ones(len(pend), bool), opts)
    first = recs[0]
    assert first.verdict == verdict.DIFFERENT and first.ci_level == pytest.approx(1 - 2 * ALPHA / 5)
    assert first.ci_low > 0.01 and "98% CI" in first.reason
    second = recs[1]
    ci90 = pend[1].inf.confidence_interval(0.90)
    if second.verdict != verdict.DIFFERENT and ci90.low > 0.01:
        assert "not at the family threshold" in second.reason


def test_worse_direction_reads_off_the_interval_too():
    for n, b, c in small_tables(18):
        v, _, ci, why, _ = decide(n, b, c, 0.05, "worse")
        lvl, lo, hi = printed_interval(why)
        assert (v == verdict.EQUIVALENT) == (lo > -5), why
        assert (v == verdict.DIFFERENT) == (hi < -5), why
        if v == verdict.SHIFT:
            assert hi < 0, why
