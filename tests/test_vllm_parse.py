"""The vLLM cell's scoring parse (``backends.vllm.continuation_only``) gives lm-eval's own answer.

lm-eval's ``VLLM._parse_logprobs`` turns every prompt position's logprobs into a dict and uses only the
continuation's; the cell hands it the context's positions blanked. Here both are run on generated outputs,
in vLLM's two containers (a list of dicts, and the flat one the cell asks for), with ties between the top
token and the continuation's token, continuations that are and are not greedy, and every context length
from 1 to the prompt's: the (sum, is_greedy) pairs must be the same, float for float.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def parsers():
    from evalparity.backends import compat, vllm

    compat.apply()
    import lm_eval.models.vllm_causallms as lm_vllm  # heavy: lm_eval, vllm (imported, nothing loaded)

    original = lm_vllm.VLLM._parse_logprobs
    return original, vllm.continuation_only(original)


def _outputs(rng: random.Random, tokens: list[int], flat: bool):
    """What vLLM returns for ``prompt_logprobs=1``: None at position 0, then per position the actual token's
    logprob and the top token's (the same entry when the token is the top one), ranks included."""
    from vllm.logprobs import FlatLogprobs, Logprob

    positions: list = [None]
    for tok in tokens[1:]:
        lp = -rng.choice([0.0, 0.5, rng.random() * 8, 1e-7])
        if rng.random() < 0.5:  # the token is the top one
            positions.append({tok: Logprob(lp, rank=1)})
        else:
            top = rng.randrange(50)
            top_lp = lp if rng.random() < 0.2 else lp + rng.random()  # a tie, now and then
            entry = {tok: Logprob(lp, rank=2)}
            if top != tok:
                entry[top] = Logprob(top_lp, rank=1)
            positions.append(entry)
    if flat:
        container = FlatLogprobs()
        container.extend(positions)
        return SimpleNamespace(prompt_logprobs=container, request_id="r")
    return SimpleNamespace(prompt_logprobs=positions, request_id="r")


@pytest.mark.parametrize("flat", [False, True])
def test_the_continuation_only_parse_is_lm_evals_answer(parsers, flat):
    original, ours = parsers
    rng = random.Random(11 + flat)
    seen = set()
    for _ in range(300):
        n = rng.randrange(2, 40)
        tokens = [rng.randrange(50) for _ in range(n)]
        out = _outputs(rng, tokens, flat)
        for ctxlen in range(1, n):
            want = original(tokens=tokens, outputs=out, ctxlen=ctxlen)
            got = ours(tokens=tokens, outputs=out, ctxlen=ctxlen)
            assert got == want and type(got[0]) is type(want[0]), (tokens, ctxlen)
            seen.add(want[1])
    assert seen == {True, False}  # both kinds of continuation were generated


def test_the_outputs_are_left_as_they_were(parsers):
    _, ours = parsers
    rng = random.Random(3)
    tokens = [rng.randrange(50) for _ in range(12)]
    out = _outputs(rng, tokens, flat=True)
    before = list(out.prompt_logprobs)
    ours(tokens=tokens, outputs=out, ctxlen=5)
    assert list(out.prompt_logprobs) == before
