"""Decision flips: the docs whose chosen answer changed, and whether noise unrelated to the doc explains them.

For a multiple-choice doc the answer is the argmax of a per-choice score: the loglikelihood for acc, the
loglikelihood per character of the choice for acc_norm (as lm-eval decides). Between two cells each doc i
has a reference score vector s_i and a vector of score changes Δ_i (cell − reference, one per choice).

- Observed flips: docs where argmax(s_i + Δ_i) differs from argmax(s_i).
- Expected flips if the changes were noise unrelated to the doc: any doc's Δ_j could have hit doc i, so
  the expectation is (1/N) Σ_i Σ_j 1[argmax(s_i + Δ_j) ≠ argmax(s_i)]. The whole vector Δ_j is applied,
  so a flip to any other choice (not only the runner-up) is modelled. Docs are matched by their number of
  choices. All pairs are counted when there are few docs; otherwise the sum is estimated from
  ``N_PERMUTATIONS`` random assignments of donors to docs, each an unbiased estimate whose Monte-Carlo
  variance is at most the expectation itself, so the average adds about 1/16 to the count's own variance.
- p-value: observed against expected through the Poisson upper tail (a sum of independent Bernoullis has a
  lighter upper tail than the Poisson of the same mean, so this is conservative). A small p means the
  drift hits the docs where it changes answers, or is larger than the Δ distribution says: systematic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

ALL_PAIRS_BUDGET = 20_000_000  # N² K below this: every donor for every doc
N_PERMUTATIONS = 16
CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class FlipResult:
    """``statistic`` is the observed number of flips; ``pvalue`` tests 'more flips than noise explains'."""

    n_docs: int
    statistic: int
    expected: float
    pvalue: float
    flipped: pd.DataFrame  # doc_id, ref_choice, cell_choice, ref_margin, margin_shift, max_abs_delta, gold
    method: str = "all pairs"


def _argmax_first(x: np.ndarray) -> np.ndarray:
    return np.argmax(x, axis=-1)


def _expected_flips(s: np.ndarray, d: np.ndarray, choice: np.ndarray, seed: int) -> tuple[float, str]:
    """Σ_i (1/N) Σ_j 1[argmax(s_i + d_j) ≠ choice_i], exactly or from random donor assignments."""
    n, k = s.shape
    if n * n * k <= ALL_PAIRS_BUDGET:
        total = 0
        rows = max(1, CHUNK_ELEMENTS // (n * k))
        for start in range(0, n, rows):
            block = s[start:start + rows, None, :] + d[None, :, :]
            total += int(np.sum(_argmax_first(block) != choice[start:start + rows, None]))
        return total / n, "all pairs"
    rng = np.random.default_rng(seed)
    total = 0
    for _ in range(N_PERMUTATIONS):
        donors = rng.permutation(n)
        total += int(np.sum(_argmax_first(s + d[donors]) != choice))
    return total / N_PERMUTATIONS, f"{N_PERMUTATIONS} random donor assignments"


def decision_flips(choices: pd.DataFrame, *, seed: int = 0) -> FlipResult:
    """``choices``: one row per (doc_id, choice) with columns ref_score, cell_score and optionally gold.

    Vectorised over docs: the choices are pivoted into one score matrix per number of choices. Docs with a
    non-finite score on either side are left out (the loglikelihood statistics count them).
    """
    cols = ["doc_id", "choice", "ref_score", "cell_score"] + (["gold"] if "gold" in choices else [])
    df = choices[cols]
    finite = np.isfinite(df["ref_score"].to_numpy(float)) & np.isfinite(df["cell_score"].to_numpy(float))
    if not finite.all():
        bad = df.loc[~finite, "doc_id"].unique()
        df = df[~df["doc_id"].isin(bad)]
    empty = pd.DataFrame(columns=["doc_id", "ref_choice", "cell_choice", "ref_margin", "margin_shift",
                                  "max_abs_delta", "gold"])
    if df.empty:
        return FlipResult(0, 0, 0.0, 1.0, empty)
    df = df.sort_values(["doc_id", "choice"], kind="stable")
    doc_ids, starts, sizes = np.unique(df["doc_id"].to_numpy(), return_index=True, return_counts=True)
    ref_all, cell_all = df["ref_score"].to_numpy(float), df["cell_score"].to_numpy(float)
    choice_all = df["choice"].to_numpy()
    gold_all = df["gold"].to_numpy() if "gold" in df else None
    parts, expected, observed, methods = [], 0.0, 0, set()
    for k in np.unique(sizes):
        sel = np.flatnonzero(sizes == k)
        idx = starts[sel][:, None] + np.arange(k)[None, :]
        s, c = ref_all[idx], cell_all[idx]
        d = c - s
        ref_choice, cell_choice = _argmax_first(s), _argmax_first(c)
        if k > 1:
            e, how = _expected_flips(s, d, ref_choice, seed)
            expected += e
            methods.add(how)
        flip = ref_choice != cell_choice
        observed += int(flip.sum())
        order = np.argsort(-s, axis=1, kind="stable")
        top1, top2 = order[:, 0], order[:, 1] if k > 1 else order[:, 0]
        rows = np.arange(len(sel))
        margin = s[rows, top1] - s[rows, top2] if k > 1 else np.full(len(sel), np.inf)
        parts.append(pd.DataFrame({
            "doc_id": doc_ids[sel], "ref_choice": choice_all[idx[rows, ref_choice]],
            "cell_choice": choice_all[idx[rows, cell_choice]], "ref_margin": margin,
            "margin_shift": d[rows, top1] - d[rows, top2], "max_abs_delta": np.abs(d).max(axis=1),
            "gold": gold_all[idx[:, 0]] if gold_all is not None else None, "_flip": flip}))
    out = pd.concat(parts, ignore_index=True)
    flipped = out[out["_flip"]].drop(columns="_flip").sort_values("doc_id").reset_index(drop=True)
    if observed == 0:
        pvalue = 1.0
    elif expected == 0:
        pvalue = 0.0
    else:
        pvalue = float(sps.poisson.sf(observed - 1, expected))
    return FlipResult(len(out), observed, expected, pvalue, flipped, " + ".join(sorted(methods)) or "one choice")
