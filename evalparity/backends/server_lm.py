"""The LM a served cell scores with: lm-eval's ``local-completions`` (``TemplateAPI``), made strict and
aligned with the in-process vLLM cell (``backends/server.py`` builds it).

What lm-eval's API models do on their own, and what changes here:

- Loglikelihood is one echo request per batch (``logprobs=1, echo=True, max_tokens=1``). lm-eval reads the
  answer's ``top_logprobs``, keyed by token *text*: two tokens that decode alike (byte pieces) share a key,
  which can flip ``is_greedy``. vLLM also returns ``prompt_logprobs`` keyed by token *id*, the very container
  the in-process vLLM cell parses; where the answer has them they are read here the way lm-eval's ``vllm``
  model reads them (sum over the continuation; greedy when each continuation token is its position's top).
- Generation is the same completions endpoint; on a vLLM server each request asks ``return_token_ids``, so
  the generated token ids are the engine's own, as in-process cells keep them, and the detokenization of
  lm-eval's in-process ``vllm`` model (special tokens kept), so that the text is the same too. A server that
  returns no ids gets its text re-tokenized, and the record says so (``generated_ids``).
- Errors: lm-eval retries a failed request ``max_retries`` times (tenacity) and then raises; here that error
  becomes one ``ServerError`` line naming the server and what happened (refused, dropped, an HTTP status, the
  started server's own exit). lm-eval fills a generation the server answered with ``null`` with an empty
  string and goes on, and keeps whatever number of answers came back: both are errors here, so a cell
  is whole or failed, never partial.
- BOS: lm-eval's API models add no special tokens unless ``add_bos_token`` is set, where the in-process cells
  follow the tokenizer's default; the cell sets ``add_bos_token`` to that default unless the run set it
  (``--add-bos-token``), and text that already starts with BOS (a chat template) gets none added, as lm-eval's
  ``vllm`` model does.
"""

from __future__ import annotations

import asyncio
import contextlib

from evalparity.backends.server_process import Endpoint, Server, ServerError

TOKEN_IDS = "the server's own token ids (vLLM: return_token_ids)"
RETOKENIZED = "re-tokenized generated text (the server returned no token ids)"
BY_ID = "prompt_logprobs by token id (as the in-process vLLM cell reads them)"
BY_TEXT = "lm-eval's echo parser (token_logprobs and top_logprobs, keyed by token text)"
# What a vLLM server's generation requests add: the engine's token ids, and the detokenization lm-eval's
# in-process ``vllm`` model asks for (``VLLM.modify_gen_kwargs``: special tokens kept, no spaces between
# them), where vLLM's API defaults to dropping them: text (and so exact_match) would otherwise differ.
VLLM_GENERATION = {"return_token_ids": True, "skip_special_tokens": False, "spaces_between_special_tokens": False}


def served_lm_class():
    """The class, defined on first use: lm-eval (and its API dependencies) load only in a cell's process."""
    import aiohttp  # heavy: aiohttp (lm-eval's API models' client), requests, lm_eval
    import requests
    from lm_eval.api.registry import get_model
    from lm_eval.models.utils import has_bos_prefix

    network = (requests.exceptions.RequestException, aiohttp.ClientError, asyncio.TimeoutError, OSError)

    class ServedLM(get_model("local-completions")):
        """``local-completions`` with the changes in this module's docstring."""

        def __init__(self, *, server: Server | None, endpoint: Endpoint, vllm_extras: bool, **kw):
            super().__init__(**kw)
            self.server = server
            self.endpoint = endpoint
            self.vllm_extras = vllm_extras  # the server is vLLM: ask for token ids
            self.generated_ids: dict[str, list[int]] = {}
            self._by_prompt_ids: dict[tuple, list[int]] = {}
            self.ids_source: str | None = None
            self.ll_source: str | None = None

        # ---- what is sent
        def _create_payload(self, messages, generate=False, gen_kwargs=None, seed=1234, eos=None, **kw) -> dict:
            payload = super()._create_payload(messages, generate=generate, gen_kwargs=gen_kwargs, seed=seed, eos=eos,
                                              **kw)
            if generate and self.vllm_extras:
                payload = VLLM_GENERATION | payload  # a task's own generation settings win, as in-process
            return payload

        def tok_encode(self, string, left_truncate_len=None, add_special_tokens=False, **kw):
            """lm-eval's rule (special tokens when asked or ``add_bos_token``), except for text that already
            starts with BOS, which gets none (lm-eval's ``vllm`` and ``hf`` models do the same)."""
            single = isinstance(string, str)
            texts = [string] if single else list(string)
            specials = bool(add_special_tokens or self.add_bos_token)
            bos = self.tokenizer.bos_token
            out: list = [None] * len(texts)
            for flag in (True, False):
                idx = [i for i, t in enumerate(texts) if (specials and not has_bos_prefix(t, bos)) is flag]
                if idx:
                    ids = self.tokenizer([texts[i] for i in idx], add_special_tokens=flag,
                                         return_attention_mask=False).input_ids
                    for i, row in zip(idx, ids):
                        out[i] = row[-left_truncate_len:] if left_truncate_len else row
            return out[0] if single else out

        # ---- what comes back
        def parse_logprobs(self, outputs=None, tokens=None, ctxlens=None, **kw) -> list[tuple[float, bool]]:
            choices = self._choices(outputs, len(ctxlens or []), "scoring")
            if all(c.get("prompt_logprobs") for c in choices):
                self.ll_source = BY_ID
                return [_by_id(c["prompt_logprobs"], toks, n) for c, toks, n in zip(choices, tokens, ctxlens)]
            self.ll_source = BY_TEXT
            return super().parse_logprobs(outputs=outputs, tokens=tokens, ctxlens=ctxlens, **kw)

        def parse_generations(self, outputs=None, **kw) -> list[str]:
            texts = []
            for out in outputs if isinstance(outputs, list) else [outputs]:
                for c in self._choices(out, None, "generating"):
                    if c.get("text") is None:
                        raise ServerError(f"the server at {self.endpoint.root} answered a generation with no text "
                                          "(null): lm-eval would score it as an empty string")
                    if c.get("token_ids") is not None and c.get("prompt_token_ids") is not None:
                        self._by_prompt_ids[tuple(c["prompt_token_ids"])] = list(c["token_ids"])
                    texts.append(c["text"])
            return texts

        def _choices(self, outputs, expected: int | None, doing: str) -> list[dict]:
            """The answers' choices in request order; a ServerError for an answer that is not a completion or
            holds another number of choices than was asked."""
            got: list[dict] = []
            for out in outputs if isinstance(outputs, list) else [outputs]:
                if not isinstance(out, dict) or not isinstance(out.get("choices"), list):
                    raise ServerError(f"the server at {self.endpoint.root} answered {doing} with no completion "
                                      f"choices ({str(out)[:120]})")
                got += sorted(out["choices"], key=lambda c: c.get("index", 0))
            if expected is not None and len(got) != expected:
                raise ServerError(f"the server at {self.endpoint.root} answered {len(got)} of {expected} prompts "
                                  f"while {doing}")
            return got

        # ---- the request types: whole or failed
        def _loglikelihood_tokens(self, requests, **kw):
            with self._failures("scoring"):
                res = list(super()._loglikelihood_tokens(requests, **kw))
            self._whole(res, requests, "scoring")
            return res

        def generate_until(self, requests, disable_tqdm: bool = False):
            with self._failures("generating"):
                res = super().generate_until(requests, disable_tqdm)
            self._whole(res, requests, "generating")
            for req, text in zip(requests, res):
                self._keep_ids(req.args[0], text)
            return res

        def _keep_ids(self, context: str, text: str) -> None:
            """The generated ids of ``context``: the server's, matched on the prompt ids it was sent (their
            kept suffix when lm-eval left-truncated the prompt), else the text re-tokenized."""
            if not isinstance(context, str):
                return
            toks = tuple(self.tok_encode(context, add_special_tokens=self.add_bos_token))
            ids = self._by_prompt_ids.get(toks)
            if ids is None:
                ids = next((v for k, v in self._by_prompt_ids.items() if k and toks[-len(k):] == k), None)
            if ids is not None:
                self.ids_source = self.ids_source or TOKEN_IDS
            else:
                ids = self.tokenizer(text, add_special_tokens=False).input_ids
                self.ids_source = RETOKENIZED
            self.generated_ids[context] = list(ids)

        def _whole(self, res, requests, doing: str) -> None:
            if len(res) != len(requests):
                raise ServerError(f"{len(res)} answers for {len(requests)} requests while {doing} at "
                                  f"{self.endpoint.root}: refusing a partial table")

        @contextlib.contextmanager
        def _failures(self, doing: str):
            """A failed request (after lm-eval's retries) as one ServerError line."""
            try:
                yield
            except ServerError:
                raise
            except network as err:
                dead = self.server.died(doing) if self.server is not None else None
                raise (dead or ServerError(self._said(err, doing))) from err

        def _said(self, err: BaseException, doing: str) -> str:
            text = " ".join(str(err).split())[:200]
            where = f"the server at {self.endpoint.root}"
            n = self.max_retries
            tries = f"after {n} {'try' if n == 1 else 'tries'} (max_retries={n})"
            status = getattr(getattr(err, "response", None), "status_code", None) or getattr(err, "status", None)
            if status:
                return f"{where} answered HTTP {status} while {doing}, {tries}: {text} (its reply is in cell.log)"
            refused = ConnectionRefusedError
            if isinstance(err, refused) or isinstance(getattr(err, "os_error", None), refused) \
                    or "refused" in str(err).lower():  # requests nests it in its message; aiohttp keeps it
                return f"{where} refused the connection while {doing}, {tries}: is it running? ({text})"
            if isinstance(err, (asyncio.TimeoutError, requests.exceptions.Timeout)):
                return f"{where} did not answer within {self.timeout} s while {doing}, {tries} (raise timeout=)"
            return f"{where} dropped the connection while {doing}, {tries}: {type(err).__name__}: {text}"

    return ServedLM


def _by_id(prompt_logprobs: list, tokens: list[int], ctxlen: int) -> tuple[float, bool]:
    """(log-likelihood of the continuation, greedy) from vLLM's ``prompt_logprobs`` ({token id: {logprob,
    rank}} per prompt position), as lm-eval's ``vllm`` model computes them from the same container
    (``VLLM._parse_logprobs``): the continuation is ``tokens[ctxlen:]``; greedy when each of its tokens is the
    top entry of its position."""
    total, greedy = 0.0, True
    for token, entry in zip(tokens[ctxlen:], prompt_logprobs[ctxlen:]):
        probs = {int(k): float(v["logprob"] if isinstance(v, dict) else v) for k, v in (entry or {}).items()}
        if token not in probs:
            raise ServerError(f"the server's prompt_logprobs lack token {token} at its position: not an echo of the "
                              "prompt sent")
        total += probs[token]
        if greedy and max(probs, key=probs.get) != token:
            greedy = False
    return total, greedy
