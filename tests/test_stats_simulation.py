"""Simulation with known truth: false alarms at α under the null, no false EQUIVALENT at twice the margin,
and power as designed for a planted effect. Each check runs ≥ 1,000 simulated comparisons."""

from __future__ import annotations

import math

import numpy as np

from evalparity.stats import paired, power, verdict

ALPHA = 0.05
SIMS = 1000


def mc_bound(p: float, sims: int = SIMS) -> float:
    """p plus three Monte-Carlo standard errors: a rate above this is a real excess, not chance."""
    return p + 3 * math.sqrt(p * (1 - p) / sims)


def simulate(rng, n: int, p_ref_only: float, p_cell_only: float, base: float = 0.6):
    """Paired binary scores with given discordance probabilities."""
    u = rng.random(n)
    ref = np.empty(n)
    cell = np.empty(n)
    b = u < p_ref_only
    c = (u >= p_ref_only) & (u < p_ref_only + p_cell_only)
    rest = ~(b | c)
    ref[b], cell[b] = 1, 0
    ref[c], cell[c] = 0, 1
    both = rng.random(rest.sum()) < base
    ref[rest], cell[rest] = both, both
    return ref, cell


def verdict_of(ref, cell, margin=0.01):
    """The verdict of one comparison from the vectorised p-values (``paired.binary_tests``, the same numbers
    as the product's path: see test_binary_tests_equal_the_product_path in test_verdicts.py)."""
    b, c = int(np.sum((ref == 1) & (cell == 0))), int(np.sum((ref == 0) & (cell == 1)))
    p_eq, p_beyond, p_shift = paired.binary_tests(b, c, ref.size, margin)
    return verdict.classify(p_eq, p_beyond < ALPHA, p_shift < ALPHA, ALPHA), None


def test_false_different_rate_under_null_is_at_most_alpha():
    rng = np.random.default_rng(11)
    hits = sum(verdict_of(*simulate(rng, 800, 0.03, 0.03))[0] == verdict.DIFFERENT for _ in range(SIMS))
    assert hits / SIMS <= mc_bound(ALPHA)


def test_false_equivalent_rate_at_twice_the_margin_is_at_most_alpha():
    rng = np.random.default_rng(12)
    margin = 0.01
    # True Δ = +2 x margin: cell-only discordance exceeds ref-only by 0.02.
    hits = sum(verdict_of(*simulate(rng, 3000, 0.02, 0.04), margin=margin)[0] == verdict.EQUIVALENT
               for _ in range(SIMS))
    assert hits / SIMS <= mc_bound(ALPHA)


def test_false_equivalent_rate_at_the_margin_is_at_most_alpha():
    """The hardest case for TOST: the true difference sits exactly on the margin."""
    rng = np.random.default_rng(13)
    hits = sum(verdict_of(*simulate(rng, 4000, 0.02, 0.03), margin=0.01)[0] == verdict.EQUIVALENT
               for _ in range(SIMS))
    assert hits / SIMS <= mc_bound(ALPHA)


def test_equivalence_power_at_the_designed_n():
    """n_for_equivalence(margin, ψ) docs give 80% power to show equivalence when there is no difference."""
    rng = np.random.default_rng(14)
    psi, margin = 0.04, 0.01
    n = power.n_for_equivalence(margin, psi, alpha=ALPHA, power=0.8)
    hits = sum(verdict_of(*simulate(rng, n, psi / 2, psi / 2), margin=margin)[0] == verdict.EQUIVALENT
               for _ in range(SIMS))
    rate = hits / SIMS
    assert abs(rate - 0.8) < 0.05, (n, rate)


def test_difference_power_at_the_minimum_detectable_difference():
    """A planted Δ equal to the minimum detectable difference is detected about 80% of the time, and the
    simulated rate matches the exact power of the exact McNemar test."""
    rng = np.random.default_rng(15)
    n, psi = 2000, 0.1
    mdd = power.minimum_detectable_difference(n, psi, alpha=ALPHA, power=0.8)
    p_b, p_c = (psi - mdd) / 2, (psi + mdd) / 2
    hits = sum(paired.paired_binary(*simulate(rng, n, p_b, p_c)).pvalue < ALPHA for _ in range(SIMS))
    rate = hits / SIMS
    exact = power.mcnemar_exact_power(n, p_b, p_c, alpha=ALPHA)
    assert abs(rate - exact) < 3 * math.sqrt(exact * (1 - exact) / SIMS) + 1e-3, (rate, exact)
    assert abs(exact - 0.8) < 0.05, exact


def test_all_concordant_equivalence_is_exact():
    """With zero discordant pairs the equivalence p-value is (1 - margin)^n, which is exact: simulate the
    worst case allowed by the null (discordance = margin) and count false EQUIVALENT verdicts."""
    rng = np.random.default_rng(16)
    n, margin = 400, 0.01
    hits = 0
    for _ in range(SIMS):
        ref, cell = simulate(rng, n, 0.0, margin)  # true Δ = margin exactly
        hits += verdict_of(ref, cell, margin)[0] == verdict.EQUIVALENT
    assert hits / SIMS <= mc_bound(ALPHA)
