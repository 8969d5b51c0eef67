"""Loglikelihood deltas per request: Δ = loglikelihood(cell) - loglikelihood(reference).

Scores can agree while logprobs drift, and logprobs are where drift shows first. For each comparison this
module gives the size of |Δ| (mean, median, p95, p99, max), whether Δ has a systematic sign (Wilcoxon
signed-rank, scipy; and a bootstrap CI of the mean), and whether the mean shift is within a tolerance
(TOST, statsmodels).

Non-finite loglikelihoods are never averaged: pairs where either side is NaN or infinite are left out of
every statistic and counted, and the verdict stage reports a cell that produced them where the reference
did not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps
from statsmodels.stats.weightstats import DescrStatsW

from evalparity.stats.results import ConfidenceInterval


@dataclass(frozen=True)
class DeltaResult:
    """Result of :func:`loglikelihood_deltas`. ``statistic`` is the mean Δ, ``pvalue`` Wilcoxon's."""

    n: int
    n_nonfinite_cell: int
    n_nonfinite_ref: int
    statistic: float
    median: float
    abs_mean: float
    abs_median: float
    abs_p95: float
    abs_p99: float
    abs_max: float
    n_exact_zero: int
    pvalue: float
    tost_pvalue: float
    tolerance: float
    ci: ConfidenceInterval
    sd: float

    def confidence_interval(self) -> ConfidenceInterval:
        return self.ci


BOOTSTRAP_BLOCKS = 16


def bootstrap_mean_ci(
    x: np.ndarray,
    *,
    n_resamples: int = 10_000,
    confidence_level: float = 0.95,
    seed: int = 0,
    chunk_elements: int = 1 << 24,
    workers: int | None = None,
) -> ConfidenceInterval:
    """Percentile bootstrap CI of the mean, resampling with replacement.

    The same estimator as ``scipy.stats.bootstrap(..., method='percentile')``, written for the one
    statistic we need: indices are drawn as uint32 in chunks of about ``chunk_elements`` (bounded memory
    for 10^6 requests x 10^4 resamples), summed in float64, with no per-resample Python call. The resamples
    are cut into 16 blocks, each with its own random stream spawned from ``seed``, and the blocks run on a
    thread pool (numpy releases the GIL in the drawing, gathering and summing), so the result is the same
    whatever the number of cores.
    """
    import os
    from concurrent.futures import ThreadPoolExecutor

    x = np.ascontiguousarray(x, dtype=np.float64)
    n = x.size
    if n == 0:
        raise ValueError("bootstrap of an empty sample")
    means = np.empty(n_resamples)
    per_chunk = max(1, chunk_elements // n)
    index_dtype = np.uint32 if n < 2**32 else np.int64
    bounds = np.linspace(0, n_resamples, BOOTSTRAP_BLOCKS + 1).astype(int)
    streams = np.random.SeedSequence(seed).spawn(BOOTSTRAP_BLOCKS)

    def block(b: int) -> None:
        rng = np.random.default_rng(streams[b])
        for start in range(bounds[b], bounds[b + 1], per_chunk):
            stop = min(bounds[b + 1], start + per_chunk)
            idx = rng.integers(0, n, size=(stop - start, n), dtype=index_dtype)
            means[start:stop] = np.take(x, idx).sum(axis=1) / n

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        list(pool.map(block, range(BOOTSTRAP_BLOCKS)))
    tail = (1 - confidence_level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return ConfidenceInterval(float(low), float(high))


def loglikelihood_deltas(
    ref: np.ndarray,
    cell: np.ndarray,
    *,
    tolerance: float = 0.05,
    alpha: float = 0.05,
    n_resamples: int = 2_000,
    seed: int = 0,
) -> DeltaResult:
    """Summarise Δ = cell - ref over paired requests; see the module docstring."""
    ref = np.asarray(ref, dtype=float)
    cell = np.asarray(cell, dtype=float)
    if ref.shape != cell.shape:
        raise ValueError(f"ref has {ref.size} requests but cell has {cell.size}: align them first")
    fin_ref, fin_cell = np.isfinite(ref), np.isfinite(cell)
    keep = fin_ref & fin_cell
    delta = cell[keep] - ref[keep]
    n = int(delta.size)
    nonfinite_cell = int(np.sum(fin_ref & ~fin_cell))
    nonfinite_ref = int(np.sum(~fin_ref))
    if n == 0:
        nan = float("nan")
        return DeltaResult(0, nonfinite_cell, nonfinite_ref, nan, nan, nan, nan, nan, nan, nan, 0, 1.0, 1.0,
                           tolerance, ConfidenceInterval(nan, nan), nan)
    absd = np.abs(delta)
    p95, p99 = np.quantile(absd, [0.95, 0.99])
    n_zero = int(np.sum(delta == 0))
    mean = float(delta.mean())
    sd = float(delta.std(ddof=1)) if n > 1 else 0.0
    if n_zero == n:
        p_shift = 1.0
    else:
        p_shift = float(sps.wilcoxon(delta, zero_method="wilcox").pvalue)
    if n > 1 and sd > 0:
        p_tost = float(DescrStatsW(delta).ttost_mean(-tolerance, tolerance)[0])
        ci = bootstrap_mean_ci(delta, n_resamples=n_resamples, confidence_level=1 - alpha, seed=seed)
    elif n > 1:
        # Every Δ equal (typically all exactly 0): the mean is known exactly from these requests.
        p_tost = 0.0 if abs(mean) < tolerance else 1.0
        ci = ConfidenceInterval(mean, mean)
    else:
        # One request says nothing about the spread: no equivalence claim from it.
        p_tost = 1.0
        ci = ConfidenceInterval(float("-inf"), float("inf"))
    return DeltaResult(
        n=n, n_nonfinite_cell=nonfinite_cell, n_nonfinite_ref=nonfinite_ref, statistic=mean,
        median=float(np.median(delta)), abs_mean=float(absd.mean()), abs_median=float(np.median(absd)),
        abs_p95=float(p95), abs_p99=float(p99), abs_max=float(absd.max()), n_exact_zero=n_zero,
        pvalue=p_shift, tost_pvalue=p_tost, tolerance=tolerance, ci=ci, sd=sd,
    )


# |Δ loglikelihood| histogram bins, in nats: 1e-9 stands for "identical" (Δ = 0 is clipped up to it).
HIST_EDGES = np.logspace(-9, 1, 50)


def abs_delta_histogram(ref: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """Counts of |cell − ref| over ``HIST_EDGES`` (non-finite pairs left out, the ends clipped in), so the
    report can draw the distribution from ``stats/`` without reading the cells' tables again."""
    d = np.abs(np.asarray(cell, float) - np.asarray(ref, float))
    d = np.clip(d[np.isfinite(d)], HIST_EDGES[0], HIST_EDGES[-1])
    return np.histogram(d, bins=HIST_EDGES)[0]
