"""Per-layer hidden states and per-token prompt logprobs from each backend, as the same quantities.

- HF: ``output_hidden_states=True``. Entry 0 is the embedding output, entry i (1 <= i < L) the residual
  stream after decoder layer i-1, and entry L the *final norm's output* (transformers applies the norm to
  the last entry).
- vLLM: forward hooks, registered through ``LLM.apply_model`` (vLLM's supported way to reach the model;
  no private attribute chains), on the embedding, every decoder layer and the final norm. A vLLM decoder
  layer returns ``(hidden_states, residual)`` with the residual add deferred to the next layer's fused
  norm, so the residual stream after the layer is their sum; the last layer is compared through the final
  norm's output, like HF's last entry. Like with like.

Each backend builds its own probe (``Backend.drift_probe``): one of these, or one of its own with the same
``tokenizer``, ``run`` and ``generate``. That is why they live with the backends rather than in ``drift/``,
which only compares what they return: a backend that imported ``drift/`` would import a later stage of the
pipeline (docs/architecture.md, "Imports").

Prompts go through vLLM one at a time, so the hooks see exactly one sequence (chunked prefill may split
it into several calls, which are concatenated).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evalparity.backends import compat
from evalparity.errors import EvalParityError


@dataclass
class Probe:
    """What one backend computed for one prompt: hidden states [L+1, T, H] (float32) and the logprob of
    each prompt token given the ones before it [T-1] (float32)."""

    hidden: list[torch.Tensor]
    logprobs: torch.Tensor


def _decoder_parts(model: torch.nn.Module):
    """(embedding, decoder layers, final norm) of a decoder-only model, found by their conventional names
    (``model.embed_tokens`` / ``model.layers`` / ``model.norm``, as Llama, Mistral, Qwen2/3, Gemma, Phi-3 and
    most decoder-only models in both libraries name them)."""
    inner = getattr(model, "model", None)
    parts = [getattr(inner, n, None) for n in ("embed_tokens", "layers", "norm")] if inner is not None else []
    if len(parts) != 3 or any(p is None for p in parts):
        raise EvalParityError(f"drift probes do not support {type(model).__name__}: it has no "
                              "model.embed_tokens / model.layers / model.norm; use a Llama-style decoder-only model")
    return parts


class HFProbe:
    def __init__(self, path: str, dtype: torch.dtype, device: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: transformers (this probe only)

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        self.device = device
        _decoder_parts(self.model)

    @torch.no_grad()
    def run(self, ids: list[int]) -> Probe:
        x = torch.tensor([ids], device=self.device)
        out = self.model(input_ids=x, output_hidden_states=True)
        hidden = [h[0].float().cpu() for h in out.hidden_states]
        lp = torch.log_softmax(out.logits[0].float(), dim=-1)
        token_lp = lp[:-1].gather(1, x[0, 1:, None]).squeeze(1).cpu()
        return Probe(hidden, token_lp)

    @torch.no_grad()
    def generate(self, ids: list[int], n: int) -> list[int]:
        x = torch.tensor([ids], device=self.device)
        out = self.model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                                  do_sample=False, pad_token_id=self.tokenizer.eos_token_id)
        return out[0, len(ids):].tolist()


_CAPTURE: dict[str, list] = {"embed": [], "layers": {}, "norm": []}


class VLLMProbe:
    def __init__(self, path: str, dtype: str, max_len: int, device: str):
        compat.apply()
        from vllm import LLM  # optional: vllm (this probe only), after compat.apply

        kw = {"gpu_memory_utilization": 0.3} if device != "cpu" else {}
        self.llm = LLM(model=path, dtype=dtype, enforce_eager=True, enable_prefix_caching=False, seed=0,
                       max_model_len=max_len, **kw)
        self.tokenizer = self.llm.get_tokenizer()
        self.n_layers = self.llm.apply_model(_install_hooks)[0]

    def run(self, ids: list[int]) -> Probe:
        from vllm import SamplingParams  # optional: vllm (this probe only)

        _CAPTURE["embed"].clear()
        _CAPTURE["norm"].clear()
        _CAPTURE["layers"] = {}
        out = self.llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=0.0,
                                prompt_logprobs=0), use_tqdm=False)[0]
        emb = torch.cat(_CAPTURE["embed"])
        layers = [torch.cat(_CAPTURE["layers"][i]) for i in range(self.n_layers)]
        norm = torch.cat(_CAPTURE["norm"])
        if emb.shape[0] != len(ids):
            raise EvalParityError(f"vLLM's hooks saw {emb.shape[0]} tokens for a {len(ids)}-token prompt: "
                                  "the drift probe needs one prompt per forward pass")
        hidden = [emb, *layers[:-1], norm]
        lps = [d[t].logprob for t, d in zip(ids[1:], out.prompt_logprobs[1:])]
        return Probe(hidden, torch.tensor(lps, dtype=torch.float32))

    def generate(self, ids: list[int], n: int) -> list[int]:
        from vllm import SamplingParams  # optional: vllm (this probe only)

        o = self.llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=n, temperature=0.0),
                              use_tqdm=False)[0]
        return list(o.outputs[0].token_ids)


def _install_hooks(model: torch.nn.Module) -> int:
    """Runs inside vLLM's worker (in this process): hooks that copy each output to CPU float32."""
    embed, layers, norm = _decoder_parts(model)
    embed.register_forward_hook(lambda m, i, o: _CAPTURE["embed"].append(o.detach().float().cpu()))

    def layer_hook(idx):
        def hook(m, i, o):
            h, r = o
            _CAPTURE["layers"].setdefault(idx, []).append((h + r).detach().float().cpu())
        return hook

    for idx, layer in enumerate(layers):
        layer.register_forward_hook(layer_hook(idx))

    def norm_hook(m, i, o):
        _CAPTURE["norm"].append((o[0] if isinstance(o, tuple) else o).detach().float().cpu())

    norm.register_forward_hook(norm_hook)
    return len(layers)
