"""vLLM scoring with flat prompt logprobs (backends/vllm.py): the same numbers as lm-eval's own path.

One vLLM engine on the tiny model scores the same requests twice in a child process: through lm-eval's own
``_model_generate`` (whose sampling parameters are captured) and through evalparity's flat-logprobs call.
"""

from __future__ import annotations

import json
import sys
import textwrap

import ahead
import pytest

from evalparity.backends import vllm as backend
from evalparity.cellenv import cell_environment
from evalparity.spec import RunSpec, build_cells

SCRIPT = textwrap.dedent("""
    import json, sys
    from evalparity.backends import vllm as backend

    lm = backend.create_lm({"pretrained": sys.argv[1], "dtype": "float32", "batch_size": "auto",
                            "max_model_len": 256, "seed": 1234, "enable_prefix_caching": False,
                            "enforce_eager": True})
    ours = lm.scoring_params
    reqs = [(("", ""), lm.tok_encode(c), lm.tok_encode(x))
            for c, x in [("the cat sat on", " the mat"), ("one two three", " four five"),
                         ("what is the answer", " yes"), ("big red house", " and a blue tree river")]]
    flat = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    seen = []
    generate = lm.model.generate
    def capture(*a, **kw):
        seen.append(kw["sampling_params"])
        return generate(*a, **kw)
    lm.model.generate = capture
    lm.scoring_params = None  # lm-eval's own path
    plain = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    theirs = seen[0][0] if isinstance(seen[0], list) else seen[0]
    fields = ("temperature", "prompt_logprobs", "max_tokens", "detokenize", "logprobs", "n", "seed")
    print(json.dumps({"flat": flat, "plain": plain, "flat_param": ours.flat_logprobs,
                      "ours": {f: getattr(ours, f) for f in fields},
                      "theirs": {f: getattr(theirs, f) for f in fields},
                      "theirs_flat": getattr(theirs, "flat_logprobs", None)}))
""")


@ahead.job("scored")
def _scoring_child(ctx: ahead.Context):
    spec = RunSpec(model="m", tasks=("t",), cells=build_cells(["vllm"], ["fp32"], 8, []), device="cpu",
                   leaf_docs=(("t", 1),))
    env = cell_environment(backend.environment(spec, spec.cells[0]), offline=True)
    cmd = [sys.executable, "-c", SCRIPT, str(ctx.fixture("tiny_model"))]
    return lambda: ctx.run(cmd, env=env, timeout=600)


@pytest.fixture(scope="module")
def scored(request):
    """The child's finished process (started ahead: tests/ahead.py)."""
    return ahead.take("scored", request)


def test_flat_scoring_matches_lm_evals_own_path(scored):
    proc = scored
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["flat_param"] is True and got["theirs_flat"] is False
    assert got["ours"] == got["theirs"]  # lm-eval's scoring parameters, bar the container
    assert got["flat"] == got["plain"]  # the same floats and greedy flags, bit for bit
    assert len(got["flat"]) == 4 and all(ll < 0 for ll, _ in got["flat"])


def test_gc_clock_counts_collections():
    import gc

    from evalparity.hostuse import cpu_usage, usage_since

    before = cpu_usage()
    junk = []
    for _ in range(3):
        junk.append([[i] for i in range(50_000)])
        gc.collect()
    used = usage_since(before)
    assert used["gc_full_passes"] >= 3 and 0 < used["gc_full_s"] <= used["gc_s"]
