"""Power and sample size for paired binary comparisons, so an INCONCLUSIVE verdict can say what would
settle it: the minimum detectable difference at this n, and the n needed to show equivalence within the
margin.

Normal approximations on the paired differences d_i ∈ {-1, 0, 1}, whose variance is about the discordance
rate ψ when the true difference is small (Connor 1987). ``mcnemar_exact_power`` computes the exact power of
the exact McNemar test, for checking the design by simulation.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps

from evalparity.stats.inference import CONTINUITY


def minimum_detectable_difference(n: int, discordance: float, *, alpha: float = 0.05,
                                  power: float = 0.8) -> float:
    """Smallest |Δ| a two-sided paired test at level ``alpha`` detects with probability ``power``."""
    if n <= 0:
        return float("inf")
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    return float(z * math.sqrt(max(discordance, 1.0 / n) / n))


def _n_with_continuity(z: float, var: float, gap: float, continuity: float) -> float:
    """Smallest n with n·gap − continuity ≥ z·sqrt(var·n): the score test's numerator is moved ``continuity``
    counts towards 0 (``inference.CONTINUITY``), which costs about continuity / gap docs at large n."""
    x = (z * math.sqrt(var) + math.sqrt(z * z * var + 4 * gap * continuity)) / (2 * gap)
    return x * x


def n_for_equivalence(margin: float, discordance: float, *, alpha: float = 0.05, power: float = 0.8,
                      true_difference: float = 0.0, continuity: float = CONTINUITY) -> int:
    """Docs needed for TOST at ±margin to conclude equivalence with probability ``power`` when the true
    difference is ``true_difference`` (0 by default), for the score test with its continuity correction."""
    gap = margin - abs(true_difference)
    if gap <= 0:
        return math.inf  # type: ignore[return-value]
    beta = 1 - power
    z_beta = sps.norm.ppf(1 - beta / 2) if true_difference == 0 else sps.norm.ppf(power)
    z = sps.norm.ppf(1 - alpha) + z_beta
    var = max(discordance - true_difference**2, 1e-12)
    return int(math.ceil(_n_with_continuity(z, var, gap, continuity)))


def mcnemar_exact_power(n: int, p_ref_only: float, p_cell_only: float, *, alpha: float = 0.05) -> float:
    """Exact power of the exact (conditional binomial) McNemar test at level ``alpha``.

    Conditions on the number of discordant pairs m ~ Binomial(n, ψ), then b | m ~ Binomial(m, π) with
    π = p_ref_only / ψ, and sums the rejection probabilities of the two-sided exact binomial test.
    """
    psi = p_ref_only + p_cell_only
    if psi <= 0:
        return 0.0
    pi = p_ref_only / psi
    m_values = np.arange(n + 1)
    pm = sps.binom.pmf(m_values, n, psi)
    total = 0.0
    for m, w in zip(m_values, pm):
        if w < 1e-14 or m == 0:
            continue
        b = np.arange(m + 1)
        # Two-sided exact p-value as statsmodels computes it: min(1, 2 * min(cdf(k), sf(k - 1))) at 0.5.
        k = np.minimum(b, m - b)
        p = np.minimum(1.0, 2 * sps.binom.cdf(k, m, 0.5))
        total += w * float(np.sum(sps.binom.pmf(b, m, pi)[p < alpha]))
    return total


def n_to_settle(margin: float, variance: float, observed: float, *, alpha: float = 0.05,
                power: float = 0.8, one_sided_low: bool = False, continuity: float = 0.0) -> float:
    """Docs needed for a verdict at the observed difference, with per-doc variance ``variance`` of the
    paired differences (ψ − Δ² for binary scores, sd² otherwise): inside the margin, the n for TOST to show
    equivalence (``n_for_equivalence``'s formula); beyond it, the n for the beyond-margin test (one side at
    α/2) to show it; on the margin, infinity."""
    gap = observed + margin if one_sided_low else margin - abs(observed)  # ``worse``: the distance above −m
    if gap == 0 or not math.isfinite(gap):
        return math.inf
    var = max(variance, 1e-12)
    if gap > 0:
        z_beta = sps.norm.ppf(1 - (1 - power) / 2) if observed == 0 and not one_sided_low else sps.norm.ppf(power)
        z = sps.norm.ppf(1 - alpha) + z_beta
    else:
        z = sps.norm.ppf(1 - (alpha if one_sided_low else alpha / 2)) + sps.norm.ppf(power)
    return float(math.ceil(_n_with_continuity(z, var, abs(gap), continuity)))


def minimum_detectable_shift(n: int, sd: float, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest |Δ| a two-sided paired t test detects with probability ``power`` (normal approximation)."""
    if n <= 0:
        return float("inf")
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    return float(z * sd / math.sqrt(n))
