"""The whole statistics stage on 1,000,000 paired requests (250,000 four-choice docs, two cells), timed;
then the interval it uses at that size against a 10,000-resample bootstrap (scipy.stats.bootstrap and the
product's own doc bootstrap), in the same run; then the coverage of both at the switch point
(``deltas.BOOTSTRAP_BELOW_DOCS``), where the O(n) interval takes over.

    python benchmarks/stats_bench.py [--docs 250000] [--resamples 10000] [--coverage-sims 200]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from evalparity.samples import write_table
from evalparity.stats import deltas
from evalparity.stats.compare import StatsOptions, compute


def synthetic_run(root: Path, docs: int, k: int = 4, tasks: int = 10, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    n = docs * k
    doc = np.repeat(np.arange(docs), k)
    task = np.array([f"task_{i:02d}" for i in range(tasks)])[doc % tasks]
    base = pd.DataFrame({"task": task, "group": task, "filter": "none", "doc_id": doc // tasks,
                         "choice": np.tile(np.arange(k), docs), "output_type": "multiple_choice",
                         "doc_hash": "h", "prompt_hash": "p", "target_hash": "t", "target": "0",
                         "context": "q", "continuation": " a choice", "is_greedy": False,
                         "gold": np.repeat(rng.integers(0, k, docs), k)})
    ll = -rng.exponential(6.0, n)
    root.mkdir(parents=True)
    (root / "spec.json").write_text(json.dumps({"model": "synthetic", "tasks": [], "cells": [
        {"name": "hf-fp32"}, {"name": "vllm-fp32"}]}))
    for name, noise in (("hf-fp32", 0.0), ("vllm-fp32", 0.02)):
        t = base.copy()
        t["loglikelihood"] = ll + rng.normal(0, noise, n) if noise else ll
        s = t["loglikelihood"].to_numpy().reshape(docs, k)
        pred = s.argmax(axis=1)
        gold = t["gold"].to_numpy()[::k]
        t["m:acc"] = np.repeat((pred == gold).astype(float), k)
        t["m:acc_norm"] = t["m:acc"]
        t.insert(0, "cell", name)
        d = root / "cells" / name
        d.mkdir(parents=True)
        write_table(t, d / "samples.parquet")
        (d / "cell.json").write_text(json.dumps({"cell": name, "status": "ok", "tag": "", "base_cell": name}))
    return root


def coverage(sims: int, g: int, resamples: int) -> None:
    """One-sided non-coverage of the 95% intervals of a mean over g docs of a skewed, heavy-tailed Δ
    (|Δ| of loglikelihoods is like this): the doc-clustered t interval against the percentile bootstrap."""
    rng = np.random.default_rng(7)
    true = np.exp(0.5) * 0.01  # mean of 0.01 · lognormal(0, 1)
    miss_t = [0, 0]
    miss_b = [0, 0]
    for s in range(sims):
        x = 0.01 * rng.lognormal(0, 1, g)
        codes = np.arange(g)
        t_inf = deltas.TInference(float(x.mean()), float(x.std(ddof=1) / np.sqrt(g)), g - 1)
        ci = t_inf.confidence_interval(0.95)
        miss_t[0] += true < ci.low
        miss_t[1] += true > ci.high
        b = deltas.doc_mean_inference(x, codes, n_resamples=resamples, seed=s)
        if not isinstance(b, deltas.BootstrapInference):
            b = deltas.BootstrapInference(float(x.mean()), np.sort(deltas.bootstrap_ratio_means(
                x, np.ones(g), n_resamples=resamples, seed=s)))
        cb = b.confidence_interval(0.95)
        miss_b[0] += true < cb.low
        miss_b[1] += true > cb.high
    se = np.sqrt(0.025 * 0.975 / sims)
    print(f"  coverage at {g:,} docs, lognormal |Δ|, {sims} samples (nominal 2.5% each side, MC se {se:.3f}):")
    print(f"    t interval: below {miss_t[0] / sims:.3f}, above {miss_t[1] / sims:.3f} "
          f"(total miss {sum(miss_t) / sims:.3f})")
    print(f"    percentile bootstrap, {resamples:,} resamples: below {miss_b[0] / sims:.3f}, "
          f"above {miss_b[1] / sims:.3f} (total miss {sum(miss_b) / sims:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=250_000)
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--coverage-sims", type=int, default=200)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = synthetic_run(Path(tmp) / "run", a.docs)
        t0 = time.perf_counter()
        s = compute(root, StatsOptions())
        t_stage = time.perf_counter() - t0
        n_req = a.docs * 4
        print(f"whole statistics stage (read the two tables, every comparison, flips, write stats/): "
              f"{t_stage:.2f} s for {n_req:,} paired requests ({a.docs:,} docs); sign-off {s.sign_off}")
        ll = s.comparisons[s.comparisons["metric"] == "loglikelihood"]
        print(f"  loglikelihood comparisons use: {sorted(set(ll['method']))}")
    rng = np.random.default_rng(0)
    x = np.abs(rng.normal(0, 0.02, a.docs * 4))
    docs = np.repeat(np.arange(a.docs), 4)
    totals = np.bincount(docs, weights=x)
    counts = np.bincount(docs).astype(float)
    t0 = time.perf_counter()
    inf = deltas.doc_mean_inference(x, docs, n_resamples=a.resamples, seed=0)
    ci = inf.confidence_interval(0.95)
    t_ours = time.perf_counter() - t0
    print(f"  the stage's interval at this size ({inf.method}): {t_ours * 1000:.1f} ms -> "
          f"[{ci.low:.6e}, {ci.high:.6e}]")
    t0 = time.perf_counter()
    res = sps.bootstrap((totals, counts), lambda t, c, axis=-1: t.sum(axis=axis) / c.sum(axis=axis),
                        paired=True, vectorized=True, n_resamples=a.resamples, method="percentile",
                        batch=max(1, (1 << 22) // a.docs), random_state=1)
    t_scipy = time.perf_counter() - t0
    print(f"  scipy.stats.bootstrap over docs, {a.resamples:,} resamples, percentile: {t_scipy:.1f} s -> "
          f"[{res.confidence_interval.low:.6e}, {res.confidence_interval.high:.6e}]")
    t0 = time.perf_counter()
    means = np.sort(deltas.bootstrap_ratio_means(totals, counts, n_resamples=a.resamples, seed=0))
    t_boot = time.perf_counter() - t0
    lo, hi = np.quantile(means, [0.025, 0.975])
    print(f"  evalparity's doc bootstrap, same resamples: {t_boot:.1f} s -> [{lo:.6e}, {hi:.6e}]")
    print(f"  ratio scipy.stats.bootstrap / the stage's interval: {t_scipy / t_ours:,.0f}x; "
          f"scipy / evalparity's bootstrap: {t_scipy / t_boot:.2f}x")
    coverage(a.coverage_sims, deltas.BOOTSTRAP_BELOW_DOCS, a.resamples)


if __name__ == "__main__":
    main()
