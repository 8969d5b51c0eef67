"""Power and sample size for paired comparisons, so an INCONCLUSIVE verdict can say what would settle it:
the minimum detectable difference at this n, and the n needed for the verdict the data point to.

The planner models the test the decision rule actually runs (``inference.score_statistic``), not a
textbook one. For binary scores that is Tango's score test, whose variance is taken at the null boundary
(the restricted MLE at Δ = ±m, Nam 1997 / Tango 1998), with a continuity term of ``inference.CONTINUITY``
counts. One side's power at n docs, true difference d, discordance ψ and a boundary δ at distance
gap = |δ − d| (the statistic's own normal approximation):

    Φ((n·gap − continuity − z_α·sqrt(n·V_δ)) / sqrt(n·V_d)),   V_d = ψ − d²,  V_δ = 2·p̃(δ) + δ − δ²,

with p̃(δ) the restricted MLE of P(ref only) at the expected counts. The variance at the margin is larger
than ψ when ψ is near or below the margin (|Δ| ≤ ψ always, so the boundary forces more discordance); the
earlier formula used ψ there and promised 80 % where the exact rule gave 36 % (ψ = 0.5 %, m = 1 pp). TOST's
power is taken as the two sides' power less one (Bonferroni's bound on the intersection), which is
continuous in d: no jump between d = 0 and d ≠ 0, so one more discordant doc cannot cut the printed n.

``tests/test_decision_rule_planner.py`` and ``benchmarks/verdict_calibration.py`` check the n against
exact enumeration of every table (``calibration``). ``mcnemar_exact_power`` is the exact power of the
exact McNemar test.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps
from scipy.optimize import brentq

from evalparity.stats.inference import CONTINUITY, restricted_mle_ref_only

MAX_DOCS = 1e30  # beyond this no n is reported: the planner returns math.inf (no OverflowError at 1e-160)


def minimum_detectable_difference(n: int, discordance: float, *, alpha: float = 0.05,
                                  power: float = 0.8) -> float:
    """Smallest |Δ| a two-sided paired test at level ``alpha`` detects with probability ``power``."""
    if n <= 0:
        return float("inf")
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    return float(z * math.sqrt(max(discordance, 1.0 / n) / n))


def boundary_variance(discordance: float, true_difference: float, delta: float) -> float:
    """Per-doc variance of d_i that the score test uses at the null value ``delta`` when the data follow
    (ψ, d): 2·p̃ + δ − δ², p̃ the restricted MLE at the expected counts (Tango's quadratic is homogeneous in
    (b, c, n), so proportions stand in for counts)."""
    p_b, p_c = (discordance - true_difference) / 2, (discordance + true_difference) / 2
    p_tilde = float(restricted_mle_ref_only(p_b, p_c, 1.0, delta))
    return max(2 * p_tilde + delta - delta * delta, 0.0)


def _side_power(n: float, gap: float, v_true: float, v_null: float, z: float, continuity: float) -> float:
    """P(the one-sided test at a boundary ``gap`` away from the truth rejects), normal approximation."""
    num = n * gap - continuity - z * math.sqrt(n * v_null)
    return float(sps.norm.cdf(num / math.sqrt(n * max(v_true, 1e-300))))


def _power(n: float, bounds: list[tuple[float, float, float]], v_true: float, z: float, continuity: float) -> float:
    """Every one-sided test in ``bounds`` (gap, null variance, _) rejects: Σ side powers − (k − 1)."""
    return sum(_side_power(n, gap, v_true, v_null, z, continuity) for gap, v_null, _ in bounds) - (len(bounds) - 1)


def _smallest_n(bounds, v_true: float, z: float, continuity: float, power: float) -> float:
    """The smallest whole n whose power reaches ``power`` (power grows with n), or inf above MAX_DOCS."""
    if any(gap <= 0 or not math.isfinite(gap) for gap, _, _ in bounds):
        return math.inf
    if _power(MAX_DOCS, bounds, v_true, z, continuity) < power:
        return math.inf
    if _power(1.0, bounds, v_true, z, continuity) >= power:
        return 1.0
    root = brentq(lambda t: _power(math.exp(t), bounds, v_true, z, continuity) - power, 0.0,
                  math.log(MAX_DOCS), xtol=1e-9)
    n = math.ceil(math.exp(root) - 1e-6)
    while _power(n, bounds, v_true, z, continuity) < power:  # the root's rounding, never more than a step
        n += 1
    return float(n)


def n_for_equivalence(margin: float, discordance: float, *, alpha: float = 0.05, power: float = 0.8,
                      true_difference: float = 0.0, continuity: float = CONTINUITY,
                      one_sided_low: bool = False) -> int:
    """Docs for EQUIVALENT (TOST at ±margin, or only −margin with ``one_sided_low``) with probability
    ``power`` when the truth is (``discordance``, ``true_difference``), for the score test at the null
    boundary with its continuity term. math.inf where no n does it (the truth on or beyond the margin)."""
    n = n_needed(margin, discordance, true_difference, alpha=alpha, power=power, continuity=continuity,
                 one_sided_low=one_sided_low, binary=True)
    return int(n) if math.isfinite(n) else math.inf  # type: ignore[return-value]


def n_needed(margin: float, variance_or_discordance: float, true_difference: float, *, alpha: float = 0.05,
             power: float = 0.8, continuity: float = CONTINUITY, one_sided_low: bool = False,
             binary: bool = True) -> float:
    """Docs for the verdict the truth calls for, with probability ``power``: EQUIVALENT inside the margin,
    DIFFERENT beyond it (the one-sided test at the near boundary, at α: the rule's (1 − 2α) interval beyond
    the margin), math.inf on it. ``binary``: the second argument is the discordance ψ and the score test's
    variance is taken at each null boundary; otherwise it is the per-doc variance of a t test (the same
    at every null value)."""
    d, m = true_difference, margin
    if not (m > 0 and math.isfinite(m) and math.isfinite(d)):
        return math.inf
    if binary:
        psi = max(variance_or_discordance, abs(d))
        v_true = psi - d * d
        var_at = lambda delta: boundary_variance(psi, d, delta)  # noqa: E731
    else:
        v_true = variance_or_discordance
        var_at = lambda delta: v_true  # noqa: E731
    if not math.isfinite(v_true):
        return math.inf
    z = float(sps.norm.ppf(1 - alpha))
    inside = d + m > 0 if one_sided_low else abs(d) < m
    if inside:
        ends = [-m] if one_sided_low else [-m, m]
        bounds = [(abs(d - e), var_at(e), e) for e in ends]
    elif (one_sided_low and d + m == 0) or (not one_sided_low and abs(d) == m):
        return math.inf
    else:
        near = -m if (one_sided_low or d < 0) else m
        bounds = [(abs(d - near), var_at(near), near)]
    n = _smallest_n(bounds, v_true, z, continuity, power)
    if binary and math.isfinite(n) and n <= EXACT_BELOW:
        n = _exact_refine(int(n), psi, d, m, alpha, power, inside, one_sided_low)
    return n


EXACT_BELOW = 2000  # below this many docs the normal approximation meets discreteness; enumeration is cheap


def _exact_refine(n: int, psi: float, d: float, m: float, alpha: float, power: float, inside: bool,
                  one_sided_low: bool) -> float:
    """Step n up until the exact rule (every table enumerated, ``calibration``) reaches ``power``: at a few
    expected discordant docs the formula's n fell short (ψ = 0.2 %, m = 5 pp: 0.81 for 90 %)."""
    from evalparity.stats import calibration  # the verdict rule itself; imported here, it imports this layer

    direction = "worse" if one_sided_low else "both"
    for k in range(n, n + EXACT_BELOW + 1):
        o = calibration.verdict_probabilities(k, (psi - d) / 2, (psi + d) / 2, margin=m, alpha=alpha,
                                              direction=direction)
        if (o.equivalent if inside else o.different) >= power:
            return float(k)
    return float(n + EXACT_BELOW)


def n_to_settle(margin: float, variance: float, observed: float, *, alpha: float = 0.05,
                power: float = 0.8, one_sided_low: bool = False, continuity: float = 0.0,
                binary: bool | None = None) -> float:
    """Docs needed for a verdict at the observed difference, given the per-doc variance of the paired
    differences (ψ − Δ² for binary scores, sd² otherwise): ``n_needed`` at (ψ, Δ) = (variance + Δ², Δ) for
    binary scores, which ``binary`` says (by default: a continuity term is given, as the score test has)."""
    binary = continuity > 0 if binary is None else binary
    spread = variance + observed * observed if binary else variance
    return n_needed(margin, spread, observed, alpha=alpha, power=power, continuity=continuity,
                    one_sided_low=one_sided_low, binary=binary)


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


def minimum_detectable_shift(n: int, sd: float, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest |Δ| a two-sided paired t test detects with probability ``power`` (normal approximation)."""
    if n <= 0:
        return float("inf")
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    return float(z * sd / math.sqrt(n))
