"""lm-eval's HF loglikelihood scoring with one GPU round trip per batch instead of four per request.

Why: ``HFLM._loglikelihood_tokens`` scores each request of a batch with its own small GPU operations and
reads each result back at once (a host-to-device copy of the input, another of the continuation's ids,
then ``float(...)`` and ``bool(...)``): full HellaSwag is 40,168 requests, so about 160,000 waits for the
GPU per cell. Alone on a GPU a wait is a few microseconds. When cells are packed on one GPU, their
processes time-share it (without CUDA MPS, kernels of different processes never run at once), and each
wait also waits for the other processes' time slices: on one H200 an HF cell's scoring took 206 s packed
six to a GPU against 39 s alone, while the vLLM cells beside it, which wait once per engine step, took 170 s
(results/h200-real-models).

``DeferredScoring`` is a mixin for lm-eval's ``HFLM`` (placed before it in the bases). For a causal model
its ``_loglikelihood_tokens`` is lm-eval 0.4.13's, step for step, with two changes that change no number:

- a batch's inputs are built on the CPU and copied to the GPU once (lm-eval copies each request's);
- each request's answer is computed by the same GPU operations on tensors of the same shapes (slice,
  argmax, compare, gather, sum), but kept on the GPU and read back once per batch.

So the answers are bit-identical: the same kernels reduce the same values. Two guards keep it so. The
method runs only where lm-eval's own is the version it was written from (the SHA-256 of its source, below;
``pyproject.toml`` pins lm-eval, and ``tests/test_hf_scoring.py`` fails when the pin moves without this
being re-checked). And the LM's first batch is also computed lm-eval's way, request by request (once per
LM, not per call: lm-eval's rolling loglikelihood calls this once per window batch); any difference sends
this call and every later one to lm-eval's own method, and the cell records why. Anything else (seq2seq
models) is lm-eval's own method.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import math

logger = logging.getLogger(__name__)

#: SHA-256 of ``inspect.getsource(HFLM._loglikelihood_tokens)`` in lm-eval 0.4.13, the method this one
#: follows. A different source means a different lm-eval, whose method may have changed: use it as it is.
UPSTREAM_SHA256 = "994529f70fd23192506699a9e98fb83e6a63182494cc3e5997520582a28dc4f5"


@functools.cache
def upstream_matches() -> bool:
    """Whether the installed lm-eval's ``HFLM._loglikelihood_tokens`` is the one followed here."""
    from lm_eval.models.huggingface import HFLM  # heavy: lm_eval, torch

    try:
        src = inspect.getsource(HFLM._loglikelihood_tokens)
    except (OSError, TypeError):  # no source shipped (a zipped or compiled install): cannot tell
        return False
    return hashlib.sha256(src.encode()).hexdigest() == UPSTREAM_SHA256


class DeferredScoring:
    """Mixin: lm-eval's causal loglikelihood scoring, read back once per batch (see the module docstring).

    ``deferred_scoring`` records what happened, for the cell's settings: None (never asked), True (every
    call scored this way), or a string saying why lm-eval's own method ran instead."""

    deferred_scoring: bool | str | None = None
    _checked = False  # whether a first batch was checked against lm-eval's way (once per LM)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
        if getattr(self, "backend", None) != "causal":
            return self._upstream(requests, disable_tqdm, override_bs, "not a causal model")
        if not upstream_matches():
            return self._upstream(requests, disable_tqdm, override_bs,
                                  "lm-eval's _loglikelihood_tokens is not the version this path follows")
        if isinstance(self.deferred_scoring, str):  # an earlier call fell back: stay with lm-eval's
            return self._upstream(requests, disable_tqdm, override_bs, self.deferred_scoring[len("off: "):])
        try:
            out = self._deferred(requests, disable_tqdm, override_bs)
        except _Mismatch as err:
            return self._upstream(requests, disable_tqdm, override_bs, str(err))
        if self.deferred_scoring is None:
            self.deferred_scoring = True
        return out

    def _upstream(self, requests, disable_tqdm, override_bs, why: str):
        if self.deferred_scoring != f"off: {why}":
            logger.warning("scoring through lm-eval's own HF loop: %s", why)
        self.deferred_scoring = f"off: {why}"
        return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm,  # type: ignore[misc]
                                             override_bs=override_bs)

    def _deferred(self, requests, disable_tqdm: bool, override_bs: int | None):
        """lm-eval 0.4.13's ``HFLM._loglikelihood_tokens``, causal branch, answers read back per batch."""
        import torch  # heavy: torch
        import torch.nn.functional as F  # noqa: N812 - lm-eval's own name for it
        from lm_eval.models.huggingface import Collator, eval_logger, pad_and_concat, tqdm  # heavy: lm_eval

        res: list[tuple[float, bool]] = []

        def _collate(req):
            toks = req[1] + req[2]
            return -len(toks), tuple(toks)

        def _lookup_one_token_cont(req):
            return req[-2] + req[-1][:-1]

        re_ord = Collator(requests, sort_fn=_collate, group_by="contexts" if self.logits_cache else None,
                          group_fn=_lookup_one_token_cont)
        n_reordered_requests = len(re_ord)
        batch_size = self.batch_size if self.batch_size != "auto" else \
            override_bs if override_bs is not None else 0
        batch_fn = self._batch_scheduler if self.batch_size == "auto" and n_reordered_requests > 0 \
            and not override_bs else None
        if batch_fn is not None:
            self.batch_sizes = {}  # lm-eval: detect again for this set of requests (its issue 1678)

        chunks = re_ord.get_batched(n=batch_size, batch_fn=batch_fn)
        pbar = tqdm(total=len(requests), disable=(disable_tqdm or (self.rank != 0)),
                    desc="Running loglikelihood requests")
        for chunk in chunks:
            inps, cont_toks_list, inplens = [], [], []
            padding_len_inp = None
            for _, context_enc, continuation_enc in chunk:
                assert len(context_enc) > 0
                assert len(continuation_enc) > 0
                assert len(continuation_enc) <= self.max_length
                total_length = len(context_enc) + len(continuation_enc)
                if total_length > self.max_length + 1:
                    eval_logger.warning(
                        f"Combined length of context ({len(context_enc)}) and continuation ({len(continuation_enc)}) "
                        f"exceeds model's maximum length ({self.max_length}). "
                        f"Truncating {total_length - self.max_length + 1} tokens from the left."
                    )
                # on the CPU: the batch goes to the GPU in one copy below
                inp = torch.tensor((context_enc + continuation_enc)[-(self.max_length + 1):][:-1], dtype=torch.long)
                (inplen,) = inp.shape
                padding_len_inp = max(padding_len_inp, inplen) if padding_len_inp is not None else inplen
                inps.append(inp)
                cont_toks_list.append(continuation_enc)
                inplens.append(inplen)
            assert padding_len_inp, "padding_len_inp should be set by now"
            batched_inps = pad_and_concat(padding_len_inp, inps, padding_side="right").to(self.device)
            multi_logits = F.log_softmax(self._model_call(batched_inps), dim=-1, dtype=self.softmax_dtype)

            # every request's (and one-token-cache hit's) continuation, sliced like lm-eval's
            items = []
            for (request_str, ctx_tokens, _), logits, inplen, cont_toks in zip(
                chunk, multi_logits, inplens, cont_toks_list, strict=True
            ):
                contlen = len(cont_toks)
                ctx_len = inplen + (logits.shape[0] - padding_len_inp)
                logits = self._select_cont_toks(logits, contlen=contlen, inplen=ctx_len).unsqueeze(0)
                greedy_tokens = logits.argmax(dim=-1)
                for req_str, toks, lg in re_ord.get_cache(req_str=request_str, cxt_toks=ctx_tokens,
                                                          cont_toks=cont_toks, logits=logits):
                    items.append((req_str, toks, lg, greedy_tokens))
            answers = self._batch_answers(items)
            if not self._checked:  # the LM's first batch also lm-eval's way: one request at a time
                want = self._one_by_one(items)
                bad = [i for i, (a, b) in enumerate(zip(answers, want, strict=True)) if not _same(a, b)]
                if bad:
                    pbar.close()
                    raise _Mismatch(f"a request scored {answers[bad[0]]} batched but {want[bad[0]]} one at a time")
                self._checked = True
            for (req_str, _, _, _), answer in zip(items, answers, strict=True):
                res.append(answer)
                if req_str is not None:
                    self.cache_hook.add_partial("loglikelihood", req_str, answer)
                pbar.update(1)
        pbar.close()
        return re_ord.get_original(res)

    def _batch_answers(self, items: list) -> list[tuple[float, bool]]:
        """(loglikelihood, is greedy) of each (request, continuation ids, logits, greedy ids): lm-eval's
        operations on tensors of lm-eval's shapes, the continuations copied to the GPU in one tensor and the
        answers read back in one transfer each."""
        import torch  # heavy: torch

        flat = torch.tensor([t for _, toks, _, _ in items for t in toks], dtype=torch.long).to(self.device)
        sums, equal = [], []
        offset = 0
        for _, toks, logits, greedy_tokens in items:
            cont = flat[offset:offset + len(toks)].unsqueeze(0)  # [1, seq], as lm-eval's own tensor
            offset += len(toks)
            equal.append((greedy_tokens[:, -cont.shape[1]:] == cont).all())
            sums.append(torch.gather(logits, 2, cont.unsqueeze(-1)).squeeze(-1).sum())
        return list(zip(torch.stack(sums).tolist(), torch.stack(equal).tolist(), strict=True))

    def _one_by_one(self, items: list) -> list[tuple[float, bool]]:
        """The same answers exactly as lm-eval computes them: one request at a time, read back at once."""
        import torch  # heavy: torch

        out = []
        for _, toks, logits, greedy_tokens in items:
            cont = torch.tensor(toks, dtype=torch.long, device=self.device).unsqueeze(0)
            max_equal = (greedy_tokens[:, -cont.shape[1]:] == cont).all()
            out.append((float(torch.gather(logits, 2, cont.unsqueeze(-1)).squeeze(-1).sum()), bool(max_equal)))
        return out


def _same(a: tuple[float, bool], b: tuple[float, bool]) -> bool:
    """Equal answers, a NaN equal to a NaN (a model that overflows gives NaN either way)."""
    return a[1] == b[1] and (a[0] == b[0] or (math.isnan(a[0]) and math.isnan(b[0])))


class _Mismatch(Exception):
    """The batched answers differ from lm-eval's for the same request: use lm-eval's method."""
