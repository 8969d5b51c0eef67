"""Multiple comparisons: one family over tasks x metrics x cells, adjusted with statsmodels."""

from __future__ import annotations

import numpy as np
from statsmodels.stats.multitest import multipletests

METHODS = {"holm": "holm", "bh": "fdr_bh", "none": None}


def adjust(pvalues: np.ndarray, method: str = "holm") -> np.ndarray:
    """Adjusted p-values; ``method`` is 'holm' (family-wise, the default), 'bh' (false discovery rate)
    or 'none'. NaN p-values stay NaN and are not counted in the family."""
    if method not in METHODS:
        raise ValueError(f"unknown multiple-testing method {method!r}: use one of {', '.join(METHODS)}")
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    ok = np.isfinite(p)
    if not ok.any():
        return out
    if METHODS[method] is None:
        out[ok] = p[ok]
    else:
        out[ok] = multipletests(p[ok], method=METHODS[method])[1]
    return out
