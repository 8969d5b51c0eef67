"""HF scoring read back once per batch (backends/hf_scoring.py): the same answers as lm-eval's own
``HFLM._loglikelihood_tokens``, bit for bit, on requests that take every branch (multi-token continuations,
one-token continuations sharing a context, which lm-eval scores once, left truncation, fixed and automatic
batch sizes); lm-eval's own method wherever the guards say so; and the memory plan's token cap on lm-eval's
batch-size probe."""

from __future__ import annotations

import random

import pytest

from evalparity.backends import hf, hf_scoring


def requests(seed: int = 0, vocab: int = 300) -> list:
    """(strings, context ids, continuation ids) as lm-eval's ``_loglikelihood_tokens`` takes them."""
    rng = random.Random(seed)
    out = []
    for i in range(23):  # multi-token continuations of many lengths
        ctx = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 40))]
        cont = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 9))]
        out.append(((f"c{i}", f"x{i}"), ctx, cont))
    shared = [rng.randrange(3, vocab) for _ in range(12)]
    for j, tok in enumerate((5, 6, 7, 5)):  # one-token continuations of one context: lm-eval's cache hits
        out.append(((f"s{j}", str(tok)), shared, [tok]))
    long_ctx = [rng.randrange(3, vocab) for _ in range(90)]  # past max_length 64: truncated from the left
    out.append((("long", "x"), long_ctx, [9, 10, 11]))
    out.append(((None, None), [4], [rng.randrange(3, vocab) for _ in range(60)]))  # a rolling window's
    return out


def lms(model, batch_size):
    from lm_eval.models.huggingface import HFLM

    args = {"pretrained": str(model), "device": "cpu", "dtype": "float32", "batch_size": batch_size,
            "max_length": 64, "softmax_dtype": "float32"}
    return hf.create_lm(args), HFLM(**args)


@pytest.mark.parametrize("batch_size", [4, "auto"])
def test_same_answers_as_lm_eval_bit_for_bit(tiny_model, batch_size, monkeypatch):
    ours, theirs = lms(tiny_model, batch_size)
    calls = {"one_by_one": 0}
    one_by_one = hf_scoring.DeferredScoring._one_by_one

    def counted(self, items):
        calls["one_by_one"] += 1
        return one_by_one(self, items)

    monkeypatch.setattr(hf_scoring.DeferredScoring, "_one_by_one", counted)
    for seed in (0, 5):  # two calls, as lm-eval makes one per request type (and per rolling window batch)
        reqs = requests(seed)
        got = ours._loglikelihood_tokens(reqs, disable_tqdm=True)
        want = theirs._loglikelihood_tokens(reqs, disable_tqdm=True)
        assert len(got) == len(reqs)
        for r, g, w in zip(reqs, got, want, strict=True):
            assert g == w, f"request {r[0]}: {g} here, {w} from lm-eval"
        assert sum(w[0] for w in want) < 0
    assert ours.deferred_scoring is True
    assert calls["one_by_one"] == 1  # the LM's first batch is checked; everything else was read back per batch


def test_a_disagreeing_batch_falls_back_to_lm_eval(tiny_model, monkeypatch):
    ours, theirs = lms(tiny_model, 4)
    batched = hf_scoring.DeferredScoring._batch_answers

    def off_by_a_bit(self, items):
        out = batched(self, items)
        return [(out[0][0] + 1e-3, out[0][1])] + out[1:]

    monkeypatch.setattr(hf_scoring.DeferredScoring, "_batch_answers", off_by_a_bit)
    reqs = requests(1)
    assert ours._loglikelihood_tokens(reqs, disable_tqdm=True) == theirs._loglikelihood_tokens(reqs, disable_tqdm=True)
    assert ours.deferred_scoring.startswith("off: a request scored")
    seen = []  # a later call stays with lm-eval's method without checking again
    monkeypatch.setattr(hf_scoring.DeferredScoring, "_batch_answers", lambda self, items: seen.append(1))
    assert ours._loglikelihood_tokens(reqs, disable_tqdm=True) == theirs._loglikelihood_tokens(reqs, disable_tqdm=True)
    assert seen == [] and ours.deferred_scoring.startswith("off: a request scored")


def test_nan_scores_are_not_a_disagreement(tiny_model):
    """A model that overflows gives NaN both ways; that is no reason to leave the batched path."""
    import math

    import torch

    ours, theirs = lms(tiny_model, 4)
    for lm in (ours, theirs):
        call = lm._model_call

        def poisoned(inps, *a, _call=call, **kw):
            out = _call(inps, *a, **kw)
            out[..., 7] = float("nan")
            return out

        lm._model_call = poisoned
    reqs = requests(4)
    got = ours._loglikelihood_tokens(reqs, disable_tqdm=True)
    want = theirs._loglikelihood_tokens(reqs, disable_tqdm=True)
    assert all(math.isnan(g[0]) for g in got) and all(math.isnan(w[0]) for w in want)
    assert [g[1] for g in got] == [w[1] for w in want]
    assert ours.deferred_scoring is True
    assert torch.isnan(torch.tensor([g[0] for g in got])).all()


def test_another_lm_eval_gets_its_own_method(tiny_model, monkeypatch):
    ours, theirs = lms(tiny_model, 4)
    monkeypatch.setattr(hf_scoring, "UPSTREAM_SHA256", "0" * 64)
    hf_scoring.upstream_matches.cache_clear()
    try:
        reqs = requests(2)
        assert ours._loglikelihood_tokens(reqs, disable_tqdm=True) == \
            theirs._loglikelihood_tokens(reqs, disable_tqdm=True)
        assert "not the version" in ours.deferred_scoring
    finally:
        hf_scoring.upstream_matches.cache_clear()


def test_the_followed_method_is_the_installed_lm_evals():
    """Fails when lm-eval's pin moves: re-check ``_deferred`` against the new ``_loglikelihood_tokens``, then
    update ``UPSTREAM_SHA256`` (until then every cell uses lm-eval's own, slower loop, and says so)."""
    assert hf_scoring.upstream_matches()


def test_the_plan_caps_the_batch_probe_by_tokens(tiny_model):
    from evalparity.backends import hf as hf_backend

    lm = hf_backend.create_lm({"pretrained": str(tiny_model), "device": "cpu", "dtype": "float32",
                               "batch_size": "auto", "max_length": 64, "batch_tokens": 100})
    reqs = requests(3)
    lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    longest = max(min(len(c) + len(x) - 1, 64) for _, c, x in reqs)
    assert lm.batch_probes == [{"length": longest, "cap": 100 // longest, "found": 100 // longest}]
    assert lm.max_batch_size == hf_backend.LM_EVAL_MAX_BATCH  # lm-eval's ceiling is left as it was
    assert hf_backend.loaded_settings(lm) == {"batch_probes": lm.batch_probes, "deferred_scoring": True}
    # without the plan's cap, lm-eval's probe starts at its own ceiling
    free = hf_backend.create_lm({"pretrained": str(tiny_model), "device": "cpu", "dtype": "float32",
                                 "batch_size": "auto", "max_length": 64})
    free._loglikelihood_tokens(reqs[:5], disable_tqdm=True)
    assert free.batch_probes == [] and free.batch_sizes[0] == hf_backend.LM_EVAL_MAX_BATCH
    # A schedule of several probes (auto:N) sizes part-filled batches padded to an earlier, longer request:
    # its probes take the cap at full length
    sched = hf_backend.create_lm({"pretrained": str(tiny_model), "device": "cpu", "dtype": "float32",
                                  "batch_size": "auto:2", "max_length": 64, "batch_tokens": 640})
    sched._loglikelihood_tokens(reqs, disable_tqdm=True)
    assert sched.batch_probes and all(p == {"length": 64, "cap": 10, "found": 10} for p in sched.batch_probes)
