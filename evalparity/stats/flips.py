"""Decision flips: the docs whose chosen answer changed, and whether noise on near-ties explains them.

For a multiple-choice doc the answer is the argmax of a per-choice score (the loglikelihood for acc, the
length-normalised one for acc_norm, as lm-eval decides). A flip happens when a perturbation of the scores
is larger than the reference's margin between its top two choices. So:

- each doc has a reference margin m_i (top-1 minus top-2 score) and a perturbation of that margin,
  e_i = Δ(top-1 choice) - Δ(top-2 choice), measured between the cells;
- if perturbations were noise unrelated to the doc, any e_j could have hit any doc, and the expected number
  of flips is Σ_i P(m_i + E < 0) with E drawn from the observed {e_j}: (1/N) Σ_i #{j : e_j < -m_i};
- observed flips far above that number (a one-sided Poisson tail) mean the drift is systematic: it hits
  the docs where it changes answers, or it is larger than the Δ distribution says.

Only flips to the runner-up are modelled (a flip to the third choice needs a larger perturbation and is
counted as observed but not expected), which makes the expectation slightly conservative.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps


@dataclass(frozen=True)
class FlipResult:
    """``statistic`` is the observed number of flips; ``pvalue`` tests 'more flips than noise explains'."""

    n_docs: int
    statistic: int
    expected: float
    pvalue: float
    flipped: pd.DataFrame  # doc_id, ref_choice, cell_choice, ref_margin, margin_shift, gold


def _top_two(scores: np.ndarray) -> tuple[int, int, float]:
    order = np.argsort(-scores, kind="stable")
    if scores.size < 2:
        return int(order[0]), int(order[0]), float("inf")
    return int(order[0]), int(order[1]), float(scores[order[0]] - scores[order[1]])


def decision_flips(choices: pd.DataFrame) -> FlipResult:
    """``choices``: one row per (doc_id, choice) with columns ref_score, cell_score and optionally gold."""
    rows = []
    margins, shifts = [], []
    for doc_id, g in choices.groupby("doc_id", sort=True):
        g = g.sort_values("choice")
        ref = g["ref_score"].to_numpy(float)
        cell = g["cell_score"].to_numpy(float)
        if not (np.all(np.isfinite(ref)) and np.all(np.isfinite(cell))):
            continue
        top1, top2, margin = _top_two(ref)
        cell_choice = int(np.argmax(cell))
        delta = cell - ref
        shift = float(delta[top1] - delta[top2]) if top1 != top2 else 0.0
        margins.append(margin)
        shifts.append(shift)
        if cell_choice != top1:
            gold = g["gold"].iloc[0] if "gold" in g else None
            rows.append({"doc_id": doc_id, "ref_choice": top1, "cell_choice": cell_choice,
                         "ref_margin": margin, "margin_shift": shift,
                         "max_abs_delta": float(np.max(np.abs(delta))), "gold": gold})
    n = len(margins)
    flipped = pd.DataFrame(rows, columns=["doc_id", "ref_choice", "cell_choice", "ref_margin",
                                          "margin_shift", "max_abs_delta", "gold"])
    if n == 0:
        return FlipResult(0, 0, 0.0, 1.0, flipped)
    m = np.asarray(margins)
    e = np.sort(np.asarray(shifts))
    # #{j : e_j < -m_i} for every i, by binary search on the sorted shifts.
    expected = float(np.searchsorted(e, -m, side="left").sum() / n)
    observed = len(rows)
    pvalue = float(sps.poisson.sf(observed - 1, expected)) if observed > 0 else 1.0
    if expected == 0 and observed > 0:
        pvalue = 0.0
    return FlipResult(n, observed, expected, pvalue, flipped)
