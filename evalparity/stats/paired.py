"""Paired tests on binary per-sample scores (acc, acc_norm, exact_match, ...).

Both cells scored the *same* documents, so each doc gives a pair (reference score, cell score). Comparing
the two aggregate accuracies as if they were independent samples (a two-proportion z-test) throws that
pairing away; here every statistic is computed on the pairs:

- the 2x2 agreement table and the exact McNemar test (statsmodels) for "is there a difference at all";
- the paired difference Δ = mean(cell) - mean(ref) with Tango's score interval, which inverts the same
  score test that decides equivalence and difference-beyond-the-margin (``inference.ScoreInference``);
- a TOST equivalence test of Δ against ±margin, which is what lets a report say "equivalent" as a claim
  the data supports rather than "not significant". The default uses Tango's score statistic (the variance
  of d_i taken at the null boundary, from the restricted maximum-likelihood estimate), because the plain
  paired t-test (statsmodels' ``ttost_paired``, available as ``equivalence="t"``) is anti-conservative when
  discordant pairs are rare: with 1 discordant pair in 400 docs its variance estimate is tiny and it
  declares equivalence at a true difference equal to the margin 8% of the time at α = 5% (our simulation
  test found this). The score test holds its level there;
- optionally, a cluster score test when docs come in clusters (the subjects of a group):
  ``inference.ClusterScoreInference``.

When every pair is concordant the per-doc differences have zero variance and a t interval would be a
point. The honest bound then comes from the discordance rate: |Δ| <= (b + c) / n always, and with 0
discordant pairs out of n the exact (Clopper-Pearson) upper bound on the discordance rate is
1 - (α/2)^(1/n) (``inference.ZeroDiscordance``). The equivalence p-value is
P(0 discordant | discordance = margin) = (1 - margin)^n, which is exact and valid because |Δ| >= margin
implies a discordance rate >= margin.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps
from statsmodels.stats.weightstats import DescrStatsW, ttost_paired

from evalparity.stats.inference import (  # noqa: F401 - re-exported: the score statistic lives there
    PairedInference,
    ScoreInference,
    StricterOf,
    TInference,
    ZeroDiscordance,
    cluster_inference,
    mcnemar_exact_pvalue,
    restricted_mle_ref_only,
    score_statistic,
)
from evalparity.stats.results import ConfidenceInterval


@dataclass(frozen=True)
class PairedBinaryResult:
    """Result of :func:`paired_binary`. ``statistic`` is Δ = mean(cell) − mean(ref); ``pvalue`` the exact
    McNemar test of Δ = 0; ``tost_pvalue`` the equivalence test against ±margin; ``ci`` the two-sided
    (1 − alpha) interval. ``inference`` answers the decision rule's questions at any boundary and level."""

    n: int
    both_correct: int
    ref_only: int
    cell_only: int
    both_wrong: int
    statistic: float
    pvalue: float
    tost_pvalue: float
    margin: float
    alpha: float
    standard_error: float
    ci: ConfidenceInterval
    method: str
    inference: PairedInference

    @property
    def discordant(self) -> int:
        return self.ref_only + self.cell_only

    def confidence_interval(self, confidence_level: float | None = None) -> ConfidenceInterval:
        return self.ci if confidence_level is None else self.inference.confidence_interval(confidence_level)


def _as_binary(x: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    if not np.all(np.isin(x, (0.0, 1.0))):
        raise ValueError(f"{name} must hold only 0 and 1 scores for a paired binary test")
    return x


def agreement_table(ref: np.ndarray, cell: np.ndarray) -> tuple[int, int, int, int]:
    """(both correct, ref only, cell only, both wrong)."""
    r, c = ref.astype(bool), cell.astype(bool)
    return int(np.sum(r & c)), int(np.sum(r & ~c)), int(np.sum(~r & c)), int(np.sum(~r & ~c))


def tost_pvalue(inference: PairedInference, margin: float) -> float:
    """Equivalence within ±margin: the larger of the one-sided p-values for Δ ≥ margin and Δ ≤ −margin."""
    return max(inference.pvalue_less(margin), inference.pvalue_greater(-margin))


def paired_binary(
    ref: np.ndarray,
    cell: np.ndarray,
    *,
    margin: float = 0.01,
    alpha: float = 0.05,
    clusters: np.ndarray | None = None,
    equivalence: str = "score",
) -> PairedBinaryResult:
    """Compare binary scores of the same docs in two cells.

    ``clusters`` (one label per doc) switches to the cluster score test (``inference``): use it when docs
    are not independent, e.g. the subjects of a group. ``standard_error`` is then statsmodels'
    cluster-robust one, reported for reference. ``equivalence='t'`` is the plain paired t (statsmodels'
    ``ttost_paired``), kept for comparison only: it is anti-conservative when discordance is rare.
    """
    ref = _as_binary(ref, "ref")
    cell = _as_binary(cell, "cell")
    if ref.shape != cell.shape:
        raise ValueError(f"ref has {ref.size} docs but cell has {cell.size}: align them first")
    n = int(ref.size)
    if n == 0:
        raise ValueError("no docs to compare")
    a, b, c, d = agreement_table(ref, cell)
    diff = cell - ref
    delta = float(diff.mean())
    p_mcnemar = mcnemar_exact_pvalue(b, c)
    level = 1 - alpha

    if b + c == 0:
        inf = ZeroDiscordance(n)
        se = 0.0
    elif clusters is not None:
        se = _cluster_robust_se(diff, np.asarray(clusters))
        inf = StricterOf(cluster_inference(diff, np.asarray(clusters)), ScoreInference(b, c, n))
    elif equivalence == "t":
        ds = DescrStatsW(diff)
        se = float(ds.std_mean)
        inf = TInference(delta, se, n - 1, bounds=(-1.0, 1.0))
        low, high = ds.tconfint_mean(alpha=alpha)
        return PairedBinaryResult(n, a, b, c, d, delta, p_mcnemar,
                                  float(ttost_paired(cell, ref, -margin, margin)[0]), margin, alpha, se,
                                  ConfidenceInterval(float(low), float(high)), "paired t", inf)
    elif equivalence == "score":
        se = float(diff.std(ddof=1) / np.sqrt(n)) if n > 1 else float("inf")
        inf = ScoreInference(b, c, n)
    else:
        raise ValueError(f"unknown equivalence test {equivalence!r}: use 'score' or 't'")
    return PairedBinaryResult(n, a, b, c, d, delta, p_mcnemar, min(tost_pvalue(inf, margin), 1.0), margin, alpha,
                              se, inf.confidence_interval(level), inf.method, inf)


def _cluster_robust_se(diff: np.ndarray, clusters: np.ndarray) -> float:
    """Cluster-robust SE of the mean difference via statsmodels OLS on a constant (reported, not tested)."""
    import statsmodels.api as sm  # heavy: statsmodels.api (as much again as the rest), for --cluster only

    codes = np.unique(clusters, return_inverse=True)[1]
    if int(codes.max()) + 1 < 2:
        raise ValueError("cluster-robust errors need at least two clusters")
    fit = sm.OLS(diff, np.ones_like(diff)).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
    return float(fit.bse[0])


def score_tost_pvalue(b: int, c: int, n: int, margin: float) -> float:
    """max of the two one-sided score p-values for H0: Δ >= margin and H0: Δ <= -margin."""
    return tost_pvalue(ScoreInference(b, c, n), margin)


def score_interval(b: int, c: int, n: int, alpha: float) -> ConfidenceInterval:
    """Two-sided (1 - alpha) score interval for Δ: the deltas the score test does not reject."""
    return ScoreInference(b, c, n).confidence_interval(1 - alpha)


def binary_tests(b, c, n, margin, *, direction: str = "both"):
    """The decision rule's three p-values for paired binary scores, vectorised over (b, c): exactly what
    ``verdict.tests`` computes from ``binary_inference(b, c, n)`` (checked in the tests), in a form that the
    exact enumeration of the design (``calibration``) can evaluate on every possible table at once.

    Returns (p_equivalence, p_beyond, p_shift) arrays."""
    b, c = np.asarray(b), np.asarray(c)
    k = b + c
    zero = k == 0
    z_hi, z_lo = score_statistic(b, c, n, margin), score_statistic(b, c, n, -margin)
    if direction == "both":
        p_eq = np.maximum(sps.norm.cdf(z_hi), sps.norm.sf(z_lo))
        # one-sided at the end the data point past, plus the far end's tail (``verdict.beyond_pvalue``)
        p_beyond = np.minimum(1.0, np.minimum(sps.norm.sf(z_hi) + sps.norm.sf(z_lo),
                                              sps.norm.cdf(z_lo) + sps.norm.cdf(z_hi)))
        p_shift = mcnemar_exact_pvalue(b, c)
        p_eq = np.where(zero, (1 - margin) ** n, p_eq)
    elif direction == "worse":
        p_eq = np.where(zero, (1 - margin) ** n, sps.norm.sf(z_lo))
        p_beyond = sps.norm.cdf(z_lo)
        p_shift = sps.norm.cdf(score_statistic(b, c, n, 0.0))
    else:
        raise ValueError(f"unknown direction {direction!r}")
    p_beyond = np.where(zero, 1.0, p_beyond)
    p_shift = np.where(zero, 1.0, p_shift)
    return p_eq, p_beyond, p_shift
