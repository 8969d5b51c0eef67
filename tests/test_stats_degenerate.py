"""Degenerate inputs give clear results or clear errors, never NaN verdicts."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from evalparity.errors import EvalParityError
from evalparity.samples import check_alignment
from evalparity.stats import deltas, flips, generations, paired, verdict
from evalparity.stats.compare import StatsOptions, _score_row


def decide_binary(ref, cell, margin=0.01):
    r = paired.paired_binary(np.asarray(ref, float), np.asarray(cell, float), margin=margin)
    return verdict.decide(effect=r.statistic, ci_low=r.ci.low, ci_high=r.ci.high, p_diff_adj=r.pvalue,
                          p_equiv_adj=r.tost_pvalue, margin=margin, alpha=0.05, n=r.n), r


def test_all_pairs_concordant_large_n_is_equivalent():
    (v, why), r = decide_binary([1, 0] * 500, [1, 0] * 500)
    assert v == verdict.EQUIVALENT and r.pvalue == 1.0 and r.tost_pvalue == pytest.approx(0.99 ** 1000)
    assert all(map(math.isfinite, (r.ci.low, r.ci.high)))


def test_all_pairs_concordant_small_n_is_inconclusive_with_numbers():
    (v, why), r = decide_binary([1, 0] * 20, [1, 0] * 20)
    assert v == verdict.INCONCLUSIVE
    assert "needed" in why or "detectable" in why or "n = 40" in why


def test_single_doc():
    (v, why), r = decide_binary([1], [1])
    assert v == verdict.INCONCLUSIVE and r.n == 1 and "n = 1" in why
    (v, _), r = decide_binary([1], [0])
    assert v == verdict.INCONCLUSIVE and (r.ci.low, r.ci.high) == (-1.0, 1.0)


def test_every_score_zero():
    row = _score_row(np.zeros(300), np.zeros(300), StatsOptions())
    assert row["effect"] == 0 and row["p_diff"] == 1.0 and math.isfinite(row["p_equiv"])


def test_nonfinite_loglikelihoods_are_counted_not_averaged():
    ref = np.array([-1.0, -2.0, -3.0, -4.0])
    cell = np.array([-1.0, np.nan, -np.inf, -4.1])
    r = deltas.loglikelihood_deltas(ref, cell)
    assert r.n == 2 and r.n_nonfinite_cell == 2 and math.isfinite(r.statistic)
    v, why = verdict.decide(effect=r.statistic, ci_low=r.ci.low, ci_high=r.ci.high, p_diff_adj=r.pvalue,
                            p_equiv_adj=r.tost_pvalue, margin=0.05, alpha=0.05, n=r.n,
                            n_nonfinite=r.n_nonfinite_cell, unit="nats")
    assert v == verdict.DIFFERENT and "non-finite" in why


def test_all_loglikelihoods_nonfinite_gives_inconclusive_not_nan():
    r = deltas.loglikelihood_deltas(np.array([np.nan, np.nan]), np.array([np.nan, -1.0]))
    v, why = verdict.decide(effect=r.statistic, ci_low=r.ci.low, ci_high=r.ci.high, p_diff_adj=r.pvalue,
                            p_equiv_adj=r.tost_pvalue, margin=0.05, alpha=0.05, n=r.n, unit="nats")
    assert v == verdict.INCONCLUSIVE and "no paired samples" in why


def test_identical_loglikelihoods_are_equivalent_exactly():
    x = -np.arange(1.0, 50.0)
    r = deltas.loglikelihood_deltas(x, x.copy())
    assert r.abs_max == 0 and r.pvalue == 1.0 and r.tost_pvalue == 0.0 and r.n_exact_zero == x.size


def test_mismatched_doc_sets_name_the_doc():
    a = pd.DataFrame({"task": ["t", "t"], "filter": ["none"] * 2, "doc_id": [0, 1], "choice": [0, 0],
                      "doc_hash": ["x", "y"], "prompt_hash": ["p", "q"], "target_hash": ["1", "2"]})
    b = a.iloc[:1].copy()
    with pytest.raises(EvalParityError, match="task t doc 1 is in a but not in b"):
        check_alignment({"a": a, "b": b})
    c = a.copy()
    c.loc[1, "prompt_hash"] = "other"
    with pytest.raises(EvalParityError, match="task t doc 1 has a different prompt"):
        check_alignment({"a": a, "c": c})


def test_paired_binary_rejects_unaligned_inputs():
    with pytest.raises(ValueError, match="align"):
        paired.paired_binary(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="no docs"):
        paired.paired_binary(np.array([]), np.array([]))


def test_flips_observed_against_expected():
    rows = []
    rng = np.random.default_rng(0)
    for doc in range(200):
        ref = rng.normal(-5, 1, 4)
        cell = ref + rng.normal(0, 0.01, 4)
        for i in range(4):
            rows.append({"doc_id": doc, "choice": i, "ref_score": ref[i], "cell_score": cell[i], "gold": 0})
    f = flips.decision_flips(pd.DataFrame(rows))
    assert f.n_docs == 200 and f.statistic == len(f.flipped)
    assert f.pvalue > 0.01  # noise-like perturbations: flips as many as expected
    # Drift that concentrates on near-ties (every doc with a reference margin under 0.1 gets its runner-up
    # pushed past the top choice; no other doc moves) flips far more docs than the same shifts spread at
    # random would: the signature of systematic drift.
    df = pd.DataFrame(rows)
    df["cell_score"] = df["ref_score"]
    for _doc, g in df.groupby("doc_id"):
        order = g["ref_score"].sort_values(ascending=False)
        if order.iloc[0] - order.iloc[1] < 0.1:
            df.loc[order.index[1], "cell_score"] += 0.15
    g = flips.decision_flips(df)
    assert g.statistic >= 10 and g.expected < g.statistic / 3 and g.pvalue < 1e-4


def test_generation_first_divergence():
    assert generations.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert generations.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert generations.first_divergence([1, 2], [1, 2, 3]) == 2
    r = generations.compare_generations([[1, 2], [1, 2, 3], None], [[1, 2], [1, 9, 3], None],
                                        ["a", "b", "c"], ["a", "x", "c"])
    assert r.statistic == pytest.approx(2 / 3) and r.n_without_ids == 1 and list(r.first_divergence) == [1]
