"""Running summaries of drift, so that a large model over many prompts keeps only a few numbers per layer.

Per layer: relative error ||b - a|| / ||a|| over all tokens, mean cosine similarity per token, max absolute
error. Per position bucket: the same at the last layer, and |Δ prompt logprob|. The worst tokens are kept in
a small heap. ``a`` is the reference backend, ``b`` the cell.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import torch

from evalparity.stats.generations import first_divergence

BUCKETS = (128, 512, 2048, 8192, 32768)


def bucket_of(pos: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.asarray(BUCKETS), pos, side="right")


def bucket_label(i: int) -> str:
    lo = 0 if i == 0 else BUCKETS[i - 1]
    return f"{lo}-{BUCKETS[i]}" if i < len(BUCKETS) else f"{BUCKETS[-1]}+"


@dataclass
class LayerStats:
    sq_diff: float = 0.0
    sq_ref: float = 0.0
    cos_sum: float = 0.0
    tokens: int = 0
    max_abs: float = 0.0

    def add(self, a: torch.Tensor, b: torch.Tensor) -> None:
        d = (b - a).double()
        self.sq_diff += float((d * d).sum())
        self.sq_ref += float((a.double() ** 2).sum())
        self.cos_sum += float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).sum())
        self.tokens += a.shape[0]
        self.max_abs = max(self.max_abs, float(d.abs().max()))

    def summary(self) -> dict:
        return {"rel_error": (self.sq_diff / self.sq_ref) ** 0.5 if self.sq_ref else float("nan"),
                "cosine": self.cos_sum / self.tokens if self.tokens else float("nan"),
                "max_abs_error": self.max_abs, "tokens": self.tokens}


@dataclass
class DriftAccumulator:
    layers: list[LayerStats] = field(default_factory=list)
    by_bucket: dict[int, LayerStats] = field(default_factory=dict)
    lp_abs: list[np.ndarray] = field(default_factory=list)
    lp_pos: list[np.ndarray] = field(default_factory=list)
    worst: list[tuple] = field(default_factory=list)
    gen_first_div: list[int | None] = field(default_factory=list)
    gen_prompt_len: list[int] = field(default_factory=list)
    gen_match: list[float] = field(default_factory=list)
    n_prompts: int = 0
    tokenization_mismatches: list[dict] = field(default_factory=list)

    def add_prompt(self, prompt_idx: int, ids: list[int], ref, cell, decode, k: int = 20) -> None:
        if not self.layers:
            self.layers = [LayerStats() for _ in ref.hidden]
        if len(ref.hidden) != len(cell.hidden):
            raise ValueError(f"reference has {len(ref.hidden)} hidden-state entries, cell {len(cell.hidden)}")
        for acc, a, b in zip(self.layers, ref.hidden, cell.hidden):
            acc.add(a, b)
        pos = np.arange(len(ids))
        buckets = bucket_of(pos)
        last_a, last_b = ref.hidden[-1], cell.hidden[-1]
        for bkt in np.unique(buckets):
            sel = torch.from_numpy(buckets == bkt)
            self.by_bucket.setdefault(int(bkt), LayerStats()).add(last_a[sel], last_b[sel])
        d = (cell.logprobs - ref.logprobs).abs().numpy()
        self.lp_abs.append(d)
        self.lp_pos.append(pos[1:])
        for j in np.argsort(-d)[:3]:
            item = (float(d[j]), prompt_idx, int(j + 1))
            if len(self.worst) < k:
                heapq.heappush(self.worst, item + (decode(ids[max(0, j - 8): j + 1]), decode(ids[j + 1: j + 2])))
            elif item[0] > self.worst[0][0]:
                heapq.heapreplace(self.worst, item + (decode(ids[max(0, j - 8): j + 1]), decode(ids[j + 1: j + 2])))
        self.n_prompts += 1

    def add_generation(self, prompt_len: int, a: list[int], b: list[int]) -> None:
        self.gen_first_div.append(first_divergence(a, b))
        self.gen_prompt_len.append(prompt_len)
        n = max(len(a), len(b), 1)
        self.gen_match.append(sum(x == y for x, y in zip(a, b)) / n)

    def summary(self, threshold: float) -> dict:
        layers = [ls.summary() | {"layer": i} for i, ls in enumerate(self.layers)]
        first_over = next((x["layer"] for x in layers if x["rel_error"] > threshold), None)
        lp = np.concatenate(self.lp_abs) if self.lp_abs else np.zeros(0)
        lp_pos = np.concatenate(self.lp_pos) if self.lp_pos else np.zeros(0, dtype=int)
        lp_b = bucket_of(lp_pos)
        by_pos = []
        for bkt, st in sorted(self.by_bucket.items()):
            sel = lp_b == bkt
            by_pos.append(st.summary() | {"bucket": bucket_label(bkt),
                                          "logprob_abs_mean": float(lp[sel].mean()) if sel.any() else None})
        gens = None
        if self.gen_first_div:
            div = [x for x in self.gen_first_div if x is not None]
            gl = np.asarray(self.gen_prompt_len)
            diverged = np.asarray([x is not None for x in self.gen_first_div])
            gens = {"n": len(self.gen_first_div), "identical": float(1 - diverged.mean()),
                    "token_match_rate": float(np.mean(self.gen_match)), "first_divergence": div,
                    "divergence_by_prompt_length": [
                        {"bucket": bucket_label(int(b)), "n": int((bucket_of(gl) == b).sum()),
                         "diverged": float(diverged[bucket_of(gl) == b].mean())}
                        for b in np.unique(bucket_of(gl))]}
        return {
            "n_prompts": self.n_prompts, "threshold": threshold, "first_layer_over_threshold": first_over,
            "layers": layers, "by_position": by_pos,
            "prompt_logprobs": {"tokens": int(lp.size), "abs_mean": float(lp.mean()) if lp.size else None,
                                "abs_p50": float(np.quantile(lp, 0.5)) if lp.size else None,
                                "abs_p99": float(np.quantile(lp, 0.99)) if lp.size else None,
                                "abs_max": float(lp.max()) if lp.size else None,
                                "histogram": np.histogram(np.log10(np.maximum(lp, 1e-9)), bins=40,
                                                          range=(-9, 1))[0].tolist() if lp.size else []},
            "worst_tokens": [{"abs_delta": w[0], "prompt": w[1], "position": w[2], "context": w[3], "token": w[4]}
                             for w in sorted(self.worst, reverse=True)],
            "generations": gens,
            "tokenization_mismatches": self.tokenization_mismatches,
        }
