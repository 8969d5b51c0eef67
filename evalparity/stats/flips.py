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


def decision_flips(choices: pd.DataFrame) -> FlipResult:
    """``choices``: one row per (doc_id, choice) with columns ref_score, cell_score and optionally gold.

    Vectorised over docs (a million requests take seconds): ranks within each doc give the reference's top
    two choices, ``idxmax`` gives the cell's choice. Docs with a non-finite score on either side are left
    out (the loglikelihood statistics count them).
    """
    cols = ["doc_id", "choice", "ref_score", "cell_score"] + (["gold"] if "gold" in choices else [])
    df = choices[cols].copy()
    finite = np.isfinite(df["ref_score"].to_numpy(float)) & np.isfinite(df["cell_score"].to_numpy(float))
    bad_docs = set(df.loc[~finite, "doc_id"])
    if bad_docs:
        df = df[~df["doc_id"].isin(bad_docs)]
    empty = pd.DataFrame(columns=["doc_id", "ref_choice", "cell_choice", "ref_margin", "margin_shift",
                                  "max_abs_delta", "gold"])
    if df.empty:
        return FlipResult(0, 0, 0.0, 1.0, empty)
    df = df.sort_values(["doc_id", "choice"], kind="stable")
    df["delta"] = df["cell_score"] - df["ref_score"]
    df["rank"] = df.groupby("doc_id")["ref_score"].rank(method="first", ascending=False)
    top1 = df[df["rank"] == 1].set_index("doc_id")
    top2 = df[df["rank"] == 2].set_index("doc_id").reindex(top1.index)
    cell_choice = df.loc[df.groupby("doc_id")["cell_score"].idxmax(), ["doc_id", "choice"]].set_index("doc_id")
    margin = (top1["ref_score"] - top2["ref_score"]).fillna(np.inf)  # a one-choice doc cannot flip
    shift = (top1["delta"] - top2["delta"]).fillna(0.0)
    max_abs = df.assign(a=df["delta"].abs()).groupby("doc_id")["a"].max()
    out = pd.DataFrame({"ref_choice": top1["choice"].astype(int),
                        "cell_choice": cell_choice["choice"].reindex(top1.index).astype(int),
                        "ref_margin": margin, "margin_shift": shift, "max_abs_delta": max_abs.reindex(top1.index),
                        "gold": top1["gold"] if "gold" in top1 else None}).reset_index()
    flipped = out[out["ref_choice"] != out["cell_choice"]].reset_index(drop=True)
    n = len(out)
    m = out["ref_margin"].to_numpy(float)
    e = np.sort(out["margin_shift"].to_numpy(float))
    # #{j : e_j < -m_i} for every i, by binary search on the sorted shifts.
    expected = float(np.searchsorted(e, -m, side="left").sum() / n)
    observed = len(flipped)
    if observed == 0:
        pvalue = 1.0
    elif expected == 0:
        pvalue = 0.0
    else:
        pvalue = float(sps.poisson.sf(observed - 1, expected))
    return FlipResult(n, observed, expected, pvalue, flipped)
