"""Tokenise a cell's loglikelihood requests in one batched call instead of two calls per request.

Why: lm-eval's ``TemplateLM.loglikelihood`` encodes every request twice (context + continuation, then the
context alone, ``_encode_pair``), one string per tokenizer call. On full HellaSwag that is 80,336 calls, each
paying the tokenizer's Python overhead (and, in lm-eval's HF and vLLM models, a ``decode`` of the BOS token):
27.6 s of a cell's CPU time on this project's 2-core CI machine, against 15.5 s for one batched call over
the 50,164 distinct strings (HellaSwag's four choices share a context), which the Rust tokenizer also spreads
over the host's cores.

``BatchedEncoding`` is a mixin for an lm-eval LM class (placed before it in the bases). Its
``loglikelihood`` computes the strings ``_encode_pair`` will ask for, encodes them in one batch with the
backend's own ``batch_encode``, and answers ``tok_encode`` from that memo while lm-eval's own
``loglikelihood`` runs; everything else (empty contexts, truncation, generation prompts) goes to lm-eval
unchanged. The token ids are the same: before the memo is used, a spread of its entries is checked against
lm-eval's own ``tok_encode``, and any difference drops the memo for the whole call (and says so in the
cell's log), so a future lm-eval or tokenizer that encodes differently costs speed, never results.
"""

from __future__ import annotations

import sys
import time

CHECKED = 32  # memo entries compared with lm-eval's own tok_encode before the memo is trusted


def shift_spaces(context: str, continuation: str) -> tuple[str, str]:
    """lm-eval's ``_encode_pair`` first step: the context's trailing whitespace moves to the continuation,
    so that word boundaries tokenise as they do in running text."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        return context[:-n_spaces], context[-n_spaces:] + continuation
    return context, continuation


def request_strings(pairs: list[tuple[str, str]]) -> list[str]:
    """The strings lm-eval's causal ``_encode_pair`` encodes for these (context, continuation) pairs, in
    order and without repeats: context + continuation and the context, after trailing spaces of the context
    move to the continuation. Empty contexts are lm-eval's own special case and are left out, and so is a
    context that is all whitespace: it becomes ``""``, which lm-eval's vLLM model encodes as ``[]`` without
    asking the tokenizer (a batched call would give ``[BOS]``)."""
    out: dict[str, None] = {}
    for context, continuation in pairs:
        if not context:
            continue
        context, continuation = shift_spaces(context, continuation)
        out[context + continuation] = None
        if context:
            out[context] = None
    return list(out)


def checked_keys(memo: dict[str, list[int]], bos: str | None) -> list[str]:
    """The memo entries compared with lm-eval before the memo is used: a spread of ``CHECKED``, plus the
    kinds a difference would hide in (the shortest and longest strings, and the first and last of those that
    start with the BOS text and of those that do not, which backends encode in separate calls)."""
    keys = list(memo)
    if not keys:
        return []
    picked = keys[::max(1, len(keys) // CHECKED)]
    picked += [min(keys, key=len), max(keys, key=len)]
    for group in ([k for k in keys if bos and k.startswith(bos)], [k for k in keys if not (bos and k.startswith(bos))]):
        picked += group[:1] + group[-1:]
    return list(dict.fromkeys(picked))


class BatchedEncoding:
    """Mixin: batched, checked pre-tokenisation of loglikelihood requests (see the module docstring).

    The LM class it is mixed into provides ``batch_encode(strings) -> list[list[int]]``, giving for each
    string exactly what its ``tok_encode(string)`` gives. ``tokenize_s`` accumulates the time spent here,
    for the cell's phase timings (``evalparity.phases``)."""

    _memo: dict[str, list[int]] | None = None
    tokenize_s: float = 0.0
    memo_used: bool | None = None  # None: never asked; False: lm-eval encoded each request itself

    def batch_encode(self, strings: list[str]) -> list[list[int]]:  # pragma: no cover - per backend
        raise NotImplementedError

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        if getattr(self, "backend", "causal") != "causal":  # seq2seq encodes the parts apart: lm-eval's own
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        t0 = time.perf_counter()
        strings = request_strings([tuple(r.args[:2]) for r in requests])
        if strings:
            self._memo = self._checked_memo(strings)
            self.memo_used = self._memo is not None
        self.tokenize_s += time.perf_counter() - t0
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        finally:
            self._memo = None

    def _checked_memo(self, strings: list[str]) -> dict[str, list[int]] | None:
        """The batched encodings, or None (lm-eval then encodes each request itself) when the batch call
        fails or any checked entry differs from lm-eval's own ``tok_encode``: speed is lost, never results."""
        try:
            memo = dict(zip(strings, self.batch_encode(strings), strict=True))
            bos = None
            if getattr(self, "prefix_token_id", None) is not None:
                bos = self.tokenizer.decode(self.prefix_token_id)
            for key in checked_keys(memo, bos):
                if list(super().tok_encode(key)) != list(memo[key]):
                    print(f"evalparity: batched tokenisation differs from lm-eval's on {key[:80]!r}; "
                          "lm-eval encodes each request itself", file=sys.stderr)
                    return None
            return memo
        except Exception as err:  # noqa: BLE001 - any failure here only means lm-eval's own path
            print(f"evalparity: batched tokenisation failed ({err!r}); lm-eval encodes each request itself",
                  file=sys.stderr)
            return None

    def tok_encode(self, string, *args, **kwargs):
        """From the memo only for what ``_encode_pair`` asks (one string, no other argument, or
        ``add_special_tokens=None``); anything else is lm-eval's own call, arguments passed on as given."""
        memo = self._memo
        plain = not args and kwargs.get("add_special_tokens") is None and set(kwargs) <= {"add_special_tokens"}
        if memo is not None and plain and isinstance(string, str):
            hit = memo.get(string)
            if hit is not None:
                return list(hit)
        return super().tok_encode(string, *args, **kwargs)
