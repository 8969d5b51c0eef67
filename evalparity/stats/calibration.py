"""Exact operating characteristics of the decision rule for one paired binary comparison.

Every (b, c) table of n docs is enumerated with its multinomial probability under the true rates
(P(ref only), P(cell only)), the product's own p-values (``paired.binary_tests``) and verdict rule
(``verdict.classify``) are evaluated on each, and the probabilities of each verdict are summed. Tables of
negligible probability are skipped; the mass skipped is returned, so the figures are exact to within it.

The staged (group-sequential) rule's counterpart, a dynamic programme over the looks that equals this at one
look, is ``sequential.staged_probabilities`` (it lives beside the rule: its planner needs it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from evalparity.stats import paired, verdict

TAIL = 1e-13  # skip tables whose k, or b given k, lies beyond this tail probability


@dataclass(frozen=True)
class Operating:
    """P(verdict) for one design point; ``skipped`` is the probability mass not enumerated."""

    equivalent: float
    different: float
    shift: float
    inconclusive: float
    skipped: float


def verdict_probabilities(n: int, p_ref_only: float, p_cell_only: float, *, margin: float = 0.01,
                          alpha: float = 0.05, direction: str = "both") -> Operating:
    psi = p_ref_only + p_cell_only
    ks = np.arange(n + 1) if psi <= 0 else np.arange(
        int(sps.binom.ppf(TAIL, n, psi)), int(sps.binom.isf(TAIL, n, psi)) + 1)
    if psi <= 0:
        ks = np.array([0])
    pk = sps.binom.pmf(ks, n, psi) if psi > 0 else np.array([1.0])
    pi = p_ref_only / psi if psi > 0 else 0.5
    bs, cs, ws = [], [], []
    for k, wk in zip(ks, pk):
        if k == 0:
            b = np.array([0])
        else:
            lo, hi = int(sps.binom.ppf(TAIL, k, pi)), int(sps.binom.isf(TAIL, k, pi))
            b = np.arange(max(lo, 0), min(hi, k) + 1)
        wb = sps.binom.pmf(b, k, pi) if k else np.array([1.0])
        bs.append(b)
        cs.append(k - b)
        ws.append(wk * wb)
    b, c, w = np.concatenate(bs), np.concatenate(cs), np.concatenate(ws)
    p_eq, p_beyond, p_shift = paired.binary_tests(b, c, n, margin, direction=direction)
    v = verdict.classify(p_eq, p_beyond < alpha, p_shift < alpha, alpha)
    total = float(w.sum())

    def mass(name: str) -> float:
        return float(w[v == name].sum())

    return Operating(mass(verdict.EQUIVALENT), mass(verdict.DIFFERENT), mass(verdict.SHIFT),
                     mass(verdict.INCONCLUSIVE), max(0.0, 1.0 - total))
