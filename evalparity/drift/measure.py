"""Running summaries of drift, reduced on the device, so that a large model over many prompts keeps only a
few numbers per layer and only those leave the GPU.

Per hidden-state entry (0 = embeddings, last = final norm): relative error ||b - a|| / ||a|| over all tokens,
mean cosine similarity per token, max absolute error; per prompt, its own relative error per entry (for the
first entry where each prompt drifts). Per position bucket: the same at the last entry, and |Δ prompt
logprob|. The worst tokens are kept in a small heap. ``a`` is the reference backend, ``b`` the cell.
Sums are float64, as the per-prompt probes kept them before batching.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import torch

from evalparity.backends.probes import HiddenBatch, segments
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

    def add_sums(self, sq_diff: float, sq_ref: float, cos_sum: float, tokens: int, max_abs: float) -> None:
        self.sq_diff += sq_diff
        self.sq_ref += sq_ref
        self.cos_sum += cos_sum
        self.tokens += tokens
        self.max_abs = max(self.max_abs, max_abs)

    def summary(self) -> dict:
        return {"rel_error": (self.sq_diff / self.sq_ref) ** 0.5 if self.sq_ref else float("nan"),
                "cosine": self.cos_sum / self.tokens if self.tokens else float("nan"),
                "max_abs_error": self.max_abs, "tokens": self.tokens}


def token_reductions(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of ``[N, H]``: squared error, squared reference norm, cosine similarity, max |error| (float64,
    on the tensors' device)."""
    a, b = a.double(), b.double()
    d = b - a
    sq_ref = (a * a).sum(-1)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    return (d * d).sum(-1), sq_ref, cos, d.abs().amax(-1)


@dataclass
class DriftAccumulator:
    entries: list[int] = field(default_factory=list)
    layers: list[LayerStats] = field(default_factory=list)
    by_bucket: dict[int, LayerStats] = field(default_factory=dict)
    prompt_sq: list[np.ndarray] = field(default_factory=list)  # per batch: [n, entries, 2] (sq_diff, sq_ref)
    lp_abs: list[np.ndarray] = field(default_factory=list)
    lp_pos: list[np.ndarray] = field(default_factory=list)
    worst: list[tuple] = field(default_factory=list)
    gen_first_div: list[int | None] = field(default_factory=list)
    gen_prompt_len: list[int] = field(default_factory=list)
    gen_match: list[float] = field(default_factory=list)
    n_prompts: int = 0
    tokenization_mismatches: list[dict] = field(default_factory=list)

    def add_batch(self, prompt_idx: list[int], ids: list[list[int]], ref: HiddenBatch, cell: HiddenBatch,
                  decode, k: int = 20) -> None:
        """One batch of prompts, both sides computed on the same ids; the reference's tensors are moved to
        the cell's device (a no-op where they were loaded there)."""
        entries = sorted(cell.hidden)
        if sorted(ref.hidden) != entries or ref.lengths != cell.lengths or ref.pooling != cell.pooling:
            raise ValueError("the reference and the cell were probed on different entries, prompts or pooling")
        if not self.entries:
            self.entries, self.layers = entries, [LayerStats() for _ in entries]
        n = len(prompt_idx)
        some = cell.hidden[entries[0]]
        dev = some.device
        rows = ref.lengths if cell.pooling == "all" else [1] * n
        seg = segments(rows, dev)
        # a row's position: its token's (all), the prompt's last (last) or, for the mean, the last too;
        # made on the host, as everything the device needs here, so that nothing waits for it until the end
        pos = (np.concatenate([np.arange(m) for m in ref.lengths]) if cell.pooling == "all"
               else np.asarray([m - 1 for m in ref.lengths]))
        bucket = torch.as_tensor(bucket_of(pos)).to(dev)
        per_prompt = torch.zeros(n, len(entries), 2, dtype=torch.float64, device=dev)
        totals = torch.zeros(len(entries), 5, dtype=torch.float64, device=dev)
        totals[:, 3] = float(sum(rows))  # the rows each entry compares
        last_sums = None
        for j, e in enumerate(entries):
            sq, sq_a, cos, mx = token_reductions(ref.hidden[e].to(dev), cell.hidden[e])
            totals[j, :3] = torch.stack([sq.sum(), sq_a.sum(), cos.sum()])
            if mx.numel():
                totals[j, 4] = mx.max()
            per_prompt[:, j, 0].index_add_(0, seg, sq)
            per_prompt[:, j, 1].index_add_(0, seg, sq_a)
            if j == len(entries) - 1:
                nb = len(BUCKETS) + 1
                last_sums = torch.zeros(nb, 5, dtype=torch.float64, device=dev)
                for c, v in enumerate((sq, sq_a, cos, torch.ones_like(sq))):
                    last_sums[:, c].index_add_(0, bucket, v)
                last_sums[:, 4].scatter_reduce_(0, bucket, mx, reduce="amax")
        for st, t in zip(self.layers, totals.cpu().tolist()):
            st.add_sums(t[0], t[1], t[2], int(t[3]), t[4])
        for bkt, t in enumerate(last_sums.cpu().tolist()):
            if t[3]:
                self.by_bucket.setdefault(bkt, LayerStats()).add_sums(t[0], t[1], t[2], int(t[3]), t[4])
        self.prompt_sq.append(per_prompt.cpu().numpy())
        self._add_logprobs(prompt_idx, ids, ref, cell, decode, k)
        self.n_prompts += n

    def _add_logprobs(self, prompt_idx, ids, ref: HiddenBatch, cell: HiddenBatch, decode, k: int) -> None:
        d_all = (cell.logprobs - ref.logprobs).abs().numpy()
        at = 0
        for i, p in zip(prompt_idx, ids):
            d = d_all[at:at + len(p) - 1]
            at += len(p) - 1
            self.lp_abs.append(d)
            self.lp_pos.append(np.arange(1, len(p)))
            for j in np.argsort(-d)[:3]:
                full = len(self.worst) >= k
                if full and float(d[j]) <= self.worst[0][0]:
                    continue
                item = (float(d[j]), i, int(j + 1), decode(p[max(0, j - 8): j + 1]), decode(p[j + 1: j + 2]))
                (heapq.heapreplace if full else heapq.heappush)(self.worst, item)

    def add_generation(self, prompt_len: int, a: list[int], b: list[int]) -> None:
        self.gen_first_div.append(first_divergence(a, b))
        self.gen_prompt_len.append(prompt_len)
        n = max(len(a), len(b), 1)
        self.gen_match.append(sum(x == y for x, y in zip(a, b)) / n)

    def first_drifting(self, threshold: float) -> dict:
        """Per prompt, the first entry whose relative error is over ``threshold``: how many prompts first
        drift at each entry, and how many never do."""
        if not self.prompt_sq:
            return {"by_entry": {}, "never": 0}
        sq = np.concatenate(self.prompt_sq)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.sqrt(sq[:, :, 0] / sq[:, :, 1])
        over = rel > threshold
        first = np.where(over.any(1), over.argmax(1), -1)
        counts = {str(self.entries[j]): int((first == j).sum()) for j in range(len(self.entries)) if (first == j).any()}
        return {"by_entry": counts, "never": int((first == -1).sum())}

    def summary(self, threshold: float) -> dict:
        layers = [ls.summary() | {"layer": e} for e, ls in zip(self.entries, self.layers)]
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
            "layers": layers, "by_position": by_pos, "first_drifting_by_prompt": self.first_drifting(threshold),
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
