"""One comparison through the product's own path (compare.score_comparison / loglikelihood_comparison →
decide_all), for tests that check a verdict without building a run directory."""

from __future__ import annotations

import numpy as np

from evalparity.stats import compare, deltas
from evalparity.stats.options import StatsOptions
from evalparity.stats.record import Comparison

META = {"kind": "cross", "task": "t", "group": "t", "level": "task", "filter": "none", "cell": "c",
        "reference": "r"}


def decide_scores(ref, cell, opts: StatsOptions | None = None, metric: str = "acc", clusters=None) -> Comparison:
    opts = opts or StatsOptions()
    p = compare.score_comparison(META | {"metric": metric}, np.asarray(ref, float), np.asarray(cell, float), opts,
                                 clusters)
    return compare.decide_all([p], np.array([p.margin is not None]), opts)[0]


def decide_ll(ref, cell, opts: StatsOptions | None = None, docs=None) -> Comparison:
    opts = opts or StatsOptions()
    ref, cell = np.asarray(ref, float), np.asarray(cell, float)
    d = deltas.loglikelihood_deltas(ref, cell, docs=docs, tolerance=opts.ll_tolerance, alpha=opts.alpha)
    fin = np.isfinite(ref) & np.isfinite(cell)
    p = compare.loglikelihood_comparison(META | {"metric": "loglikelihood"}, d,
                                         float(ref[fin].mean()) if fin.any() else np.nan,
                                         float(cell[fin].mean()) if fin.any() else np.nan, opts)
    return compare.decide_all([p], np.array([True]), opts)[0]


def table(n: int, b: int, c: int, both: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
    """Reference and cell scores of n docs: b right only in the reference, c only in the cell, and a share
    ``both`` of the rest right in both."""
    ref, cell = np.zeros(n), np.zeros(n)
    ref[:b] = 1
    cell[b:b + c] = 1
    k = int((n - b - c) * both)
    ref[b + c:b + c + k] = 1
    cell[b + c:b + c + k] = 1
    return ref, cell


def decide_counts(n: int, b: int, c: int, opts: StatsOptions | None = None) -> Comparison:
    """One binary comparison of n docs with b ref-only and c cell-only docs, through the product's path."""
    return decide_scores(*table(n, b, c), opts)
