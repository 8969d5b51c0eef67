"""Multiple comparisons over the family of "beyond the margin" (and "a change") claims.

Only union claims need this: "some comparison is beyond its margin" fails the sign-off, so its error is
controlled over the family. The equivalence claims are never adjusted: PASS needs every one of them, an
intersection-union test that is valid at α as it is (``verdict``).

``adjust`` gives the adjusted p-values (statsmodels); ``rejection_thresholds`` gives, for each rejected
hypothesis, the per-comparison level γ at which the procedure rejected it (Holm: α / (K − j) at step j;
Benjamini-Hochberg: α k* / K; none: α). A comparison rejected at γ has its (1 − γ) interval outside the
margin, which is the interval the report prints beside a DIFFERENT verdict.
"""

from __future__ import annotations

import numpy as np
from statsmodels.stats.multitest import multipletests

METHODS = {"holm": "holm", "bh": "fdr_bh", "none": None}


def _check(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown multiple-testing method {method!r}: use one of {', '.join(METHODS)}")


def adjust(pvalues: np.ndarray, method: str = "holm") -> np.ndarray:
    """Adjusted p-values; ``method`` is 'holm' (family-wise, the default), 'bh' (false discovery rate)
    or 'none'. NaN p-values stay NaN and are not counted in the family."""
    _check(method)
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    ok = np.isfinite(p)
    if not ok.any():
        return out
    if METHODS[method] is None:
        out[ok] = p[ok]
    elif method == "holm":
        out[ok] = _holm(p[ok])
    else:
        out[ok] = multipletests(p[ok], method=METHODS[method])[1]
    return out


def _holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values, as statsmodels' ``multipletests(method='holm')`` gives them (the
    tests check equality). Written out because statsmodels' Holm runs ``gc.collect()`` on every call: 40 ms
    each with a statistics stage's 10^6-row tables in memory, four calls per run."""
    order = np.argsort(p, kind="mergesort")
    k = p.size
    adj = np.minimum(1.0, np.maximum.accumulate(p[order] * (k - np.arange(k))))
    out = np.empty_like(adj)
    out[order] = adj
    return out


def rejection_thresholds(pvalues: np.ndarray, alpha: float, method: str = "holm") -> np.ndarray:
    """Per hypothesis, the level γ it was rejected at (NaN where it was not rejected). Rejected exactly
    where ``adjust(p, method) <= alpha`` (checked against statsmodels' own ``reject`` in the tests)."""
    _check(method)
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    k = idx.size
    if k == 0:
        return out
    order = idx[np.argsort(p[idx], kind="stable")]
    ps = p[order]
    if method == "none":
        rej = ps <= alpha
        out[order[rej]] = alpha
    elif method == "holm":
        steps = alpha / (k - np.arange(k))
        fails = np.flatnonzero(ps > steps)
        stop = fails[0] if fails.size else k
        out[order[:stop]] = steps[:stop]
    else:  # Benjamini-Hochberg step-up
        steps = alpha * np.arange(1, k + 1) / k
        ok = np.flatnonzero(ps <= steps)
        if ok.size:
            kstar = ok[-1] + 1
            out[order[:kstar]] = alpha * kstar / k
    return out
