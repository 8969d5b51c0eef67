"""Each statistic agrees with its reference implementation (statsmodels, scipy) on randomised inputs."""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats as sps
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.weightstats import DescrStatsW, ttost_paired

from evalparity.stats import deltas, multiplicity, paired, power

SEEDS = range(20)


def _pairs(rng, n, p=0.6, flip=0.1):
    ref = (rng.random(n) < p).astype(float)
    cell = np.where(rng.random(n) < flip, 1 - ref, ref)
    return ref, cell


@pytest.mark.parametrize("seed", SEEDS)
def test_paired_binary_matches_statsmodels(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 3000))
    ref, cell = _pairs(rng, n, p=rng.uniform(0.1, 0.9), flip=rng.uniform(0.01, 0.3))
    margin = float(rng.uniform(0.005, 0.05))
    r = paired.paired_binary(ref, cell, margin=margin, equivalence="t")
    a, b, c, d = r.both_correct, r.ref_only, r.cell_only, r.both_wrong
    assert a + b + c + d == n
    assert r.pvalue == pytest.approx(mcnemar([[a, b], [c, d]], exact=True).pvalue, abs=1e-9)
    assert r.statistic == pytest.approx(cell.mean() - ref.mean(), abs=1e-12)
    lo, hi = DescrStatsW(cell - ref).tconfint_mean(alpha=0.05)
    assert (r.ci.low, r.ci.high) == pytest.approx((lo, hi), abs=1e-9)
    assert r.tost_pvalue == pytest.approx(ttost_paired(cell, ref, -margin, margin)[0], abs=1e-9)


@pytest.mark.parametrize("seed", SEEDS[:8])
def test_cluster_robust_matches_statsmodels_ols(seed):
    rng = np.random.default_rng(seed)
    n = 600
    ref, cell = _pairs(rng, n)
    groups = rng.integers(0, 12, n)
    r = paired.paired_binary(ref, cell, clusters=groups, margin=0.02)
    fit = sm.OLS(cell - ref, np.ones(n)).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)
    assert r.standard_error == pytest.approx(fit.bse[0], abs=1e-9)
    # The test itself is the score-type one: cluster totals u_g = T_g − δ n_g, t = Σu / sqrt(Σu²), t(G − 1).
    d = cell - ref
    totals = np.bincount(groups, weights=d)
    sizes = np.bincount(groups)
    t = sps.t(df=11)

    def tstat(delta):
        u = totals - delta * sizes
        return u.sum() / np.sqrt(np.sum(u * u))

    cluster_p = max(t.cdf(tstat(0.02)), t.sf(tstat(-0.02)))
    b, c = r.ref_only, r.cell_only
    # --cluster takes the stricter of the cluster test and the independent-docs score test
    assert r.tost_pvalue == pytest.approx(max(cluster_p, paired.score_tost_pvalue(b, c, n, 0.02)), abs=1e-9)
    # the cluster test's own interval inverts it: at each end |t| is the critical value
    from evalparity.stats import inference

    cl = inference.cluster_inference(d, groups).confidence_interval(0.95)
    for end in (cl.low, cl.high):
        assert abs(tstat(end)) == pytest.approx(t.ppf(0.975), abs=1e-7)
    sc = paired.score_interval(b, c, n, 0.05)
    assert (r.ci.low, r.ci.high) == pytest.approx((min(cl.low, sc.low), max(cl.high, sc.high)), abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_deltas_match_scipy_and_statsmodels(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(30, 5000))
    ref = -rng.exponential(5, n)
    cell = ref + rng.normal(rng.normal(0, 0.01), 0.02, n)
    tol = 0.01
    r = deltas.loglikelihood_deltas(ref, cell, tolerance=tol, n_resamples=200)
    d = cell - ref
    assert r.statistic == pytest.approx(d.mean(), abs=1e-12)
    assert r.pvalue == pytest.approx(sps.wilcoxon(d, method="asymptotic").pvalue, abs=1e-9)
    # one request per doc, and fewer than BOOTSTRAP_BELOW_DOCS docs or not: from that many docs on the signed
    # mean's test is the t test, and then its TOST equals statsmodels'
    if n >= deltas.BOOTSTRAP_BELOW_DOCS:
        assert r.tost_pvalue == pytest.approx(DescrStatsW(d).ttost_mean(-tol, tol)[0], abs=1e-6)
        lo, hi = DescrStatsW(d).tconfint_mean(alpha=0.05)
        assert (r.ci.low, r.ci.high) == pytest.approx((lo, hi), abs=1e-9)
    assert r.abs_p99 == pytest.approx(np.quantile(np.abs(d), 0.99), abs=1e-12)
    assert r.abs_max == pytest.approx(np.abs(d).max(), abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS[:5])
def test_bootstrap_matches_scipy_percentile(seed):
    """Different random streams, so the two percentile CIs agree to Monte-Carlo error, not to the bit.

    The Monte-Carlo SE of a bootstrap 2.5% quantile of the mean is about sqrt(q(1-q)/B) / φ(1.96) x se;
    the difference of two independent ones is √2 times that. We allow five of those."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.01, 0.05, 400)
    b = 20000
    ours = deltas.bootstrap_mean_ci(x, n_resamples=b, seed=seed)
    ref = sps.bootstrap((x,), np.mean, n_resamples=b, method="percentile", random_state=seed + 100)
    se = x.std() / np.sqrt(x.size)
    tol = 5 * np.sqrt(2) * np.sqrt(0.025 * 0.975 / b) / sps.norm.pdf(1.96) * se
    assert ours.low == pytest.approx(ref.confidence_interval.low, abs=tol)
    assert ours.high == pytest.approx(ref.confidence_interval.high, abs=tol)
    # The same seed gives the same interval whatever the number of threads.
    assert deltas.bootstrap_mean_ci(x, n_resamples=2000, seed=seed, workers=1) == \
        deltas.bootstrap_mean_ci(x, n_resamples=2000, seed=seed, workers=4)


@pytest.mark.parametrize("method,sm_name", [("holm", "holm"), ("bh", "fdr_bh")])
def test_multiplicity_matches_statsmodels(method, sm_name):
    rng = np.random.default_rng(1)
    p = rng.uniform(0, 0.2, 50)
    assert multiplicity.adjust(p, method) == pytest.approx(multipletests(p, method=sm_name)[1], abs=1e-12)
    p[3] = np.nan
    out = multiplicity.adjust(p, method)
    assert np.isnan(out[3])
    keep = ~np.isnan(p)
    assert out[keep] == pytest.approx(multipletests(p[keep], method=sm_name)[1], abs=1e-12)


def test_exact_mcnemar_power_matches_direct_enumeration():
    """The exact power equals the sum of P(table) over every table the statsmodels test rejects."""
    n, p_b, p_c = 40, 0.12, 0.03
    total = 0.0
    for b in range(n + 1):
        for c in range(n + 1 - b):
            prob = sps.multinomial.pmf([b, c, n - b - c], n, [p_b, p_c, 1 - p_b - p_c])
            if b + c and mcnemar([[0, b], [c, 0]], exact=True).pvalue < 0.05:
                total += prob
    assert power.mcnemar_exact_power(n, p_b, p_c) == pytest.approx(total, abs=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
def test_score_restricted_mle_matches_numeric_optimum(seed):
    """Tango's closed-form restricted MLE equals the root of the trinomial likelihood's derivative, found
    numerically by scipy's brentq (the log-likelihood is concave, so that root is the maximum)."""
    from scipy.optimize import brentq

    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 2000))
    b, c = int(rng.integers(1, n // 8)), int(rng.integers(1, n // 8))
    delta = float(rng.uniform(-0.05, 0.05))
    r = n - b - c

    def dll(p):
        return b / p + c / (p + delta) - 2 * r / (1 - 2 * p - delta)

    lo = max(0.0, -delta) + 1e-15
    hi = (1 - delta) / 2 - 1e-15
    root = brentq(dll, lo, hi, xtol=1e-15, rtol=1e-15)
    assert paired.restricted_mle_ref_only(b, c, n, delta) == pytest.approx(root, abs=1e-9)


@pytest.mark.parametrize("seed", SEEDS[:10])
def test_score_interval_inverts_the_score_test(seed):
    """At each end of the score interval the two-sided score p-value is exactly α, and with many discordant
    pairs the interval agrees with statsmodels' paired t interval to within a few 1e-4."""
    rng = np.random.default_rng(seed)
    n = 5000
    ref, cell = _pairs(rng, n, flip=0.2)
    r = paired.paired_binary(ref, cell)
    b, c = r.ref_only, r.cell_only
    for end in (r.ci.low, r.ci.high):
        z = paired.score_statistic(b, c, n, end)
        assert 2 * sps.norm.sf(abs(z)) == pytest.approx(0.05, abs=1e-9)
    lo, hi = DescrStatsW(cell - ref).tconfint_mean(alpha=0.05)
    assert (r.ci.low, r.ci.high) == pytest.approx((lo, hi), abs=5e-4)


@pytest.mark.parametrize("gap,sd,target", [(0.01, 0.2, 0.8), (0.005, 0.3, 0.9), (0.05, 1.0, 0.8)])
def test_planner_without_continuity_matches_statsmodels_normal_power(gap, sd, target):
    """A t-type comparison beyond its margin: the planner's n for the one-sided test at the near end (at α,
    the rule's (1 − 2α) interval) is statsmodels' one-sample normal power calculation, rounded up."""
    from statsmodels.stats.power import NormalIndPower

    margin = 0.01
    n = power.n_needed(margin, sd * sd, margin + gap, alpha=0.05, power=target, continuity=0.0, binary=False)
    ref = NormalIndPower().solve_power(effect_size=gap / sd, alpha=0.05, power=target, alternative="larger",
                                       ratio=0)
    assert n == np.ceil(ref - 1e-6)


@pytest.mark.parametrize("seed", SEEDS[:8])
def test_boundary_variance_matches_numeric_restricted_mle(seed):
    """The planner's null-boundary variance: the trinomial likelihood at the expected counts, maximised
    numerically by scipy under Δ = δ, gives the same p̃ and so the same 2p̃ + δ − δ²."""
    from scipy.optimize import minimize_scalar

    rng = np.random.default_rng(seed)
    psi = float(rng.uniform(0.002, 0.4))
    d = float(rng.uniform(-0.5, 0.5)) * psi
    delta = float(rng.choice([-1, 1]) * rng.uniform(0.001, 0.05))
    p_b, p_c = (psi - d) / 2, (psi + d) / 2

    def nll(p):
        return -(p_b * np.log(p) + p_c * np.log(p + delta) + (1 - psi) * np.log(1 - 2 * p - delta))

    lo, hi = max(0.0, -delta) + 1e-12, (1 - delta) / 2 - 1e-12
    p = minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-14}).x
    assert power.boundary_variance(psi, d, delta) == pytest.approx(2 * p + delta - delta * delta, rel=1e-6)


@pytest.mark.parametrize("seed", SEEDS[:8])
def test_beyond_margin_pvalue_is_scipys_two_tails(seed):
    """For a t inference the beyond-margin p-value is the near end's one-sided t p-value plus the far end's
    tail in the same direction (scipy's t distribution)."""
    from evalparity.stats import inference, verdict

    rng = np.random.default_rng(seed)
    est, se, df, m = float(rng.normal(0, 0.03)), float(rng.uniform(0.002, 0.02)), int(rng.integers(5, 500)), 0.01
    p = verdict.beyond_pvalue(inference.TInference(est, se, df), verdict.Margin.around_zero(m))
    t = sps.t(df)
    up = t.sf((est - m) / se) + t.sf((est + m) / se)
    down = t.cdf((est + m) / se) + t.cdf((est - m) / se)
    assert p == pytest.approx(min(1.0, up, down), abs=1e-12)
