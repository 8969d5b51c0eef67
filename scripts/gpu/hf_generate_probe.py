"""GPU side: why HF's batched greedy generation took 3.4x longer in bf16 than in fp32 in the drift probe
(results/drift-h200/drift1000: 14.7 s against 4.3 s, 1,000 prompts x 32 tokens, the same batches). Times the
probe's own generate (evalparity.backends.probes.HFProbe.generate) on SmolLM2 in each dtype and attention
implementation, on the same 1,000 HellaSwag prompts; prints seconds and steps. A probe, not a test.

    python3 scripts/gpu/hf_generate_probe.py MODEL_DIR .gpudata/Rowan/hellaswag/default/validation.jsonl
"""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from evalparity.backends.probes import HFProbe


def main(model_dir: str, data: str, mode: str = "attention", n: int = 1000) -> None:
    """``mode``: ``attention`` (each dtype x SDPA/eager, the probe's batches) or ``rows`` (SDPA, the probe's
    batches against batches 4x and 16x larger, budget and rows alike)."""
    rows = [json.loads(x) for x in open(data)][:n]
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = [tok(r["ctx"] + " " + r["endings"][0])["input_ids"] for r in rows]
    torch.backends.cuda.matmul.allow_tf32 = False
    variants = [(d, a, 1) for d in (torch.float32, torch.bfloat16) for a in ("sdpa", "eager")] if mode == "attention" \
        else [(d, "sdpa", k) for d in (torch.bfloat16, torch.float32) for k in (1, 4, 16)]
    for dtype, attn, scale in variants:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn).cuda().eval()
        lm = SimpleNamespace(model=model, tokenizer=tok, batch_encode=None, device=torch.device("cuda"))
        probe = HFProbe(lm)
        probe.token_budget *= scale
        probe.generate(ids[:64], 4)  # warm-up
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = probe.generate(ids, 32, rows=256 * scale)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"{str(dtype):15s} {attn:6s} x{scale:<2d} generate {dt:6.2f} s, {sum(map(len, out))} tokens, "
              f"ended early {sum(len(o) < 32 for o in out)} of {len(out)}, peak "
              f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
        del model, probe


if __name__ == "__main__":
    main(*sys.argv[1:])
