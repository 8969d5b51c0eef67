"""Full statistics for 1,000,000 paired requests with 10,000 bootstrap resamples; prints wall times and the
ratio to scipy.stats.bootstrap on the same data, in the same run.

    python benchmarks/stats_bench.py [--n 1000000] [--resamples 10000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import stats as sps

from evalparity.stats import deltas, flips, paired


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--skip-scipy", action="store_true")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    ref = -rng.exponential(6.0, a.n)
    cell = ref + rng.normal(0.0, 0.02, a.n)
    ref_b = (rng.random(a.n) < 0.6).astype(float)
    cell_b = np.where(rng.random(a.n) < 0.01, 1 - ref_b, ref_b)

    t0 = time.perf_counter()
    d = deltas.loglikelihood_deltas(ref, cell, n_resamples=a.resamples)
    t_deltas = time.perf_counter() - t0
    t0 = time.perf_counter()
    b = paired.paired_binary(ref_b, cell_b)
    t_binary = time.perf_counter() - t0
    import pandas as pd

    k = 4
    docs = a.n // k
    choices = pd.DataFrame({"doc_id": np.repeat(np.arange(docs), k), "choice": np.tile(np.arange(k), docs),
                            "ref_score": ref[: docs * k], "cell_score": cell[: docs * k]})
    t0 = time.perf_counter()
    f = flips.decision_flips(choices)
    t_flips = time.perf_counter() - t0
    print(f"n = {a.n:,} paired requests, {a.resamples:,} bootstrap resamples")
    print(f"  loglikelihood deltas (summary, Wilcoxon, TOST, bootstrap CI): {t_deltas:.1f} s "
          f"(mean Δ {d.statistic:.2e}, CI [{d.ci.low:.2e}, {d.ci.high:.2e}])")
    print(f"  paired binary (McNemar, score CI, score TOST): {t_binary:.2f} s (Δ {b.statistic:+.2e})")
    print(f"  decision flips over {docs:,} docs x {k} choices: {t_flips:.1f} s "
          f"({f.statistic} observed, {f.expected:.1f} expected)")
    print(f"  total: {t_deltas + t_binary + t_flips:.1f} s")

    delta = cell - ref
    t0 = time.perf_counter()
    ours = deltas.bootstrap_mean_ci(delta, n_resamples=a.resamples)
    t_ours = time.perf_counter() - t0
    print(f"  bootstrap CI alone, evalparity: {t_ours:.1f} s -> [{ours.low:.3e}, {ours.high:.3e}]")
    if a.skip_scipy:
        return
    t0 = time.perf_counter()
    res = sps.bootstrap((delta,), np.mean, n_resamples=a.resamples, method="percentile", vectorized=True,
                        batch=max(1, (1 << 24) // a.n), random_state=1)
    t_scipy = time.perf_counter() - t0
    ci = res.confidence_interval
    print(f"  bootstrap CI alone, scipy.stats.bootstrap(method='percentile'): {t_scipy:.1f} s -> "
          f"[{ci.low:.3e}, {ci.high:.3e}]")
    print(f"  ratio scipy / evalparity: {t_scipy / t_ours:.2f}x")


if __name__ == "__main__":
    main()
