"""The n-needed planner (issue 25, item 7): the n it prints reaches the stated power under the exact rule
(exact enumeration of every table, ``calibration``), moves the right way with the observed counts, and
never overflows."""

from __future__ import annotations

import functools
import math

import pytest

from evalparity.stats import calibration, inference, power

ALPHA = 0.05


def exact(n: int, psi: float, d: float, m: float):
    return calibration.verdict_probabilities(int(n), (psi - d) / 2, (psi + d) / 2, margin=m, alpha=ALPHA)


@pytest.mark.parametrize("psi,m", [(0.002, 0.01), (0.005, 0.01), (0.01, 0.01), (0.05, 0.01), (0.005, 0.02),
                                   (0.05, 0.02), (0.2, 0.02), (0.4, 0.05), (0.002, 0.05)])
@pytest.mark.parametrize("target", [0.8, 0.9])
def test_planned_n_reaches_the_power_under_the_exact_rule(psi, m, target):
    """The audit: ψ = 0.5 % printed 612 docs, where the exact P(EQUIVALENT) is 0.36. The variance at the
    margin, not ψ, is what the score test divides by."""
    n = power.n_for_equivalence(m, psi, alpha=ALPHA, power=target)
    assert exact(n, psi, 0.0, m).equivalent >= target, n


@pytest.mark.parametrize("psi,ratio", [(0.02, 0.5), (0.05, 0.3), (0.01, 0.5)])
def test_planned_n_at_a_true_difference_inside_the_margin(psi, ratio):
    n = power.n_for_equivalence(0.01, psi, true_difference=ratio * 0.01)
    assert exact(n, psi, ratio * 0.01, 0.01).equivalent >= 0.8, n


@pytest.mark.parametrize("psi,ratio", [(0.05, 1.5), (0.05, 2.0), (0.2, 1.5)])
def test_planned_n_beyond_the_margin_reaches_the_power_to_show_different(psi, ratio):
    """Beyond the margin the n is the one for DIFFERENT: one-sided at α at the near end."""
    d = ratio * 0.01
    n = power.n_needed(0.01, psi, d, alpha=ALPHA)
    assert exact(n, psi, d, 0.01).different >= 0.8, n


@functools.cache
def printed_n(n_docs: int, b: int, c: int, margin: float = 0.01) -> tuple[float, float]:
    """(n at the observed Δ, n if Δ were 0) as ``compare.score_comparison`` asks the planner for them.
    Cached: the walk below asks for each (b, c) twice, as the step's end and as the next step's start, and
    below 2,000 docs each answer enumerates the exact rule (``power._exact_refine``), about 10-40 ms."""
    psi = (b + c) / n_docs
    est = (c - b) / n_docs
    var = max(psi, 1.0 / n_docs) - est ** 2
    at_obs = power.n_to_settle(margin, var, est, alpha=ALPHA, continuity=inference.CONTINUITY)
    at_zero = power.n_to_settle(margin, var + est ** 2, 0.0, alpha=ALPHA, continuity=inference.CONTINUITY)
    return at_obs, at_zero


def test_one_more_discordant_doc_never_cuts_the_printed_n():
    """The audit: n = 1,000, b = 10, c = 11 printed 10 % fewer docs than b = c = 10. A doc that moves Δ̂ away
    from 0 (or keeps it) raises both ψ̂ and |Δ̂|: with Δ̂ inside the margin the n to show equivalence cannot
    fall. The n at Δ = 0 depends on ψ̂ alone and grows with it."""
    for n_docs in (1000, 3000):
        for b in range(0, 45):
            for c in range(b, 45):  # c ≥ b: a cell-only doc moves Δ̂ up, away from 0
                at_obs, at_zero = printed_n(n_docs, b, c)
                up_obs, up_zero = printed_n(n_docs, b, c + 1)
                assert up_zero >= at_zero, (n_docs, b, c)
                if abs(c + 1 - b) / n_docs < 0.01:
                    assert up_obs >= at_obs, (n_docs, b, c, at_obs, up_obs)
    assert printed_n(1000, 10, 11)[0] >= printed_n(1000, 10, 10)[0]


def test_the_planner_is_continuous_at_zero():
    """No jump between Δ = 0 and a Δ a hair away: the two sides' power is summed for both."""
    at0 = power.n_needed(0.01, 0.05, 0.0)
    near = power.n_needed(0.01, 0.05, 1e-6)
    assert abs(near - at0) <= 0.001 * at0


@pytest.mark.parametrize("margin", [1e-160, 1e-300, 5e-324, 1e-20])
def test_tiny_margins_give_inf_not_overflow(margin):
    """The audit: ``--margin 1e-160`` raised OverflowError in the planner."""
    assert power.n_for_equivalence(margin, 0.05) == math.inf
    assert power.n_to_settle(margin, 0.05, 0.0, continuity=inference.CONTINUITY) == math.inf
    assert power.n_to_settle(margin, 0.05, 0.0) == math.inf
    assert 100 < power.n_needed(margin, 0.05, 0.02) < 10_000  # beyond a tiny margin: DIFFERENT, an ordinary n


def test_the_truth_on_the_margin_has_no_n():
    assert power.n_needed(0.01, 0.05, 0.01) == math.inf
    assert power.n_needed(0.01, 0.05, -0.01, one_sided_low=True) == math.inf
