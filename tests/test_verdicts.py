"""The decision rule (issue 17): exact operating characteristics, the printed interval decides the verdict,
no Holm on equivalence, margins with units, flips under pure noise, and the family thresholds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from decide import decide_scores
from decide import table as _table
from statsmodels.stats.multitest import multipletests

from evalparity.errors import EvalParityError
from evalparity.stats import calibration, flips, inference, multiplicity, paired, verdict
from evalparity.stats.options import StatsOptions, parse_margins

ALPHA, M = 0.05, 0.01


@pytest.mark.parametrize("psi,n", [(0.01, 3000), (0.05, 1000), (0.05, 6000), (0.20, 300), (0.005, 1000)])
def test_exact_error_rates_on_a_grid_subset(psi, n):
    """P(FAIL) ≤ α wherever |Δ| ≤ m and P(PASS) ≤ α wherever |Δ| ≥ m, by exact enumeration (the whole grid is
    benchmarks/verdict_calibration.py; results/verdict-calibration/)."""
    for ratio in (0.0, 0.5, 0.9, 1.0, 1.5, 2.0):
        delta = ratio * M
        if delta > psi:
            continue
        o = calibration.verdict_probabilities(n, (psi - delta) / 2, (psi + delta) / 2)
        assert o.skipped < 1e-9
        assert o.equivalent + o.different + o.shift + o.inconclusive == pytest.approx(1.0, abs=1e-9)
        if ratio <= 1:
            assert o.different <= ALPHA, (psi, n, ratio, o)
        if ratio >= 1:
            assert o.equivalent <= ALPHA, (psi, n, ratio, o)


def test_fail_inside_the_margin_is_gone():
    """Issue 17, item 1: with 5 % discordant docs and n = 6,000, P(DIFFERENT) was 0.39, 0.74 and 0.89 at
    Δ = 0.5, 0.75 and 0.9 × margin. Now it is at most α there, exactly."""
    for ratio in (0.5, 0.75, 0.9):
        d = ratio * M
        o = calibration.verdict_probabilities(6000, (0.05 - d) / 2, (0.05 + d) / 2)
        assert o.different <= ALPHA
    # and a shift far beyond the margin does fail
    o = calibration.verdict_probabilities(6000, (0.05 - 0.03) / 2, (0.05 + 0.03) / 2)
    assert o.different > 0.99


def test_enumeration_matches_simulation():
    """The enumeration and a direct simulation through the product's path agree."""
    rng = np.random.default_rng(0)
    n, p_b, p_c = 400, 0.03, 0.05
    o = calibration.verdict_probabilities(n, p_b, p_c)
    sims = 400
    counts = {v: 0 for v in verdict.VERDICTS}
    for _ in range(sims):
        u = rng.random(n)
        ref = np.where(u < p_b, 1.0, np.where(u < p_b + p_c, 0.0, (rng.random(n) < 0.5) * 1.0))
        cell = np.where(u < p_b, 0.0, np.where(u < p_b + p_c, 1.0, ref))
        counts[decide_scores(ref, cell).verdict] += 1
    for name, p in ((verdict.EQUIVALENT, o.equivalent), (verdict.DIFFERENT, o.different),
                    (verdict.SHIFT, o.shift), (verdict.INCONCLUSIVE, o.inconclusive)):
        assert abs(counts[name] / sims - p) < 4 * math.sqrt(p * (1 - p) / sims) + 0.01, (name, counts, o)


@pytest.mark.parametrize("seed", range(12))
def test_binary_tests_equal_the_product_path(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 5000))
    b, c = int(rng.integers(0, n // 10 + 1)), int(rng.integers(0, n // 10 + 1))
    inf = inference.binary_inference(b, c, n)
    for direction in ("both", "worse"):
        t = verdict.tests(inf, verdict.Margin.around_zero(M, direction),
                          p_shift=paired.mcnemar_exact_pvalue(b, c) if direction == "both" else None)
        vec = paired.binary_tests(np.array([b]), np.array([c]), n, M, direction=direction)
        assert (t.p_equivalence, t.p_beyond, t.p_shift) == pytest.approx(tuple(float(x[0]) for x in vec), abs=1e-12)



@pytest.mark.parametrize("n,b,c", [(3000, 40, 41), (3000, 30, 70), (6000, 120, 170), (800, 10, 60),
                                   (20000, 300, 430), (500, 0, 0), (10000, 80, 40)])
def test_the_printed_interval_decides_the_verdict(n, b, c):
    """A verdict follows from the CI printed beside it, at the level printed."""
    r = decide_scores(*_table(n, b, c))
    lo, hi = r.ci_low, r.ci_high
    if r.verdict == verdict.EQUIVALENT:
        assert r.ci_level == pytest.approx(1 - 2 * ALPHA) and -M < lo and hi < M
    elif r.verdict == verdict.DIFFERENT:
        assert hi < -M or lo > M
    else:
        assert r.ci_level == pytest.approx(1 - 2 * ALPHA)
        assert not (-M < lo and hi < M) and not (hi < -M or lo > M)
    assert f"{100 * r.ci_level:.0f}% CI" in r.reason or "CI" in r.reason


def test_equivalence_is_not_adjusted_over_the_family(tmp_path):
    """Issue 17, item 3: a task with n = 20,000, Δ = 0.65 pp, 95 % CI [+0.32, +0.99] was EQUIVALENT alone and
    DIFFERENT next to nine small tasks. Its verdict now does not depend on the others."""
    opts = StatsOptions()
    big = _table(20000, 300, 430)
    alone = decide_scores(*big)
    assert alone.verdict == verdict.EQUIVALENT
    from evalparity.stats import compare

    meta = {"kind": "cross", "group": "g", "level": "task", "filter": "none", "cell": "c", "reference": "r",
            "metric": "acc"}
    pend = [compare.score_comparison(meta | {"task": "big"}, *big, opts)]
    pend += [compare.score_comparison(meta | {"task": f"small{i}"}, *_table(60, 1, 2), opts) for i in range(9)]
    recs = compare.decide_all(pend, np.ones(len(pend), bool), opts)
    assert recs[0].verdict == verdict.EQUIVALENT and recs[0].p_equivalence == pytest.approx(alone.p_equivalence)


def test_zero_discordance_is_equivalent_whatever_the_family():
    """Issue 17, item 3: gsm8k rows with 0 of 300 docs discordant ended INCONCLUSIVE after Holm. Alone the
    exact p is 0.99^300 = 0.049 < α: EQUIVALENT, with the exact 90 % bound printed."""
    r = decide_scores(*_table(300, 0, 0))
    assert r.verdict == verdict.EQUIVALENT and r.p_equivalence == pytest.approx(0.99 ** 300)


@pytest.mark.parametrize("text,value", [("1pp", 0.01), ("1%", 0.01), ("0.01", 0.01), ("2.5pp", 0.025),
                                        ("0.5 pp", 0.005)])
def test_margin_units(text, value):
    default, per = parse_margins(text)
    assert default == pytest.approx(value) and per == ()


@pytest.mark.parametrize("text", ["1", "1.5", "5", "0.5", "60pp", "-1pp", "abc", "0", "1e400"])
def test_bad_margins_are_refused_with_the_accepted_forms(text):
    with pytest.raises(EvalParityError) as e:
        parse_margins(text)
    assert "1pp" in str(e.value) or "positive" in str(e.value) or "not a margin" in str(e.value)


def test_per_metric_margins_and_non_proportions():
    opts = StatsOptions.from_cli(margin="acc=1pp,exact_match=2pp,perplexity=0.05")
    assert opts.margin_for("acc", proportion=True) == pytest.approx(0.01)
    assert opts.margin_for("exact_match", proportion=True) == pytest.approx(0.02)
    assert opts.margin_for("acc_norm", proportion=True) == pytest.approx(0.01)  # the default
    assert opts.margin_for("perplexity", proportion=False) == pytest.approx(0.05)
    assert opts.margin_for("bleu", proportion=False) is None
    with pytest.raises(EvalParityError):
        StatsOptions.from_cli(margin="acc=1").margin_for("acc", proportion=True)


def test_a_non_proportion_metric_never_gets_the_proportion_margin():
    """Issue 17, item 5: a per-doc perplexity shifted by 0.02 came out "Δ = +2.07 pp … DIFFERENT"."""
    rng = np.random.default_rng(0)
    ref = rng.normal(12, 3, 2000)
    cell = ref + 0.02
    r = decide_scores(ref, cell, metric="perplexity")
    assert r.verdict == verdict.NO_MARGIN and r.unit == "" and "pp" not in r.reason
    r = decide_scores(ref, cell, StatsOptions.from_cli(margin="perplexity=0.05"), metric="perplexity")
    assert r.verdict == verdict.EQUIVALENT


def test_direction_worse_ignores_improvements():
    ref, cell = _table(6000, 50, 350)  # Δ = +5 pp: an improvement beyond the margin
    assert decide_scores(ref, cell).verdict == verdict.DIFFERENT
    r = decide_scores(ref, cell, StatsOptions(direction="worse"))
    assert r.verdict == verdict.EQUIVALENT and r.ci_low > -M
    ref, cell = _table(6000, 350, 50)  # a 5 pp drop
    assert decide_scores(ref, cell, StatsOptions(direction="worse")).verdict == verdict.DIFFERENT


def test_n_needed_uses_the_observed_difference():
    """Issue 17, item 8: 4,282 docs at Δ = 0 where the observed Δ = 0.8 × margin needs about 77,184."""
    from evalparity.stats import power

    assert power.n_to_settle(M, 0.05 - 0.008 ** 2, 0.008) == pytest.approx(77_184, rel=0.01)
    assert power.n_to_settle(M, 0.05, 0.0) == pytest.approx(4_282, rel=0.01)


def test_flips_under_pure_noise_are_not_significant():
    """Issue 17, item 6: iid noise on 4-choice docs gave P(p < 0.05) = 0.41 (σ = 0.5) and 1.00 (σ = 1.5)."""
    import pandas as pd

    for sigma in (0.5, 1.5):
        hits = 0
        for seed in range(100):
            r = np.random.default_rng(seed)
            s = r.normal(-8, 2, (300, 4))
            c = s + r.normal(0, sigma, s.shape)
            df = pd.DataFrame({"doc_id": np.repeat(np.arange(300), 4), "choice": np.tile(np.arange(4), 300),
                               "ref_score": s.ravel(), "cell_score": c.ravel()})
            hits += flips.decision_flips(df).pvalue < 0.05
        assert hits / 100 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 100), (sigma, hits)


def test_flips_detect_systematic_drift():
    import pandas as pd

    r = np.random.default_rng(1)
    s = r.normal(-8, 2, (500, 4))
    c = s + r.normal(0, 0.05, s.shape)
    near = np.argsort(np.sort(s, axis=1)[:, -1] - np.sort(s, axis=1)[:, -2])[:40]  # the near-ties
    c[near, np.argsort(s[near], axis=1)[:, -2]] += 3.0  # drift that hits exactly the docs it can flip
    df = pd.DataFrame({"doc_id": np.repeat(np.arange(500), 4), "choice": np.tile(np.arange(4), 500),
                       "ref_score": s.ravel(), "cell_score": c.ravel()})
    f = flips.decision_flips(df)
    assert f.statistic >= 40 and f.expected < 30 and f.pvalue < 0.01


@pytest.mark.parametrize("method,sm", [("holm", "holm"), ("bh", "fdr_bh"), ("none", None)])
def test_rejection_thresholds_agree_with_statsmodels(method, sm, frozen_heap):
    rng = np.random.default_rng(4)
    for _ in range(50):
        p = rng.uniform(0, 0.05, int(rng.integers(1, 30))) ** rng.uniform(0.5, 2)
        thr = multiplicity.rejection_thresholds(p, ALPHA, method)
        reject = multipletests(p, alpha=ALPHA, method=sm)[0] if sm else p <= ALPHA
        assert np.array_equal(np.isfinite(thr), reject)
        assert np.all(p[reject] <= thr[reject])


def test_cluster_interval_inverts_its_test():
    rng = np.random.default_rng(5)
    labels = np.repeat(np.arange(30), rng.integers(20, 80, 30))
    d = np.where(rng.random(labels.size) < 0.05, rng.choice([-1.0, 1.0], labels.size), 0.0)
    inf = inference.cluster_inference(d, labels)
    ci = inf.confidence_interval(0.90)
    assert inf.pvalue_greater(ci.low) == pytest.approx(0.05, abs=1e-9)
    assert inf.pvalue_less(ci.high) == pytest.approx(0.05, abs=1e-9)


def test_loglikelihood_intervals_resample_docs_not_requests():
    """Issue 17, item 10: the choices of one doc share its context. When they share its Δ too, the doc is
    the unit: the interval is about √4 = 2 times a request-level one, in the bootstrap and the t regime."""
    from evalparity.stats import deltas

    rng = np.random.default_rng(2)
    for docs in (400, 3000):  # below and above deltas.BOOTSTRAP_BELOW_DOCS
        per_doc = rng.normal(0.0, 0.05, docs)
        x = np.repeat(per_doc, 4)
        codes = np.repeat(np.arange(docs), 4)
        by_doc = deltas.doc_mean_inference(x, codes, n_resamples=2000, seed=0).confidence_interval(0.95)
        by_req = deltas.doc_mean_inference(x, np.arange(x.size), n_resamples=2000, seed=0).confidence_interval(0.95)
        ratio = (by_doc.high - by_doc.low) / (by_req.high - by_req.low)
        assert 1.7 < ratio < 2.3, (docs, ratio)


def test_cluster_equivalence_holds_its_level():
    """Issue 17, item 7: the Wald cluster-robust TOST declared equivalence 8.5 % of the time at 5 %. The
    cluster score test, at a true Δ on the margin with subject-level variation, stays at or under α."""
    rng = np.random.default_rng(9)
    g, sims, hits = 40, 300, 0
    sizes = rng.integers(20, 200, g)
    labels = np.repeat(np.arange(g), sizes)
    for _ in range(sims):
        psi_g = np.clip(rng.gamma(4, 0.02 / 4, g), 0.002, 0.9)
        rho = np.clip(rng.normal(0.0, 0.3, g) + 1, -1, 1)
        rho *= M * sizes.sum() / np.sum(sizes * psi_g * rho)
        if np.any(np.abs(rho) > 1):
            rho = np.full(g, M * sizes.sum() / np.sum(sizes * psi_g))
        dg = psi_g * rho
        p_b, p_c = np.repeat((psi_g - dg) / 2, sizes), np.repeat((psi_g + dg) / 2, sizes)
        u = rng.random(labels.size)
        d = np.where(u < p_b, -1.0, np.where(u < p_b + p_c, 1.0, 0.0))
        t = verdict.tests(inference.cluster_inference(d, labels), verdict.Margin.around_zero(M))
        hits += t.p_equivalence < ALPHA
    assert hits / sims <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / sims)


def test_noise_floor_is_a_yardstick_not_a_verdict(tmp_path):
    """Issue 17, item 9: the noise-floor pair gets no verdict and is not in any family; each cross
    comparison says whether its discordance exceeds the noise pair's on the same docs."""

    import pandas as pd
    from synthetic import add_cell, make_run

    from evalparity.samples import read_table
    from evalparity.spec import CellSpec
    from evalparity.stats.compare import compute

    root = make_run(tmp_path / "run", n_tasks=1, cells=["hf-fp32", "vllm-fp32", "hf-bf16"], docs_per_task=3000,
                    drift={"vllm-fp32": 0.03})
    # a repeat of the reference at another batch size: identical but for a few docs
    rep = read_table(root / "cells" / "hf-fp32" / "samples.parquet")
    flip_docs = rep["doc_id"].drop_duplicates().sample(6, random_state=1)
    m = rep["doc_id"].isin(flip_docs)
    rep.loc[m, "m:acc"] = 1 - rep.loc[m, "m:acc"]
    add_cell(root, CellSpec("hf", "float32", 1, tag="bs1"), rep)
    s = compute(root, StatsOptions())
    c = s.comparisons
    nf = c[c["kind"] == "noise_floor"]
    assert len(nf) and (nf["verdict"] == "").all() and nf["p_beyond_adjusted"].isna().all()
    acc = c[(c["kind"] == "cross") & (c["metric"] == "acc")].set_index("cell")
    assert bool(acc.loc["vllm-fp32", "beyond_noise"]) is True
    assert acc.loc["vllm-fp32", "noise_floor_pair"] == "hf-fp32 vs hf-fp32-bs1"
    assert bool(acc.loc["hf-bf16", "beyond_noise"]) is False  # hf-bf16 agrees with hf-fp32 here
    assert pd.notna(acc.loc["vllm-fp32", "discordance_excess"])


@pytest.mark.parametrize("side", ["hf-fp32", "vllm-fp32"])
def test_a_metric_lost_on_either_side_is_the_same_disagreement(tmp_path, side):
    """A whole task's metric NaN in the reference was skipped ("no gating comparisons") while the same in
    the cell was DIFFERENT. Both sides are treated alike now."""
    from synthetic import make_run, reseal

    from evalparity.samples import read_table, write_table
    from evalparity.stats.compare import compute

    root = make_run(tmp_path / "run", n_tasks=1, cells=["hf-fp32", "vllm-fp32"], docs_per_task=400)
    path = root / "cells" / side / "samples.parquet"
    t = read_table(path)
    t["m:acc"] = np.nan
    write_table(t, path)
    reseal(root)  # the case is a cell that wrote NaN, not a table edited after the fact
    s = compute(root, StatsOptions())
    acc = s.comparisons[(s.comparisons["metric"] == "acc") & s.comparisons["gating"]]
    assert len(acc) == 1 and acc["verdict"].iloc[0] == verdict.DIFFERENT and s.sign_off == verdict.FAIL
    assert acc["n_nonfinite_reference" if side == "hf-fp32" else "n_nonfinite_cell"].iloc[0] == 400


def test_cluster_with_rare_discordance_is_no_bolder_than_without():
    """Independent review, finding 1: one cell-only doc among 30 subjects × 10 docs was EQUIVALENT with
    --cluster (90% CI [-0.25, +0.92] pp) and INCONCLUSIVE without. --cluster now takes the stricter of the
    cluster score test and the independent-docs one: it can only make a verdict more cautious."""
    lab = np.repeat(np.arange(30), 10)
    ref, cell = np.zeros(300), np.zeros(300)
    cell[0] = 1
    clustered = decide_scores(ref, cell, StatsOptions(cluster=True), clusters=lab)
    plain = decide_scores(ref, cell)
    assert clustered.verdict == plain.verdict == verdict.INCONCLUSIVE
    assert clustered.ci_low <= plain.ci_low and clustered.ci_high >= plain.ci_high


def test_cluster_verdicts_follow_their_printed_interval():
    """Finding 5: with few or unequal subjects the cluster interval was unbounded while its test rejected
    ("95% CI [-100, +100] pp lies outside ±1 pp"). Random clustered designs: never again."""
    rng = np.random.default_rng(11)
    for _ in range(300):
        g = int(rng.integers(2, 12))
        sizes = rng.integers(5, 400, g)
        lab = np.repeat(np.arange(g), sizes)
        n = lab.size
        u = rng.random(n)
        p = rng.uniform(0.0, 0.1)
        shift = rng.uniform(-0.05, 0.05)
        ref = (u < p / 2 - shift / 2).astype(float)
        cell = ((u >= p / 2 - shift / 2) & (u < p)).astype(float)
        r = decide_scores(ref, cell, StatsOptions(cluster=True, direction=str(rng.choice(["both", "worse"]))),
                          clusters=lab)
        inside = r.margin_low < r.ci_low and r.ci_high < r.margin_high
        if r.verdict == verdict.EQUIVALENT:
            assert inside, r.reason
        elif r.verdict == verdict.DIFFERENT:
            assert r.ci_high < r.margin_low or (np.isfinite(r.margin_high) and r.ci_low > r.margin_high), r.reason


def test_a_proportion_with_a_non_binary_value_is_not_taken_out_of_the_gate():
    """Finding 4: one cell doc scoring acc = 0.5 made acc 'NO MARGIN' (not gating), turning FAIL into PASS."""
    ref, cell = _table(3000, 10, 150)
    cell = cell.copy()
    cell[-1] = 0.5
    r = decide_scores(ref, cell)
    assert r.verdict == verdict.DIFFERENT and r.gating and "neither" in r.reason
    assert r.ci_level is None or not np.isfinite(r.ci_level)  # no interval is claimed for it


def test_a_value_on_one_side_only_claims_no_interval():
    """Finding 7: a NaN on one side gave DIFFERENT beside a 90% CI inside the margin."""
    ref, cell = _table(3000, 10, 10)
    cell = cell.copy()
    cell[5] = np.nan
    r = decide_scores(ref, cell)
    assert r.verdict == verdict.DIFFERENT and not np.isfinite(r.ci_level) and "not an α-level decision" in r.reason


def test_identical_values_on_a_few_docs_are_not_exact():
    """Finding 2: a continuous metric with every difference equal was taken as known exactly: EQUIVALENT on 2
    docs ('90% CI [+0, +0]'), DIFFERENT on 3 docs with p = 0. Now: no spread, no claim; except that no doc
    changing on a metric in [0, 1] gets the exact bound binary scores use."""
    opts = StatsOptions.from_cli(margin="f1=0.05")
    assert decide_scores([0.3, 0.7], [0.3, 0.7], opts, metric="f1").verdict == verdict.INCONCLUSIVE
    three = decide_scores([0.3, 0.7, 0.2], [0.3625, 0.7625, 0.2625], opts, metric="f1")
    assert three.verdict == verdict.INCONCLUSIVE and "detectable" not in three.reason
    x = np.linspace(0, 1, 600)
    many = decide_scores(x, x.copy(), opts, metric="f1")
    assert many.verdict == verdict.EQUIVALENT and many.p_equivalence == pytest.approx(0.95 ** 600)
    big = decide_scores(x * 100, x * 100, StatsOptions.from_cli(margin="bleu=1"), metric="bleu")  # 0-100 scale
    assert big.verdict == verdict.INCONCLUSIVE  # no bound is known for its range
