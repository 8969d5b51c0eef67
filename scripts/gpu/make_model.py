"""GPU side: write a random-weight Llama with a real architecture's dimensions, no download.

    python3 scripts/gpu/make_model.py OUT [--shape qwen2.5-14b] [--tokenizer DIR]

The weights are random (``AutoModelForCausalLM.from_config``, initialised on the GPU, saved in bf16
safetensors): right for memory, speed and drift mechanics, meaningless for accuracy. Say so wherever its
numbers are reported. The tokenizer is the embedded SmolLM2's (``--tokenizer``, default: evalparity's
prepared embedded model), so the vocabulary is 49,152 and the parameter count 13.7 B for the 14B shape.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from pathlib import Path

SHAPES = {
    # Qwen2.5-14B's dimensions (hidden, intermediate, layers, heads, kv heads) on a Llama block.
    "qwen2.5-14b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=48, num_attention_heads=40,
                        num_key_value_heads=8),
    # Llama-3.1-8B's.
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8),
}


def main() -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", default="qwen2.5-14b", choices=sorted(SHAPES))
    ap.add_argument("--tokenizer", type=Path, default=None)
    ap.add_argument("--max-position", type=int, default=4096)
    a = ap.parse_args()
    t0 = time.perf_counter()
    if a.tokenizer is None:
        from evalparity.data import embedded

        logging.basicConfig(level=logging.INFO, format="%(message)s")  # its preparation's progress, if any
        a.tokenizer = embedded.model_path()
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    cfg = LlamaConfig(vocab_size=len(tok), max_position_embeddings=a.max_position, rms_norm_eps=1e-5,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False,
                      torch_dtype="bfloat16", **SHAPES[a.shape])
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    a.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True, max_shard_size="5GB")
    tok.save_pretrained(a.out)
    for extra in ("generation_config.json",):
        if (a.tokenizer / extra).exists():
            shutil.copy(a.tokenizer / extra, a.out / extra)
    (a.out / "RANDOM_WEIGHTS.md").write_text(f"Random weights, {a.shape} dimensions, {n / 1e9:.2f} B parameters: "
                                              "for memory, speed and drift mechanics only.\n")
    print(f"{a.shape}: {n / 1e9:.2f} B parameters written to {a.out} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
