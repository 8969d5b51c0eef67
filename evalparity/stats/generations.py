"""Generations compared by token ids: identical share and the first position where they diverge.

Text alone can hide differences (two tokenisations of one string) or invent them (the detokenisers of vLLM
and HF treat an incomplete UTF-8 byte at the end differently), so the primary comparison is on the
generated token ids; text identity is reported beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GenerationResult:
    """``statistic`` is the share of docs whose generated token ids are identical."""

    n: int
    statistic: float
    identical_text: float
    n_without_ids: int
    first_divergence: np.ndarray  # one entry per diverging doc: index of the first differing token

    @property
    def median_first_divergence(self) -> float:
        return float(np.median(self.first_divergence)) if self.first_divergence.size else float("nan")


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (the shorter length if one is a prefix);
    None when identical."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def compare_generations(
    ref_ids: Sequence[Sequence[int] | None],
    cell_ids: Sequence[Sequence[int] | None],
    ref_text: Sequence[str],
    cell_text: Sequence[str],
) -> GenerationResult:
    n = len(ref_text)
    if not (len(ref_ids) == len(cell_ids) == len(cell_text) == n):
        raise ValueError("generation columns differ in length: align the docs first")
    same_text = float(np.mean([a == b for a, b in zip(ref_text, cell_text)])) if n else float("nan")
    same_ids, divs, missing = 0, [], 0
    for a, b, ta, tb in zip(ref_ids, cell_ids, ref_text, cell_text):
        if a is None or b is None:
            missing += 1
            same_ids += int(ta == tb)  # fall back to text where ids were not recorded
            continue
        pos = first_divergence(list(a), list(b))
        if pos is None:
            same_ids += 1
        else:
            divs.append(pos)
    share = same_ids / n if n else float("nan")
    return GenerationResult(n, share, same_text, missing, np.asarray(divs, dtype=int))
