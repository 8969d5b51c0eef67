"""The staged (group-sequential) rule (issue 26, item 2): α spent over the looks keeps both error rates at α
(exact DP over every table at every look), the DP agrees with the single-look enumeration at one look and
with a Monte Carlo of the same rule, the family rule (Holm on stage-adjusted p-values) holds its level, a
task stops when its comparisons are settled, and the staged planner's N reaches its power."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evalparity.errors import EXIT_USAGE, EvalParityError
from evalparity.stats import calibration, sequential, verdict

ALPHA, M = 0.05, 0.01


def rates(psi: float, delta: float) -> tuple[float, float]:
    return (psi - delta) / 2, (psi + delta) / 2


def exact(n_total: int, psi: float, delta: float, m: float = M) -> sequential.StagedOperating:
    design = sequential.StagedDesign.for_task(n_total, alpha=ALPHA)
    return sequential.staged_probabilities(design, *rates(psi, delta), margin=m)


def naive(n_total: int) -> sequential.StagedDesign:
    """The same looks with the single-look α at every one: what the rule would be without spending."""
    design = sequential.StagedDesign.for_task(n_total, alpha=ALPHA)
    object.__setattr__(design, "levels", (ALPHA,) * len(design.looks))
    return design


# ---------------------------------------------------------------- spending and schedule
@pytest.mark.parametrize("kind", sequential.SPENDING)
def test_spending_is_increasing_from_zero_to_alpha(kind):
    t = np.linspace(0, 1, 2001)
    f = sequential.spent(t, ALPHA, kind)
    assert f[0] == 0 and f[-1] == ALPHA
    assert np.all(np.diff(f) >= 0) and np.all(np.diff(f[1:]) > 0 if kind == "pocock" else True)


def test_obrien_fleming_is_strict_early_and_pocock_is_not():
    assert sequential.spent(0.1, ALPHA, "obf") < 1e-6 < 0.005 < sequential.spent(0.1, ALPHA, "pocock")
    assert sequential.spent(0.5, ALPHA, "obf") == pytest.approx(0.00557, abs=1e-5)  # 2·(1 − Φ(1.96·√2))


@pytest.mark.parametrize("n_total", [1, 400, 500, 999, 1000, 3000, 8100, 10000, 30000, 123457])
@pytest.mark.parametrize("kind", sequential.SPENDING)
def test_levels_sum_to_alpha_and_the_last_look_is_the_task(n_total, kind):
    design = sequential.StagedDesign.for_task(n_total, alpha=ALPHA, spending=kind)
    assert design.looks[-1] == n_total and all(b > a for a, b in zip(design.looks, design.looks[1:]))
    assert all(x >= 0 for x in design.levels)
    assert math.fsum(design.levels) == pytest.approx(ALPHA, abs=1e-15)
    assert all(n <= n_total / 2 for n in design.looks[:-1])  # no look in (N/2, N): the last keeps ≥ α − f(½)
    assert design.levels[-1] >= ALPHA - sequential.spent(0.5, ALPHA, kind) - 1e-15


def test_schedule_doubles_from_500():
    assert sequential.schedule(30000) == (500, 1000, 2000, 4000, 8000, 30000)
    assert sequential.schedule(1000) == (500, 1000)
    assert sequential.schedule(400) == (400,)
    assert sequential.StagedDesign((777,)).levels == (ALPHA,)


# ---------------------------------------------------------------- the exact DP
@pytest.mark.parametrize("n,psi,ratio,m,direction", [
    (3000, 0.01, 1.0, 0.01, "both"), (1000, 0.05, 0.5, 0.01, "both"), (300, 0.005, 0.0, 0.01, "both"),
    (3000, 0.4, 0.5, 0.001, "both"), (2000, 0.05, 1.0, 0.01, "worse"), (1000, 0.0, 0.0, 0.01, "both")])
def test_one_look_is_the_single_look_rule(n, psi, ratio, m, direction):
    """K = 1: the staged rule is today's rule, and the DP is ``calibration.verdict_probabilities`` to within
    the mass either leaves out (≈ 1e-13)."""
    delta = ratio * m * (-1 if direction == "worse" else 1)
    got = sequential.staged_probabilities(sequential.StagedDesign((n,), ALPHA), *rates(psi, delta), margin=m,
                                          direction=direction)
    want = calibration.verdict_probabilities(n, *rates(psi, delta), margin=m, alpha=ALPHA, direction=direction)
    tol = 2 * (got.skipped + want.skipped) + 1e-14
    for name in ("equivalent", "different", "shift", "inconclusive"):
        assert getattr(got, name) == pytest.approx(getattr(want, name), abs=tol), name
    assert got.expected_docs == pytest.approx(n)


# The benchmark's worst points (results/verdict-calibration/staged.txt) and a few more: Δ on the margin.
WORST = [(30000, 0.40, 1.0, 0.01), (30000, 0.20, 1.0, 0.01), (30000, 0.40, 1.0, 0.005), (10000, 0.05, 1.0, 0.01),
         (3000, 0.01, 1.0, 0.01), (30000, 0.05, 1.0, 0.005)]


@pytest.mark.parametrize("n_total,psi,ratio,m", WORST)
def test_both_error_rates_stay_at_alpha_over_the_looks(n_total, psi, ratio, m):
    o = exact(n_total, psi, ratio * m, m)
    assert o.different <= ALPHA and o.equivalent <= ALPHA, (o.equivalent, o.different)
    assert o.skipped < 1e-9


@pytest.mark.parametrize("n_total,psi,m", [(10000, 0.05, 0.01), (3000, 0.01, 0.01), (30000, 0.4, 0.001)])
def test_pocock_spending_keeps_the_level_too(n_total, psi, m):
    design = sequential.StagedDesign.for_task(n_total, alpha=ALPHA, spending="pocock")
    o = sequential.staged_probabilities(design, *rates(psi, m), margin=m)
    assert o.different <= ALPHA and o.equivalent <= ALPHA


@pytest.mark.parametrize("n_total,psi", [(10000, 0.05), (30000, 0.05), (30000, 0.2)])
def test_the_single_look_alpha_at_every_look_would_not(n_total, psi):
    """Why the spending: the same looks at α each give P(FAIL) 0.13–0.17 and P(PASS) up to 0.12 on the
    margin (the staged rule: ≤ 0.049)."""
    o = sequential.staged_probabilities(naive(n_total), *rates(psi, M), margin=M)
    assert o.different > 2 * ALPHA and o.equivalent > ALPHA
    staged = exact(n_total, psi, M)
    assert staged.different <= ALPHA and staged.equivalent <= ALPHA


def test_the_dp_agrees_with_a_monte_carlo_of_the_same_rule():
    reps = 20000
    for n_total, psi, delta in ((3000, 0.01, 0.0), (10000, 0.05, 0.005), (10000, 0.05, 0.01)):
        design = sequential.StagedDesign.for_task(n_total, alpha=ALPHA)
        dp = sequential.staged_probabilities(design, *rates(psi, delta), margin=M)
        mc = sequential.simulate(design, *rates(psi, delta), reps=reps, margin=M, rng=np.random.default_rng(7))
        for a, b in [(dp.equivalent, mc.equivalent), (dp.different, mc.different), (dp.shift, mc.shift),
                     *zip(dp.stop_equivalent, mc.stop_equivalent)]:
            assert abs(a - b) <= 4.5 * math.sqrt(max(a * (1 - a), 1 / reps) / reps) + 1e-12, (n_total, psi, a, b)
        assert abs(dp.expected_docs - mc.expected_docs) <= 4.5 * n_total / (2 * math.sqrt(reps))


def test_an_easy_comparison_stops_early():
    """ψ 0.2 %, m 1 pp: 1,000 docs settle it; a task of 30,000 scores ≈ 4,300 on average, not 30,000."""
    o = exact(30000, 0.002, 0.0)
    assert o.equivalent > 0.99 and o.expected_docs < 5000
    assert sum(o.stop_equivalent[:-1]) > 0.95


# ---------------------------------------------------------------- one comparison, a family, a task
def test_decide_reads_the_verdict_off_the_interval_at_the_look_level():
    design = sequential.StagedDesign.for_task(3000, alpha=ALPHA)
    r = sequential.decide(20, 22, 3000, design)
    assert r.verdict == verdict.EQUIVALENT and r.final and r.level == design.levels[-1]
    ci = r.confidence_interval()
    assert -M < ci.low and ci.high < M
    early = sequential.decide(7, 8, 1000, design)  # inside at 90 % but not at 1 − 2·0.00069
    assert early.verdict is None and not early.settled
    assert early.confidence_interval(1 - 2 * ALPHA).high < M < early.confidence_interval().high
    assert sequential.decide(300, 200, 3000, design).verdict == verdict.DIFFERENT


def test_a_task_stops_only_when_every_comparison_is_settled():
    design = sequential.StagedDesign.for_task(10000, alpha=ALPHA)
    n = 4000  # look 4 of 5, α_k ≈ 0.0019
    settled_eq, settled_diff = (10, 10), (400, 150)
    look = sequential.settle(sequential.decide_all([10, 40, 400], [10, 60, 150], n, design), alpha=ALPHA)
    assert [r.verdict for r in look.results] == [verdict.EQUIVALENT, None, verdict.DIFFERENT]
    assert not look.stops and look.new_different == 1
    done = sequential.settle(sequential.decide_all(*zip(settled_eq, settled_diff), n, design), alpha=ALPHA)
    assert done.stops
    last = sequential.settle(sequential.decide_all([400], [480], 10000, design), alpha=ALPHA)  # Δ 0.8 pp, ψ 8.8 %
    assert last.stops and last.results[0].verdict == verdict.SHIFT  # the docs ran out: today's verdict


def test_holm_on_stage_adjusted_pvalues():
    """The j-th smallest q = p_beyond / s_k is rejected at α / (K − r − j): a larger family, or fewer
    comparisons rejected before, make DIFFERENT harder; EQUIVALENT never depends on the family."""
    design = sequential.StagedDesign.for_task(3000, alpha=ALPHA)
    results = sequential.decide_all([210, 175, 20], [125, 110, 22], 3000, design)
    qs = [r.q_beyond for r in results]
    assert qs[0] < ALPHA / 10 and ALPHA / 3 < qs[1] < ALPHA / 2  # chosen so the family size decides
    alone = sequential.settle(results, alpha=ALPHA)  # a family of these 3: α/3, then α/2
    assert [r.verdict for r in alone.results] == [verdict.DIFFERENT, verdict.DIFFERENT, verdict.EQUIVALENT]
    assert alone.results[0].beyond_threshold == pytest.approx(design.levels[-1] / 3)
    assert alone.results[1].beyond_threshold == pytest.approx(design.levels[-1] / 2)
    family = sequential.settle(results, alpha=ALPHA, family_size=10)  # α/10, then α/9
    assert [r.verdict for r in family.results] == [verdict.DIFFERENT, verdict.SHIFT, verdict.EQUIVALENT]
    assert sequential.settle(results, alpha=ALPHA, family_size=5).new_different == 1  # α/5, α/4
    assert sequential.settle(results, alpha=ALPHA, family_size=5, already_different=2).new_different == 2  # α/3, α/2
    r = alone.results[0]
    assert r.confidence_interval().high < -M  # the (1 − 2γ) interval it was rejected at lies outside


def test_the_family_rule_holds_its_level_by_simulation():
    """K = 5 comparisons all on the margin: Holm on stage-adjusted p-values keeps P(any DIFFERENT) ≤ α; each
    comparison alone at its look level (no family rule) would fail the sign-off ≈ 20 % of the time."""
    rng = np.random.default_rng(11)
    design = sequential.StagedDesign.for_task(3000, alpha=ALPHA)
    k, sims, psi = 5, 1500, 0.05
    p_b, p_c = rates(psi, M)
    fail_holm = fail_alone = 0
    for _ in range(sims):
        b = np.zeros(k, int)
        c = np.zeros(k, int)
        prev, done_holm, done_alone, rejected = 0, {}, {}, 0
        for n in design.looks:
            draws = rng.multinomial(n - prev, [p_b, p_c, 1 - psi], size=k)
            b, c, prev = b + draws[:, 0], c + draws[:, 1], n
            results = sequential.decide_all(b, c, n, design)
            open_ = [j for j in range(k) if j not in done_holm]
            look = sequential.settle([results[j] for j in open_], alpha=ALPHA, family_size=k,
                                     already_different=rejected)
            rejected += look.new_different
            done_holm.update({j: r.verdict for j, r in zip(open_, look.results) if r.verdict})
            done_alone.update({j: r.verdict for j, r in enumerate(results) if r.verdict and j not in done_alone})
        fail_holm += verdict.DIFFERENT in done_holm.values()
        fail_alone += verdict.DIFFERENT in done_alone.values()
    se = math.sqrt(ALPHA * (1 - ALPHA) / sims)
    assert fail_holm / sims <= ALPHA + 3 * se
    assert fail_alone / sims > 2 * ALPHA


def test_shift_is_holm_over_the_whole_family_at_the_last_look(frozen_heap):
    """Generated cases against statsmodels: ``shift_family``'s SHIFTs are Holm's rejections on the McNemar
    p-values of the comparisons left unsettled at their last look, with every other comparison of the family
    (settled at any look, or not yet looked at) counted at p = 1; settled results are returned untouched."""
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(5)
    design = sequential.StagedDesign.for_task(1000, alpha=ALPHA)
    seen = set()
    for _ in range(300):
        k = int(rng.integers(1, 7))
        b, c = rng.integers(0, 40, k), rng.integers(0, 40, k)
        results = sequential.decide_all(b, c, 1000, design)  # the last look: unsettled ones are SHIFT/INCONCL.
        family = k + int(rng.integers(0, 4))
        got = sequential.shift_family(results, alpha=ALPHA, family_size=family)
        open_ = [not r.settled for r in results]
        p = np.array([r.p_shift if o else 1.0 for r, o in zip(results, open_)] + [1.0] * (family - k))
        want = multipletests(p, alpha=ALPHA, method="holm")[0][:k]
        for r, g, o, w in zip(results, got, open_, want):
            if o:
                assert g.verdict == (verdict.SHIFT if w else verdict.INCONCLUSIVE), (b, c, family)
            else:
                assert g == r
        seen.update((o, g.verdict, r.verdict) for r, g, o in zip(results, got, open_))
    # the cases reached every kind: a SHIFT the family keeps, one it takes back, and settled ones
    assert (True, verdict.SHIFT, verdict.SHIFT) in seen and (True, verdict.INCONCLUSIVE, verdict.SHIFT) in seen
    assert any(not o for o, _, _ in seen)


def test_the_staged_shift_holds_its_level_over_the_family_by_simulation():
    """K = 5 comparisons with no change at all, too noisy to settle (ψ 40 %, margin 1 pp, 3,000 docs): what
    reaches the last look is SHIFT or INCONCLUSIVE, and with Holm over the family P(any SHIFT) ≤ α; each at α
    alone (what the staged rule did before) claims a change that is not there ≈ 1 − 0.95⁵ of the time."""
    rng = np.random.default_rng(17)
    design = sequential.StagedDesign.for_task(3000, alpha=ALPHA)
    k, sims, psi = 5, 1500, 0.4
    p_b, p_c = rates(psi, 0.0)
    any_family = any_alone = reached = 0
    for _ in range(sims):
        b, c, prev = np.zeros(k, int), np.zeros(k, int), 0
        done, rejected = {}, 0
        for n in design.looks:
            draws = rng.multinomial(n - prev, [p_b, p_c, 1 - psi], size=k)
            b, c, prev = b + draws[:, 0], c + draws[:, 1], n
            open_ = [j for j in range(k) if j not in done]
            look = sequential.settle([sequential.decide_all(b, c, n, design)[j] for j in open_], alpha=ALPHA,
                                     family_size=k, already_different=rejected)
            rejected += look.new_different
            done.update({j: r for j, r in zip(open_, look.results) if r.settled or r.final})
        final = sequential.shift_family([done[j] for j in range(k)], alpha=ALPHA, family_size=k)
        reached += sum(r.final and not r.settled for r in final)
        any_family += any(r.verdict == verdict.SHIFT for r in final)
        any_alone += any(r.final and not r.settled and r.p_shift < ALPHA for r in final)
    se = math.sqrt(ALPHA * (1 - ALPHA) / sims)
    assert reached > 0.95 * k * sims  # the comparisons did reach the last look unsettled
    assert any_family / sims <= ALPHA + 3 * se
    assert any_alone / sims > 3 * ALPHA


# ---------------------------------------------------------------- planner
@pytest.mark.parametrize("psi,m,target", [(0.05, 0.01, 0.8), (0.01, 0.01, 0.9), (0.2, 0.02, 0.8)])
def test_the_staged_planner_reaches_its_power_by_the_exact_dp(psi, m, target):
    plan = sequential.n_for_equivalence_staged(m, psi, power_target=target, alpha=ALPHA)
    n = int(plan.total)
    o = sequential.staged_probabilities(plan.design, *rates(psi, 0.0), margin=m)
    assert o.equivalent >= target and o.equivalent == pytest.approx(plan.power)
    assert plan.expected_docs <= n and plan.expected_docs == pytest.approx(o.expected_docs)
    assert n >= plan.single_look_n  # the last look is stricter than α
    if n > plan.single_look_n:  # the search's start, the single-look n, fell short under the staged rule
        assert exact(int(plan.single_look_n), psi, 0.0, m).equivalent < target


def test_no_task_size_settles_a_difference_on_the_margin():
    plan = sequential.n_for_equivalence_staged(M, 0.05, true_difference=M)
    assert math.isinf(plan.total) and plan.design is None


# ---------------------------------------------------------------- bad input: one line, exit 2
@pytest.mark.parametrize("call", [
    lambda: sequential.schedule(0),
    lambda: sequential.schedule(1000, growth=1.0),
    lambda: sequential.StagedDesign((1000, 500)),
    lambda: sequential.StagedDesign((500, 1000), alpha=0.7),
    lambda: sequential.StagedDesign((500, 1000), spending="linear"),
    lambda: sequential.decide(1, 1, 700, sequential.StagedDesign((500, 1000))),
    lambda: sequential.decide(600, 500, 1000, sequential.StagedDesign((500, 1000))),
    lambda: sequential.settle(sequential.decide_all([1, 2], [1, 2], 1000, sequential.StagedDesign((1000,))),
                              alpha=ALPHA, family_size=1),
    lambda: sequential.staged_probabilities(sequential.StagedDesign((1000,)), 0.7, 0.6),
    lambda: sequential.n_for_equivalence_staged(M, 0.05, power_target=1.5),
    lambda: sequential.shift_family(  # two unsettled comparisons in a family of one
        sequential.decide_all([300, 300], [350, 350], 1000, sequential.StagedDesign((1000,))), alpha=ALPHA,
        family_size=1),
])
def test_bad_input_is_one_line_naming_the_fix(call):
    with pytest.raises(EvalParityError) as err:
        call()
    assert err.value.exit_code == EXIT_USAGE and "\n" not in str(err.value) and ":" in str(err.value)
