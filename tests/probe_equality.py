"""``python probe_equality.py MODEL CELL``: one side's probe, batched against one prompt at a time, printed as
JSON (the worst relative error per pooling, and whether batched generation kept every token). Run by
test_drift in a process of its own, with the cell's environment (``drift.launch_plan``)."""

from __future__ import annotations

import json
import sys

import torch

from evalparity.drift import launch_plan
from evalparity.drift.worker import load_side

PROMPTS = ["the cat sat on the mat and ran far away to the big red house",
           "one two three four five six seven eight nine ten is the answer",
           "what is the question", "a b", "the cat sat on the mat", "which answer is true or false and why not"]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((b.double() - a.double()).norm() / a.double().norm())


def main(model: str, cell: str) -> None:
    if model == "embedded":
        from evalparity.data import embedded

        model = str(embedded.model_path())
    launch = launch_plan(model, [cell], cell, device="cpu", max_len=256)
    probe = load_side({"launch": launch}, cell)
    ids = probe.encode(PROMPTS)
    entries = list(range(probe.n_entries))
    out: dict = {}
    for pooling in ("all", "last", "mean"):
        batched = probe.forward(ids, entries, pooling)
        alone = [probe.forward([p], entries, pooling) for p in ids]
        worst = max(rel(torch.cat([x.hidden[e] for x in alone]), batched.hidden[e]) for e in entries)
        lp = float((torch.cat([x.logprobs for x in alone]) - batched.logprobs).abs().max())
        bare = probe.forward(ids, entries, pooling, logprobs=False)  # hidden states only (evalparity hidden)
        same = all(torch.equal(bare.hidden[e], batched.hidden[e]) for e in entries) and bare.logprobs.numel() == 0
        out[pooling] = {"rel_error": worst, "logprob_abs": lp, "rows": int(batched.hidden[0].shape[0]),
                        "without_logprobs_same": same}
    gen = probe.generate(ids, 6)
    out["generation_same"] = gen == [probe.generate([p], 6)[0] for p in ids]
    out["tokens"] = sum(map(len, ids))
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:])
