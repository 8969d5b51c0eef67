"""A vLLM engine's kernel warm-up narrowed to the run's own sampling (``backends.vllm.narrow_kernel_warmup``).

vLLM's V2 model runner compiles its sampling kernels before the first request by running a dummy batch with
``SamplingParams.for_sampler_warmup()``. The cells replace those parameters with the run's own. Checked here:
the hook is the one the installed vLLM's V2 warm-up calls (else the narrowing would silently do nothing); every
sampling feature a cell's requests use is one the narrowed warm-up uses too (else its kernels would compile in
the first round instead); the narrowing happens before the engine is built, and the record says narrowed only
where the engine's warm-up asked for the narrowed parameters in this process (not on vLLM's V1 or CPU runner,
nor for workers in processes of their own); ``$EVALPARITY_KERNEL_WARMUP=vllm`` keeps vLLM's own. That the
numbers do not change is a GPU measurement (results/staged-h200, session 28): the CPU build runs the V1 runner.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest


@pytest.fixture
def sampling(monkeypatch):
    """vLLM's ``SamplingParams``, its warm-up hook put back after the test."""
    from evalparity.backends import compat

    compat.apply()
    from vllm import SamplingParams

    monkeypatch.setattr(SamplingParams, "for_sampler_warmup", SamplingParams.__dict__["for_sampler_warmup"])
    return SamplingParams


def features(p) -> set[str]:
    """The sampling features a request's parameters switch on, each of which has kernels of its own in vLLM's
    V2 sampler (skipped for a batch whose requests do not use it)."""
    on = {
        "temperature": p.temperature not in (0, 1),  # 0 is greedy, 1 leaves the logits as they are
        "prompt_logprobs": p.prompt_logprobs is not None,
        "logprobs": p.logprobs is not None,
        "penalties": (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) != (0, 0, 1),
        "top_k": p.top_k not in (0, -1, None),
        "top_p": p.top_p < 1,
        "min_p": p.min_p > 0,
        "logit_bias": bool(p.logit_bias),
        "bad_words": bool(p.bad_words) or bool(getattr(p, "_bad_words_token_ids", None)),
        "min_tokens": p.min_tokens > 0,
    }
    return {name for name, used in on.items() if used}


def cells_sampling():
    """The parameters a vLLM cell's requests carry: its scoring (``flat_scoring_params``, and lm-eval's own
    for a vLLM without flat logprobs) and lm-eval's greedy generations, as its ``generate_until`` makes them
    for a task's usual ``generation_kwargs``."""
    import lm_eval.models.vllm_causallms as lm_vllm  # heavy: lm_eval, vllm (imported, nothing loaded)
    from vllm import SamplingParams

    from evalparity.backends import vllm as vllm_backend

    made = [vllm_backend.flat_scoring_params(),
            SamplingParams(temperature=0, prompt_logprobs=1, max_tokens=1, detokenize=False)]
    for gen_kwargs in ({"until": ["\n\n"], "do_sample": False},
                       {"until": ["Question:", "</s>"], "do_sample": False, "temperature": 0.0},
                       {"max_gen_toks": 64}):
        kwargs, until, max_gen_toks = lm_vllm.VLLM.modify_gen_kwargs(dict(gen_kwargs), eos="</s>")
        made.append(SamplingParams(max_tokens=max_gen_toks, stop=until, **kwargs))
    return [p for p in made if p is not None]


def test_narrowed_warmup_uses_every_feature_the_cells_use_and_no_other(sampling):
    from evalparity.backends import vllm as vllm_backend

    full = features(sampling.for_sampler_warmup())
    assert vllm_backend.narrow_kernel_warmup() is None  # narrowed: what ran is said once the engine is built
    narrowed = features(sampling.for_sampler_warmup())
    used = set().union(*(features(p) for p in cells_sampling()))
    assert used <= narrowed, f"the cells use {sorted(used - narrowed)}, which the narrowed warm-up would not compile"
    assert narrowed <= used, f"the narrowed warm-up uses {sorted(narrowed - used)}, which no cell's request does"
    assert narrowed < full, (narrowed, full)  # it compiles less than vLLM's own: the point of it
    assert sampling.for_sampler_warmup().temperature == 0  # greedy, as the cells sample


@pytest.mark.parametrize("seed", range(3))
def test_any_greedy_generation_lm_eval_makes_needs_nothing_the_narrowed_warmup_lacks(sampling, seed):
    """Generated: lm-eval's ``generate_until`` parameters for random greedy ``generation_kwargs`` (stop
    strings, token caps, do_sample false or temperature 0, top-p/top-k beside them, special tokens kept or not)
    switch on no sampling feature the narrowed warm-up does not: their kernels all compile before round 1."""
    import random

    import lm_eval.models.vllm_causallms as lm_vllm  # heavy: lm_eval, vllm (imported, nothing loaded)

    from evalparity.backends import vllm as vllm_backend

    vllm_backend.narrow_kernel_warmup()
    narrowed = features(sampling.for_sampler_warmup())
    rng = random.Random(seed)
    for _ in range(200):
        kw = {"until": rng.sample(["\n", "\n\n", "Question:", "</s>", ".", "Q:"], rng.randint(0, 3))}
        if rng.random() < 0.5:
            kw["max_gen_toks"] = rng.randint(1, 512)
        kw |= rng.choice([{"do_sample": False}, {"temperature": 0.0}, {"do_sample": False, "temperature": 0}, {},
                         {"do_sample": False, "top_p": 0.9, "top_k": 40}])  # greedy: vLLM drops top-p/k
        if rng.random() < 0.3:
            kw["skip_special_tokens"] = rng.random() < 0.5
        kwargs, until, max_gen_toks = lm_vllm.VLLM.modify_gen_kwargs(dict(kw), eos="</s>")
        used = features(sampling(max_tokens=max_gen_toks, stop=until, **kwargs))
        assert used <= narrowed, (kw, sorted(used - narrowed))


class _Engine:
    """Stands for lm-eval's VLLM model: building it builds the engine, whose V2 warm-up (when ``warms_here``)
    asks ``SamplingParams.for_sampler_warmup()`` in this process, as vLLM's ``warmup_kernels`` does."""

    warms_here = True
    seen: list = []

    def __init__(self, **kw):
        from vllm import SamplingParams

        if self.warms_here:
            type(self).seen.append(SamplingParams.for_sampler_warmup())

    def _parse_logprobs(self, tokens, outputs, ctxlen):  # pragma: no cover - not called here
        raise AssertionError


@pytest.mark.parametrize("warms_here", [True, False])
def test_create_lm_narrows_before_the_engine_and_records_what_ran(sampling, monkeypatch, warms_here):
    """The engine's warm-up, run while ``create_lm`` builds it, gets the narrowed parameters; the cell records
    narrowed only where that warm-up ran in this process, else says it did not (the V1 or CPU runner, or
    workers of their own)."""
    import lm_eval.api.registry as registry  # heavy: lm_eval

    from evalparity.backends import vllm as vllm_backend

    own = sampling.__dict__["for_sampler_warmup"]
    engine = type("Engine", (_Engine,), {"warms_here": warms_here, "seen": []})
    monkeypatch.setattr(registry, "get_model", lambda name: engine)
    lm = vllm_backend.create_lm({"pretrained": "unused"})
    if warms_here:
        assert [p.temperature for p in engine.seen] == [0.0] and engine.seen[0].prompt_logprobs == 1
        assert vllm_backend.loaded_settings(lm)["kernel_warmup"] == vllm_backend.WARMUP_NARROWED
    else:
        assert engine.seen == []
        assert vllm_backend.loaded_settings(lm)["kernel_warmup"] == vllm_backend.WARMUP_NOT_HERE
    # asked for vLLM's own: its warm-up gets vLLM's parameters, and the record says so
    monkeypatch.setattr(sampling, "for_sampler_warmup", own)
    monkeypatch.setenv("EVALPARITY_KERNEL_WARMUP", "vllm")
    engine.seen.clear()
    lm = vllm_backend.create_lm({"pretrained": "unused"})
    assert all(p.temperature != 0 for p in engine.seen)
    assert vllm_backend.loaded_settings(lm)["kernel_warmup"].startswith(vllm_backend.WARMUP_OWN)


def test_kernel_warmup_switch_keeps_vllms_own(sampling, monkeypatch):
    from evalparity.backends import vllm as vllm_backend

    own = sampling.__dict__["for_sampler_warmup"]
    monkeypatch.setenv("EVALPARITY_KERNEL_WARMUP", "vllm")
    said = vllm_backend.narrow_kernel_warmup()
    assert said.startswith(vllm_backend.WARMUP_OWN) and "EVALPARITY_KERNEL_WARMUP=vllm" in said
    assert sampling.__dict__["for_sampler_warmup"] is own
    assert vllm_backend.kernel_warmup_used(said, 0) == said


def test_a_vllm_without_the_hook_is_left_alone(sampling, monkeypatch):
    from evalparity.backends import vllm as vllm_backend

    monkeypatch.delattr(sampling, "for_sampler_warmup")
    assert "no for_sampler_warmup staticmethod to narrow" in vllm_backend.narrow_kernel_warmup()
    assert "for_sampler_warmup" not in sampling.__dict__


def test_the_hook_is_the_one_vllms_v2_warmup_calls():
    """The installed vLLM's V2 warm-up (``vllm/v1/worker/gpu/warmup.py``) takes its sampling parameters from
    ``SamplingParams.for_sampler_warmup()`` at call time, so replacing that staticmethod reaches it. A vLLM
    that moves the call elsewhere fails here, not silently on a GPU."""
    from evalparity.backends import compat

    compat.apply()
    spec = importlib.util.find_spec("vllm.v1.worker.gpu.warmup")
    if spec is None or spec.origin is None:
        pytest.skip("this vLLM has no V2 model runner warm-up")
    tree = ast.parse(Path(spec.origin).read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "for_sampler_warmup" and isinstance(n.func.value, ast.Name)
             and n.func.value.id == "SamplingParams"]
    assert calls, "vLLM's V2 warm-up no longer calls SamplingParams.for_sampler_warmup()"


def test_the_choice_reaches_every_cell_and_is_checked(monkeypatch):
    from evalparity import cellenv, config
    from evalparity.errors import EvalParityError

    assert cellenv.cell_environment({}, offline=True)[config.KERNEL_WARMUP_ENV] == "run"
    monkeypatch.setenv(config.KERNEL_WARMUP_ENV, " VLLM ")
    assert cellenv.cell_environment({}, offline=True)[config.KERNEL_WARMUP_ENV] == "vllm"
    monkeypatch.setenv(config.KERNEL_WARMUP_ENV, "none")
    with pytest.raises(EvalParityError, match="is not one of run, vllm"):
        config.check_environment()
