"""Per-layer hidden states and per-token prompt logprobs of many prompts at once, from each backend's own
engine, as the same quantities.

Entries (``n_entries`` = decoder layers + 1), alike in both backends:
- 0: the embedding output; i (1 <= i < L): the residual stream after decoder layer i-1; L: the *final norm's
  output* (transformers applies the norm to its last ``hidden_states`` entry).
- HF: ``output_hidden_states=True`` on a right-padded batch with its attention mask; the valid tokens of
  each row are taken back out.
- vLLM: forward hooks, registered through ``LLM.apply_model`` (vLLM's supported way to reach the model; no
  private attribute chains), on the model (its token ids and positions), the embedding, every
  decoder layer and the final norm. A vLLM decoder layer returns ``(hidden_states, residual)`` with the
  residual add deferred to the next layer's fused norm, so the residual stream after the layer is their
  sum; the last layer is compared through the final norm's output, like HF's last entry. Like with like.

Batching in vLLM: a ``generate`` call gets as many prompts as one scheduler step takes (its
``max_num_batched_tokens`` and ``max_num_seqs``), so that each prompt is one whole segment of the step's
flattened token batch. The hooks see that batch in the scheduler's order; it is split where a position is 0
and every segment must be positions 0..n-1 with the token ids of exactly one of the call's prompts. Anything
else (a prompt split over steps, padding, multi-dimensional positions) is refused, not guessed.

Each backend builds its probe from the lm-eval LM its cells use (``Backend.drift_probe(lm)``), so the probe
runs the model exactly as a cell loads it (its engine arguments, dtype, BOS rule). The probes live with the
backends rather than in ``drift/``, which only compares what they return (docs/architecture.md, "Imports").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from evalparity.backends import compat
from evalparity.backends.tokens import all_cores
from evalparity.errors import EvalParityError

POOLINGS = ("all", "last", "mean")
# The KV cache of one HF generation batch, at most about this much. Measured on one H200 (SmolLM2, 1,000
# HellaSwag prompts x 32 greedy tokens, scripts/gpu/hf_generate_probe.py): batches 4x the scoring batch's
# tokens took bf16 generation from 10.4 s to 2.3 s (fp32 3.0 to 2.0 s) at a 3.2 GiB (6.4 GiB) peak; each
# step's Python time, not its arithmetic, is the cost of a small model's generation.
GEN_KV_BYTES = 4 << 30
HIDDEN_BYTES = 2 << 30  # an HF probe's hidden states per batch, when it computes no logprobs
# The attention kernels an HF probe lets torch's SDPA choose from: its prebuilt ones, not cuDNN's. Why: on an
# H200, torch 2.11 sends a padded (masked) bf16/fp16 batch to cuDNN, which builds its kernels at run time, per
# batch shape, through CUDA's JIT compiler (kept per machine in ~/.nv/ComputeCache). Measured there
# (results/drift-h200, session 31): the first drift on a fresh machine, or one after that cache was emptied,
# spent its HF cells' probes 5.7-6.3 s against 2.1-4.0 s with the cache warm, and the cache then held 28 cuDNN
# SDPA kernels ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop..."); without cuDNN, from an empty cache,
# 1.45-1.86 s and nothing JIT-compiled. `evalparity hidden`'s HF forward on 10,000 prompts: 3.7 s without it,
# 9.5 s with it from an empty cache. The run's HF cells are left as torch chooses (a user's HF does the
# same); the probes pad where the cells' scoring did not, so their kernels were never quite the cells' own.
_ENABLED = {"FLASH_ATTENTION": torch.backends.cuda.flash_sdp_enabled,  # each kernel: is it on in this process?
            "EFFICIENT_ATTENTION": torch.backends.cuda.mem_efficient_sdp_enabled,
            "MATH": torch.backends.cuda.math_sdp_enabled}
SDPA_KERNELS = tuple(_ENABLED)


def sdpa_allowed() -> list[str]:
    """``SDPA_KERNELS`` less those this process has switched off (a user's ``enable_flash_sdp(False)`` stays
    off); MATH alone where that leaves none, so that attention always has a kernel."""
    return [k for k in SDPA_KERNELS if _ENABLED[k]()] or ["MATH"]


def prebuilt_attention():
    """A context in which torch's scaled-dot-product attention uses only ``sdpa_allowed()``'s kernels."""
    return sdpa_kernel([getattr(SDPBackend, name) for name in sdpa_allowed()])


@dataclass
class HiddenBatch:
    """What one backend computed for a list of prompts, in that list's order.

    ``hidden``: entry -> float32 on the probe's device; ``[sum(lengths), H]`` (pooling "all": every prompt's
    tokens one after another) or ``[n_prompts, H]`` ("last": each prompt's last token; "mean": the mean over
    its tokens). ``logprobs``: float32 on the CPU, ``[sum(lengths - 1)]``: each prompt token's logprob given
    the ones before it, prompt after prompt."""

    hidden: dict[int, torch.Tensor]
    lengths: list[int]
    logprobs: torch.Tensor
    pooling: str = "all"


def segments(lengths: list[int], device) -> torch.Tensor:
    """The prompt index of every token of prompts of these lengths laid one after another."""
    return torch.repeat_interleave(torch.arange(len(lengths), device=device),  # output_size: no wait for the GPU
                                   torch.as_tensor(lengths, device=device), output_size=sum(lengths))


def pool(h: torch.Tensor, lengths: list[int], how: str) -> torch.Tensor:
    """``[sum(lengths), H]`` -> the rows ``how`` asks for (module docstring of ``HiddenBatch``)."""
    if how == "all":
        return h
    ends = torch.cumsum(torch.as_tensor(lengths, device=h.device), 0)
    if how == "last":
        return h[ends - 1]
    out = torch.zeros(len(lengths), h.shape[1], dtype=torch.float64, device=h.device)
    out.index_add_(0, segments(lengths, h.device), h.double())
    return (out / torch.as_tensor(lengths, device=h.device, dtype=torch.float64)[:, None]).float()


def check_request(prompts: list[list[int]], entries: list[int], n_entries: int, pooling: str) -> None:
    if pooling not in POOLINGS:
        raise ValueError(f"pooling {pooling!r} is not one of {POOLINGS}")
    bad = [e for e in entries if not 0 <= e < n_entries]
    if bad:
        raise ValueError(f"entries {bad} are outside 0..{n_entries - 1}")
    if any(len(p) < 1 for p in prompts):
        raise ValueError("an empty prompt cannot be probed")


def _order_back(parts: list[torch.Tensor], done_order: list[int], lengths: list[int]) -> torch.Tensor:
    """Rows computed prompt by prompt in ``done_order`` (each prompt ``lengths[i]`` rows), concatenated,
    returned in the prompts' own order."""
    flat = torch.cat(parts)
    starts, at = [0] * len(lengths), 0
    for i in done_order:
        starts[i] = at
        at += lengths[i]
    index = torch.cat([torch.arange(starts[i], starts[i] + lengths[i]) for i in range(len(lengths))])
    return flat[index.to(flat.device)]


def _decoder_parts(model: torch.nn.Module):
    """(decoder model, embedding, decoder layers, final norm) of a decoder-only model, found by their
    conventional names (``model.embed_tokens`` / ``model.layers`` / ``model.norm``, as Llama, Mistral,
    Qwen2/3, Gemma, Phi-3 and most decoder-only models in both libraries name them)."""
    inner = getattr(model, "model", None)
    parts = [getattr(inner, n, None) for n in ("embed_tokens", "layers", "norm")] if inner is not None else []
    if len(parts) != 3 or any(p is None for p in parts):
        raise EvalParityError(f"drift probes do not support {type(model).__name__}: it has no "
                              "model.embed_tokens / model.layers / model.norm; use a Llama-style decoder-only model")
    return (inner, *parts)


def _eos_ids(model) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


def cut_at_eos(ids: list[int], eos: set[int]) -> list[int]:
    """Generated ids up to and including the first end-of-sequence id, as vLLM returns them: HF's batched
    ``generate`` pads a row that ended early."""
    for k, t in enumerate(ids):
        if t in eos:
            return ids[:k + 1]
    return ids


class _Encodes:
    """What both probes encode with: the cell's own batch encode (lm-eval's special-token rule, ``lm.batch_encode``,
    kept as ``_batch_encode``), on every core for the call (``tokens.all_cores``): the probe's encode forks
    nothing after it, where a cell's scoring keeps the one thread its recorded environment says."""

    _batch_encode: Callable[[list[str]], list[list[int]]]

    def encode(self, texts: list[str]) -> list[list[int]]:
        with all_cores():
            return self._batch_encode(texts)


class HFProbe(_Encodes):
    """Probes an lm-eval ``HFLM``'s model: padded batches of at most ``token_budget`` tokens (rows x longest)."""

    def __init__(self, lm, token_budget: int | None = None):
        self.model = lm.model
        self.tokenizer = lm.tokenizer
        self._batch_encode = lm.batch_encode
        self.device = torch.device(lm.device) if not isinstance(lm.device, torch.device) else lm.device
        _decoder_parts(self.model)
        self.n_entries = int(self.model.config.num_hidden_layers) + 1
        self.hidden_size = int(self.model.config.hidden_size)
        # for the records: the model's attention implementation and, for SDPA, the kernels it may choose from
        # (allowed, not necessarily used: torch picks among them per call, and a CPU has no flash kernel)
        impl = getattr(self.model.config, "_attn_implementation", None)
        self.attention = {"implementation": impl, "sdpa_allowed": sdpa_allowed() if impl == "sdpa" else None}
        vocab = int(self.model.config.vocab_size)
        # the fp32 logits of a batch dominate its memory: about 2 GiB of them at most
        self.token_budget = token_budget or max(256, min(16384, (2 << 30) // (4 * vocab)))
        # without the LM head (hidden states only) a batch's memory is its hidden states, every entry of every
        # token (``output_hidden_states``): about HIDDEN_BYTES of them, and never fewer tokens than a logprob
        # batch (which holds them and the logits). Measured on an H200 (SmolLM2 bf16, 10,000 prompts,
        # benchmarks/hf_probe_batches.py): a first pass 4.44 s against 6.34 s at the logprob budget, a repeat
        # 2.68 against 2.88 s: fewer batch shapes for the GPU to meet for the first time
        per_token = self.n_entries * self.hidden_size * self.model.dtype.itemsize
        # On a CPU the larger batches only pad more (its cost is the arithmetic): measured on 2 cores, 200
        # HellaSwag prompts in one padded batch took 35.1 s against 24.2 s at the logprob budget.
        gpu = self.device.type == "cuda"
        self.hidden_budget = token_budget or (max(self.token_budget, min(1 << 16, HIDDEN_BYTES // per_token))
                                              if gpu else self.token_budget)
        # generation keeps one position's logits a step (transformers' logits_to_keep), so its batches are
        # bounded by their KV cache instead: about GEN_KV_BYTES of it
        cfg = self.model.config
        heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.kv_bytes_per_token = (self.n_entries - 1) * 2 * heads * head_dim * self.model.dtype.itemsize

    def _batches(self, order: list[int], lengths: list[int], rows_at_most: int | None = None,
                 budget: int | None = None):
        batch: list[int] = []
        budget = budget or self.token_budget
        for i in order:
            width = max([lengths[j] for j in batch] + [lengths[i]])
            if batch and (width * (len(batch) + 1) > budget
                          or (rows_at_most and len(batch) >= rows_at_most)):
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch

    @torch.no_grad()
    def forward(self, prompts: list[list[int]], entries: list[int], pooling: str = "all",
                logprobs: bool = True) -> HiddenBatch:
        """``logprobs=False``: hidden states only, from the decoder model without its LM head (the
        vocabulary-wide logits are most of a small model's cost); ``HiddenBatch.logprobs`` is then empty."""
        check_request(prompts, entries, self.n_entries, pooling)
        lengths = [len(p) for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: lengths[i])  # similar lengths pad little
        run = self.model if logprobs else self.model.model  # the decoder's last entry is normed already
        hidden: dict[int, list[torch.Tensor]] = {e: [] for e in entries}
        lps: list[torch.Tensor] = []
        for batch in self._batches(order, lengths, budget=None if logprobs else self.hidden_budget):
            blens = [lengths[i] for i in batch]
            width = max(blens)
            x = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for r, i in enumerate(batch):
                x[r, :lengths[i]] = torch.as_tensor(prompts[i])
                mask[r, :lengths[i]] = 1
            # The rows to keep, as flat indices into [rows x width] made here on the host, in the order a
            # boolean mask of the valid positions takes them (row after row): indexing with a boolean mask
            # on the GPU waits for the device to count its rows, once per entry and batch.
            starts = [r * width for r in range(len(batch))]
            valid = torch.as_tensor([s + t for s, n in zip(starts, blens) for t in range(n)], dtype=torch.long)
            nxt = torch.as_tensor([s + t for s, n in zip(starts, blens) for t in range(n - 1)], dtype=torch.long)
            targets = torch.as_tensor([tok for i in batch for tok in prompts[i][1:]], dtype=torch.long)
            x, mask, valid = x.to(self.device), mask.to(self.device), valid.to(self.device)
            with prebuilt_attention():
                out = run(input_ids=x, attention_mask=mask, output_hidden_states=True)
            for e in entries:
                hidden[e].append(pool(out.hidden_states[e].flatten(0, 1).index_select(0, valid).float(), blens,
                                      pooling))
            if not logprobs:
                del out
                continue
            # logprob of token t+1 given tokens 0..t, at the valid positions t < length - 1; kept on the
            # device until the last batch (a copy to the host per batch waits for the device)
            logits = out.logits.flatten(0, 1).index_select(0, nxt.to(self.device)).float()
            targets = targets.to(self.device)
            lps.append(logits.gather(1, targets[:, None]).squeeze(1) - torch.logsumexp(logits, -1))
            del out, logits
        rows = lengths if pooling == "all" else [1] * len(prompts)
        lp = _order_back(lps, order, [n - 1 for n in lengths]).cpu() if logprobs else torch.zeros(0)
        return HiddenBatch({e: _order_back(hidden[e], order, rows) for e in entries}, lengths, lp, pooling)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, rows: int = 1024) -> list[list[int]]:
        """Greedy continuations of ``n`` tokens, in left-padded batches of similar lengths. Only the last
        position's logits are kept per step, so a batch may hold more tokens than a scoring batch: each step
        costs about the same Python time whatever its rows, and on a small model that time is the cost."""
        lengths = [len(p) for p in prompts]
        eos = _eos_ids(self.model)
        pad = min(eos) if eos else 0
        out: list[list[int]] = [[] for _ in prompts]
        order = sorted(range(len(prompts)), key=lambda i: lengths[i])
        for batch in self._batches(order, [m + n for m in lengths], rows_at_most=rows,
                                   budget=max(self.token_budget, GEN_KV_BYTES // self.kv_bytes_per_token)):
            width = max(lengths[i] for i in batch)
            x = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for r, i in enumerate(batch):
                x[r, width - lengths[i]:] = torch.as_tensor(prompts[i])
                mask[r, width - lengths[i]:] = 1
            with prebuilt_attention():
                gen = self.model.generate(input_ids=x.to(self.device), attention_mask=mask.to(self.device),
                                          max_new_tokens=n, do_sample=False, pad_token_id=pad)
            for r, i in enumerate(batch):
                out[i] = cut_at_eos(gen[r, width:].tolist(), eos)
        return out


# ---------------------------------------------------------------- vLLM: hooks on the flattened batch
_CAPTURE: dict = {"on": False, "entries": frozenset(), "last": False, "steps": [], "problem": None}


def _take(t: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    t = t.detach()
    return (t if rows is None else t[rows]).to(torch.float32, copy=True)


def _install_hooks(model: torch.nn.Module) -> int:
    """Runs inside vLLM's worker (this process: the in-process engine): hooks that keep the chosen entries
    of every forward pass while ``_CAPTURE['on']``, on the device, one record per scheduler step."""
    _, embed, layers, norm = _decoder_parts(model)
    n_layers = len(layers)

    def step_hook(m, args, kwargs):
        if not _CAPTURE["on"]:
            return
        ids = args[0] if len(args) > 0 else kwargs.get("input_ids")
        pos = args[1] if len(args) > 1 else kwargs.get("positions")
        if ids is None or pos is None or pos.dim() != 1 or ids.shape != pos.shape:
            _CAPTURE["problem"] = ("the model's forward pass did not get 1-D token ids and positions of one shape "
                                   f"({type(model).__name__}): drift probes need a Llama-style text decoder")
            return
        rows = None
        if _CAPTURE["last"]:  # each segment's last token: before the next position 0, and the step's last
            ends = torch.nonzero(pos == 0).flatten()[1:] - 1
            rows = torch.cat([ends, torch.tensor([pos.shape[0] - 1], device=pos.device)])
        _CAPTURE["steps"].append({"ids": ids.detach().clone(), "pos": pos.detach().clone(), "rows": rows, "h": {}})

    def keep(entry: int, out, of=lambda o: o) -> None:
        """Entry ``entry`` of this step: ``of(out)``, computed only when that entry is asked for."""
        if _CAPTURE["on"] and entry in _CAPTURE["entries"] and _CAPTURE["steps"]:
            step = _CAPTURE["steps"][-1]
            step["h"][entry] = _take(of(out), step["rows"])

    # on the top-level model: the decoder model's own __call__ is replaced by vLLM's compile decorator
    # (``support_torch_compile``), which skips hooks even in eager mode; the runner calls with keywords
    model.register_forward_pre_hook(step_hook, with_kwargs=True)
    embed.register_forward_hook(lambda m, i, o: keep(0, o))

    def layer_hook(idx):
        def hook(m, i, o):
            if idx + 1 < n_layers:  # the last layer's output is compared through the final norm (entry L)
                keep(idx + 1, o, lambda o: o[0] + o[1])  # the residual stream: output plus deferred residual
        return hook

    for idx, layer in enumerate(layers):
        layer.register_forward_hook(layer_hook(idx))
    norm.register_forward_hook(lambda m, i, o: keep(n_layers, o, lambda o: o[0] if isinstance(o, tuple) else o))
    return n_layers


def _model_device(model: torch.nn.Module) -> str:
    return str(next(model.parameters()).device)


def _step_limits(llm) -> tuple[int, int]:
    """(tokens, sequences) one scheduler step takes: a ``generate`` call within both is one step."""
    sched = llm.llm_engine.vllm_config.scheduler_config
    return int(sched.max_num_batched_tokens), int(sched.max_num_seqs)


def _prompt_logprobs(out, ids: list[int]) -> list[float]:
    """Each prompt token's own logprob (``prompt_logprobs=0``: one entry a position, after the first)."""
    return [d[t].logprob for t, d in zip(ids[1:], out.prompt_logprobs[1:])]


class VLLMProbe(_Encodes):
    """Probes an lm-eval ``VLLM``'s engine (``lm.model``, a ``vllm.LLM``; in-process, eager)."""

    def __init__(self, lm):
        compat.apply()
        self.llm = lm.model
        self.tokenizer = lm.tokenizer
        self._batch_encode = lm.batch_encode
        self.n_entries = self.llm.apply_model(_install_hooks)[0] + 1
        self.device = torch.device(self.llm.apply_model(_model_device)[0])
        self.step_tokens, self.step_seqs = _step_limits(self.llm)
        self.hidden_size = int(self.llm.llm_engine.model_config.get_hidden_size())

    def _groups(self, prompts: list[list[int]], lengths: list[int]):
        """Consecutive prompts that one scheduler step takes whole, no prompt twice in one call (the hooks
        tell a call's prompts apart by their token ids)."""
        group: list[int] = []
        held: set[tuple] = set()
        tokens = 0
        for i, n in enumerate(lengths):
            if n > self.step_tokens:
                raise EvalParityError(f"a {n}-token prompt is longer than one vLLM step ({self.step_tokens} tokens, "
                                      "max_num_batched_tokens): the probe needs whole prompts per step; raise "
                                      "max_num_batched_tokens in the cell's engine arguments or lower --max-length")
            key = tuple(prompts[i])
            if group and (tokens + n > self.step_tokens or len(group) >= self.step_seqs or key in held):
                yield group
                group, held, tokens = [], set(), 0
            group.append(i)
            held.add(key)
            tokens += n
        if group:
            yield group

    def forward(self, prompts: list[list[int]], entries: list[int], pooling: str = "all",
                logprobs: bool = True) -> HiddenBatch:
        """``logprobs=False``: hidden states only (no prompt logprobs asked of vLLM); ``HiddenBatch.logprobs``
        is then empty."""
        from vllm import SamplingParams, TokensPrompt  # optional: vllm (this probe only)

        check_request(prompts, entries, self.n_entries, pooling)
        lengths = [len(p) for p in prompts]
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0 if logprobs else None,
                                detokenize=False)
        parts: dict[int, list[torch.Tensor]] = {e: [] for e in entries}
        done: list[int] = []
        lps: list[float] = []
        _CAPTURE.update(entries=frozenset(entries), last=pooling == "last", problem=None)
        for group in self._groups(prompts, lengths):
            _CAPTURE["steps"] = []
            _CAPTURE["on"] = True
            try:
                outs = self.llm.generate([TokensPrompt(prompt_token_ids=prompts[i]) for i in group], params,
                                         use_tqdm=False)
            finally:
                _CAPTURE["on"] = False
            if logprobs:
                for i, o in zip(group, outs):
                    lps.extend(_prompt_logprobs(o, prompts[i]))
            order, kept = self._split(group, prompts)
            for e in entries:
                got = torch.cat([s["h"][e][:k[0] if pooling != "last" else k[1]]
                                 for s, k in zip(_CAPTURE["steps"], kept)])
                if pooling == "mean":
                    got = pool(got, [lengths[i] for i in order], "mean")
                parts[e].append(got)
            done.extend(order)
            _CAPTURE["steps"] = []
        rows = lengths if pooling == "all" else [1] * len(prompts)
        hidden = {e: _order_back(parts[e], done, rows) for e in entries}
        # lps were appended in prompt order within groups, and the groups in order: the prompts' own order
        return HiddenBatch(hidden, lengths, torch.tensor(lps, dtype=torch.float32), pooling)

    def _split(self, group: list[int], prompts: list[list[int]]) -> tuple[list[int], list[tuple[int, int]]]:
        """The group's prompts in the order the hooks saw them, each checked to be one whole segment, and per
        step the (tokens, segments) that are the call's prompts. Once every prompt of the call was seen,
        what a step still holds must be padding (positions 0, as CUDA-graph padding is) and is dropped."""
        if _CAPTURE["problem"]:
            raise EvalParityError(_CAPTURE["problem"])
        want = {tuple(prompts[i]): i for i in group}
        if len(want) != len(group):
            raise ValueError("a probe call holds the same prompt twice: deduplicate first")
        seen: list[int] = []
        kept: list[tuple[int, int]] = []
        for step in _CAPTURE["steps"]:
            pos, ids = step["pos"].cpu(), step["ids"].cpu().tolist()
            starts = torch.nonzero(pos == 0).flatten().tolist()
            if not starts or starts[0] != 0:
                raise EvalParityError("vLLM continued a prompt from an earlier step (chunked prefill): the probe "
                                      "needs whole prompts per step; raise max_num_batched_tokens")
            tokens = segs = 0
            for a, b in zip(starts, starts[1:] + [len(ids)]):
                if len(seen) == len(group) and not pos[a:].any():
                    break  # the rest of the step is padding
                i = want.get(tuple(ids[a:b]))
                if i is None or not torch.equal(pos[a:b], torch.arange(b - a)) or i in seen:
                    raise EvalParityError(f"vLLM's forward pass held a {b - a}-token segment that is not one whole "
                                          "prompt of this call (a split, padded or repeated prompt): the probe "
                                          "cannot tell its tokens apart and refuses to guess")
                seen.append(i)
                tokens, segs = b, segs + 1
            kept.append((tokens, segs))
            for e in _CAPTURE["entries"]:
                if e not in step["h"]:
                    raise EvalParityError(f"vLLM's forward pass skipped the hook of hidden-state entry {e}")
        if sorted(seen) != sorted(group):
            raise EvalParityError(f"vLLM's hooks saw {len(seen)} of the call's {len(group)} prompts: the probe "
                                  "needs every prompt's forward pass (is CUDA graph capture on? use enforce_eager)")
        return seen, kept

    def generate(self, prompts: list[list[int]], n: int) -> list[list[int]]:
        from vllm import SamplingParams, TokensPrompt  # optional: vllm (this probe only)

        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                 SamplingParams(max_tokens=n, temperature=0.0, detokenize=False), use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]
