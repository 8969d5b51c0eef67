"""The HF probe's hidden-states forward (``evalparity hidden --backend hf``'s) against its batch size: the same
prompts pooled to their last token at several token budgets (rows x longest row per batch), each timed twice
after one warm-up call. Why: without the LM head, a small model's batch costs mostly its kernel launches and
the host's work around them, so fewer, larger batches may be faster; ``HFProbe.hidden_budget`` sizes them by
the hidden states' memory instead of the logits'. Prints prompts/s per budget and the largest difference of
the pooled states from the first budget's (bf16 kernels may differ with the batch's shape). No asserts.

    python benchmarks/hf_probe_batches.py --model /tmp/epcache/models/SmolLM2-135M-Instruct --device cuda \\
        --datasets-dir /work/shared/data --n-prompts 10000 --budgets 10922,32768,0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from hidden_bench import load_prompts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--datasets-dir", required=True)
    ap.add_argument("--prompts", default=None)
    ap.add_argument("--n-prompts", type=int, default=10000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--layers", default="10,20,-1")
    ap.add_argument("--budgets", default="10922,32768,0", help="token budgets; 0: the probe's own default")
    args = ap.parse_args()

    import os

    from evalparity.drift import launch_plan
    from evalparity.spec import SHORT_DTYPE, parse_dtype

    name = f"hf-{SHORT_DTYPE[parse_dtype(args.dtype)]}"
    launch = launch_plan(args.model, [name], name, device=args.device, max_len=2048)
    os.environ.update(launch[name]["env"])
    import torch

    from evalparity.drift.worker import load_side, resolve_entries
    from evalparity.hidden import distinct, probe_pooled

    probe = load_side({"launch": launch}, name)
    texts = load_prompts(args)
    uniq, _ = distinct([list(x)[:2048] for x in probe.encode(texts)])
    entries = resolve_entries([int(x) for x in args.layers.split(",")], probe.n_entries)
    default = probe.hidden_budget
    print(f"{len(uniq)} distinct prompts, {sum(map(len, uniq)):,} tokens, entries {entries}, {args.dtype} on "
          f"{probe.device}; the probe's default hidden budget: {default} tokens (logprobs budget "
          f"{probe.token_budget})")
    probe_pooled(probe, uniq[:256], entries, "last")  # warm-up: CUDA's start, the kernels' first launches
    first = None
    for b in [int(x) or default for x in args.budgets.split(",")]:
        probe.hidden_budget = b
        walls = []
        for _ in range(2):
            if probe.device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = probe_pooled(probe, uniq, entries, "last")
            if probe.device.type == "cuda":
                torch.cuda.synchronize()
            walls.append(time.perf_counter() - t)
        first = first or out
        diff = max(float((out[e] - first[e]).abs().max()) for e in entries)
        print(f"budget {b:6d} tokens: {len(uniq) / min(walls):8.1f} prompts/s (walls "
              f"{', '.join(f'{w:.2f}' for w in walls)} s); max |diff| from the first budget {diff:.2e}")


if __name__ == "__main__":
    main()
