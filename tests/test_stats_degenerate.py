"""Degenerate inputs give clear results or clear errors, never NaN verdicts."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from decide import decide_ll, decide_scores

from evalparity.errors import EvalParityError
from evalparity.samples import check_alignment
from evalparity.stats import deltas, flips, generations, paired, verdict


def decide_binary(ref, cell, margin=0.01):
    r = paired.paired_binary(np.asarray(ref, float), np.asarray(cell, float), margin=margin)
    return decide_scores(ref, cell), r


def test_all_pairs_concordant_large_n_is_equivalent():
    c, r = decide_binary([1, 0] * 500, [1, 0] * 500)
    assert c.verdict == verdict.EQUIVALENT and r.pvalue == 1.0 and r.tost_pvalue == pytest.approx(0.99 ** 1000)
    assert c.p_equivalence == pytest.approx(0.99 ** 1000)
    assert all(map(math.isfinite, (r.ci.low, r.ci.high, c.ci_low, c.ci_high)))
    # the interval printed beside it is the exact 90% bound, and it lies inside the margin
    assert c.ci_level == pytest.approx(0.90) and -0.01 < c.ci_low and c.ci_high < 0.01


def test_all_pairs_concordant_small_n_is_inconclusive_with_numbers():
    c, r = decide_binary([1, 0] * 20, [1, 0] * 20)
    assert c.verdict == verdict.INCONCLUSIVE
    assert "settle it" in c.reason and "detectable" in c.reason and "n = 40" in c.reason


def test_single_doc():
    c, r = decide_binary([1], [1])
    assert c.verdict == verdict.INCONCLUSIVE and r.n == 1 and "n = 1" in c.reason
    c, r = decide_binary([1], [0])
    assert c.verdict == verdict.INCONCLUSIVE and c.ci_low == pytest.approx(-1.0, abs=1e-6)


def test_every_score_zero():
    c = decide_scores(np.zeros(300), np.zeros(300))
    assert c.effect == 0 and c.p_shift == 1.0 and math.isfinite(c.p_equivalence)


def test_nonfinite_on_either_side_is_treated_alike():
    """A NaN in the reference and a NaN in the cell are the same disagreement: both DIFFERENT, counted."""
    ref = np.array([1.0, 0.0, 1.0, 1.0] * 300)
    cell = ref.copy()
    bad_cell, bad_ref = cell.copy(), ref.copy()
    bad_cell[5] = np.nan
    bad_ref[5] = np.nan
    a, b = decide_scores(ref, bad_cell), decide_scores(bad_ref, cell)
    assert a.verdict == b.verdict == verdict.DIFFERENT
    assert (a.n_nonfinite_cell, a.n_nonfinite_reference) == (1, 0)
    assert (b.n_nonfinite_cell, b.n_nonfinite_reference) == (0, 1)
    assert "non-finite" in a.reason and "non-finite" in b.reason
    both = ref.copy()
    both[5] = np.nan
    c = decide_scores(both, both)  # non-finite on both sides: left out, counted, no disagreement
    assert c.verdict == verdict.EQUIVALENT and c.n_nonfinite_both == 1 and "both sides" in c.reason


def test_nonfinite_loglikelihoods_are_counted_not_averaged():
    ref = np.array([-1.0, -2.0, -3.0, -4.0])
    cell = np.array([-1.0, np.nan, -np.inf, -4.1])
    r = deltas.loglikelihood_deltas(ref, cell)
    assert r.n == 2 and r.n_nonfinite_cell == 2 and math.isfinite(r.statistic)
    c = decide_ll(ref, cell)
    assert c.verdict == verdict.DIFFERENT and "non-finite" in c.reason
    c = decide_ll(cell, ref)  # the same on the reference's side
    assert c.verdict == verdict.DIFFERENT and c.n_nonfinite_reference == 2


def test_all_loglikelihoods_nonfinite_gives_inconclusive_not_nan():
    c = decide_ll(np.array([np.nan, np.nan]), np.array([np.nan, np.nan]))
    assert c.verdict == verdict.INCONCLUSIVE and "no paired samples" in c.reason and c.n_nonfinite_both == 2


def test_identical_loglikelihoods_are_equivalent_exactly():
    x = -np.arange(1.0, 50.0)
    r = deltas.loglikelihood_deltas(x, x.copy())
    assert r.abs_max == 0 and r.pvalue == 1.0 and r.tost_pvalue == 0.0 and r.n_exact_zero == x.size
    assert decide_ll(x, x.copy()).verdict == verdict.EQUIVALENT


def test_zero_mean_noise_of_large_size_is_not_equivalent():
    """Issue 17: zero-mean noise with mean |Δ| 0.40 nats was EQUIVALENT within ±0.05 (a test of the signed
    mean). The tolerance is compared with mean |Δ| now: beyond it, shown."""
    rng = np.random.default_rng(3)
    ref = -rng.exponential(5, 4000)
    cell = ref + rng.normal(0, 0.5, ref.size)  # mean |Δ| ≈ 0.40
    c = decide_ll(ref, cell, docs=np.repeat(np.arange(1000), 4))
    assert c.effect == pytest.approx(0.40, abs=0.02) and c.verdict == verdict.DIFFERENT
    assert c.estimand.startswith("mean |Δ")


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
