"""Loglikelihood deltas per request: Δ = loglikelihood(cell) - loglikelihood(reference).

Scores can agree while logprobs drift, and logprobs are where drift shows first. What each number means:

- mean |Δ| (with median, p95, p99, max): how far apart the two cells are per request. Its interval and
  tests decide the loglikelihood verdict against ``--ll-tolerance`` (a mean |Δ| below the tolerance is
  EQUIVALENT): zero-mean noise can be large, and a test on the signed mean would call it equivalent.
- mean Δ with its interval: a systematic shift (one cell scores every continuation higher). A change shown
  here is the SHIFT outcome. ``tost_pvalue`` is the classic TOST of the signed mean, kept for reference.
- Wilcoxon signed-rank p (scipy, asymptotic): whether Δ's distribution is symmetric about 0, a test of
  location, not of the mean. Reported only; it decides nothing.

The choices of one doc share its context, so the doc is the independent unit: intervals come from a doc
bootstrap for few docs and from a doc-clustered t interval from ``BOOTSTRAP_BELOW_DOCS`` docs on.

Non-finite loglikelihoods are never averaged: pairs where either side is NaN or infinite are left out of
every statistic and counted on each side; the comparison treats both sides alike.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from evalparity.stats.inference import ExactInference, PairedInference, TInference
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
    n_nonfinite_both: int = 0
    inference: PairedInference | None = None
    abs_inference: PairedInference | None = None

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


@dataclass(frozen=True)
class BootstrapInference:
    """A percentile bootstrap over docs of a ratio mean (Σ per-doc totals / Σ per-doc counts). Its p-values
    are the bootstrap distribution's tail shares, so they invert its percentile intervals (up to 1/B)."""

    estimate: float
    means: np.ndarray  # the bootstrap means, sorted
    method: str = "doc bootstrap (percentile)"
    bounds: tuple[float, float] = (-np.inf, np.inf)

    def pvalue_greater(self, delta: float) -> float:  # H0: θ ≤ δ
        return float(np.searchsorted(self.means, delta, side="right") / self.means.size)

    def pvalue_less(self, delta: float) -> float:  # H0: θ ≥ δ
        return float(1 - np.searchsorted(self.means, delta, side="left") / self.means.size)

    def pvalue_zero(self) -> float:
        return float(min(1.0, 2 * min(self.pvalue_greater(0.0), self.pvalue_less(0.0))))

    def confidence_interval(self, level: float) -> ConfidenceInterval:
        tail = (1 - level) / 2
        lo, hi = np.quantile(self.means, [tail, 1 - tail])
        return ConfidenceInterval(float(lo), float(hi))


# Below this many docs the loglikelihood intervals come from a doc bootstrap; from it on, from the
# doc-clustered t interval, O(n) (benchmarks/stats_bench.py prints both intervals' coverage at this n).
BOOTSTRAP_BELOW_DOCS = 1000


def doc_mean_inference(x: np.ndarray, doc_codes: np.ndarray, *, n_resamples: int, seed: int,
                       bounds: tuple[float, float] = (-np.inf, np.inf)) -> PairedInference:
    """Inference on the mean over requests of ``x`` when requests come in docs (the choices of one doc share
    its context, so the doc is the independent unit): a doc bootstrap for few docs, else a t interval with
    the ratio estimator's doc-clustered standard error."""
    totals = np.bincount(doc_codes, weights=x)
    counts = np.bincount(doc_codes).astype(float)
    keep = counts > 0
    totals, counts = totals[keep], counts[keep]
    g, n_req = totals.size, counts.sum()
    est = float(totals.sum() / n_req)
    resid = totals - est * counts
    if g >= 2 and not np.any(resid):
        return ExactInference(est, method="all docs' mean Δ equal", bounds=bounds)
    if g < 2:
        return TInference(est, np.inf, 1, method="one doc: no spread", bounds=bounds)
    if g < BOOTSTRAP_BELOW_DOCS:
        means = bootstrap_ratio_means(totals, counts, n_resamples=n_resamples, seed=seed)
        return BootstrapInference(est, np.sort(means), bounds=bounds)
    se = float(np.sqrt(g / (g - 1) * np.sum(resid * resid)) / n_req)
    return TInference(est, se, g - 1, method="doc-clustered t", bounds=bounds)


def bootstrap_ratio_means(totals: np.ndarray, counts: np.ndarray, *, n_resamples: int, seed: int) -> np.ndarray:
    """Bootstrap means Σ totals[idx] / Σ counts[idx] over docs resampled with replacement."""
    rng = np.random.default_rng(seed)
    g = totals.size
    out = np.empty(n_resamples)
    per_chunk = max(1, (1 << 22) // g)
    for start in range(0, n_resamples, per_chunk):
        stop = min(n_resamples, start + per_chunk)
        idx = rng.integers(0, g, size=(stop - start, g))
        out[start:stop] = np.take(totals, idx).sum(axis=1) / np.take(counts, idx).sum(axis=1)
    return out


def loglikelihood_deltas(
    ref: np.ndarray,
    cell: np.ndarray,
    *,
    docs: np.ndarray | None = None,
    tolerance: float = 0.05,
    alpha: float = 0.05,
    n_resamples: int = 2_000,
    seed: int = 0,
) -> DeltaResult:
    """Summarise Δ = cell − ref over paired requests; see the module docstring.

    ``docs`` labels each request with its doc (default: every request its own doc); the intervals and tests
    resample or cluster by doc. ``inference`` is about the signed mean Δ (a systematic shift);
    ``abs_inference`` about mean |Δ| (how far apart the two cells are per request), which is what the
    tolerance is compared with: zero-mean noise of mean |Δ| 0.4 nats is not "equivalent within 0.05".
    """
    ref = np.asarray(ref, dtype=float)
    cell = np.asarray(cell, dtype=float)
    if ref.shape != cell.shape:
        raise ValueError(f"ref has {ref.size} requests but cell has {cell.size}: align them first")
    fin_ref, fin_cell = np.isfinite(ref), np.isfinite(cell)
    keep = fin_ref & fin_cell
    delta = cell[keep] - ref[keep]
    n = int(delta.size)
    nonfinite_cell = int(np.sum(fin_ref & ~fin_cell))
    nonfinite_ref = int(np.sum(~fin_ref & fin_cell))
    nonfinite_both = int(np.sum(~fin_ref & ~fin_cell))
    nan = float("nan")
    if n == 0:
        none = TInference(nan, np.inf, 1, method="no finite pairs")
        return DeltaResult(0, nonfinite_cell, nonfinite_ref, nan, nan, nan, nan, nan, nan, nan, 0, 1.0, 1.0,
                           tolerance, ConfidenceInterval(nan, nan), nan, nonfinite_both, none, none)
    codes = (np.unique(np.asarray(docs)[keep], return_inverse=True)[1] if docs is not None
             else np.arange(n))
    absd = np.abs(delta)
    p95, p99 = np.quantile(absd, [0.95, 0.99])
    n_zero = int(np.sum(delta == 0))
    sd = float(delta.std(ddof=1)) if n > 1 else 0.0
    signed = doc_mean_inference(delta, codes, n_resamples=n_resamples, seed=seed)
    absolute = doc_mean_inference(absd, codes, n_resamples=n_resamples, seed=seed + 1, bounds=(0.0, np.inf))
    p_tost = max(signed.pvalue_less(tolerance), signed.pvalue_greater(-tolerance))
    p_sign = 1.0 if n_zero == n else float(sps.wilcoxon(delta, zero_method="wilcox", method="asymptotic").pvalue)
    return DeltaResult(
        n=n, n_nonfinite_cell=nonfinite_cell, n_nonfinite_ref=nonfinite_ref, statistic=float(delta.mean()),
        median=float(np.median(delta)), abs_mean=float(absd.mean()), abs_median=float(np.median(absd)),
        abs_p95=float(p95), abs_p99=float(p99), abs_max=float(absd.max()), n_exact_zero=n_zero,
        pvalue=p_sign, tost_pvalue=p_tost, tolerance=tolerance,
        ci=signed.confidence_interval(1 - alpha), sd=sd, n_nonfinite_both=nonfinite_both,
        inference=signed, abs_inference=absolute,
    )


# |Δ loglikelihood| histogram bins, in nats: 1e-9 stands for "identical" (Δ = 0 is clipped up to it).
HIST_EDGES = np.logspace(-9, 1, 50)


def abs_delta_histogram(ref: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """Counts of |cell − ref| over ``HIST_EDGES`` (non-finite pairs left out, the ends clipped in), so the
    report can draw the distribution from ``stats/`` without reading the cells' tables again."""
    with np.errstate(invalid="ignore"):  # inf − inf is NaN, left out below; no warning on the user's terminal
        d = np.abs(np.asarray(cell, float) - np.asarray(ref, float))
    d = np.clip(d[np.isfinite(d)], HIST_EDGES[0], HIST_EDGES[-1])
    return np.histogram(d, bins=HIST_EDGES)[0]
