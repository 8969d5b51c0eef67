"""Batched pre-tokenisation (backends/pretokenize.py): the same token ids as lm-eval's own per-request path,
for both backends, on awkward strings and on real HellaSwag requests; and a memo that disagrees is dropped.

Each backend's LM runs in a child process (vLLM needs its environment before import), one per backend for
the three modes. The child feeds the same requests through ``loglikelihood`` with the scoring stubbed out (so
only tokenisation is compared) and through lm-eval's ``_encode_pair`` one request at a time.
"""

from __future__ import annotations

import json
import sys
import textwrap

import ahead
import pytest
from conftest import SHARED_DATA

from evalparity.backends import hf, vllm
from evalparity.backends.pretokenize import checked_keys, request_strings
from evalparity.cellenv import cell_environment
from evalparity.spec import RunSpec, build_cells

SCRIPT = textwrap.dedent("""
    import json, sys
    from evalparity.backends import hf, vllm

    backend, model, data, modes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
    if backend == "hf":
        lm = hf.create_lm({"pretrained": model, "device": "cpu", "dtype": "float32", "batch_size": 8})
    else:
        lm = vllm.create_lm({"pretrained": model, "dtype": "float32", "max_model_len": 256, "seed": 1234,
                             "enable_prefix_caching": False, "enforce_eager": True})
    pairs = json.loads(open(data).read())
    bos = lm.tokenizer.decode(lm.prefix_token_id)
    pairs += [[bos + "the cat sat", " on the mat"], ["trailing spaces   ", "one"], ["  ", "the cat"],
              ["\\n", "dog"], ["", "empty context"], ["the cat", ""], ["unicode é ü 你好", " 世界"]]

    class Req:
        def __init__(self, args):
            self.args = tuple(args)

    def fail(strings):
        raise ValueError("this tokenizer takes no batches")

    seen = {}
    def score(reqs, **kw):
        seen["reqs"] = reqs
        return [(0.0, True)] * len(reqs)
    lm._loglikelihood_tokens = score
    out = {}
    for mode in modes:  # one LM (one engine load), each mode's loglikelihood call from a clean state
        lm.__dict__.pop("batch_encode", None)  # the backend's own batch encoder
        lm.memo_used, seen["reqs"] = None, None
        if mode == "corrupt":  # a batch encoder that disagrees with tok_encode: the memo must not be used
            lm.batch_encode = lambda strings: [[1] for _ in strings]
        if mode == "raise":  # a batch encoder that fails: lm-eval's own path, not a failed cell
            lm.batch_encode = fail
        lm.loglikelihood([Req(p) for p in pairs], disable_tqdm=True)
        ours = [[c, x] for _, c, x in seen["reqs"]]
        theirs = []
        for c, x in pairs:
            if c:
                theirs.append(list(map(list, lm._encode_pair(c, x))))
            else:
                theirs.append(None)  # lm-eval's empty-context rule: not pre-tokenised, compared below
        out[mode] = {"ours": ours, "theirs": theirs, "memo_used": lm.memo_used, "memo_left": lm._memo}
    print(json.dumps(out))
""")
MODES = ("batched", "corrupt", "raise")


def _pairs(n_docs: int) -> list[list[str]]:
    """HellaSwag-shaped (context, continuation) pairs: the mirror's first docs when ../shared/data has them
    (real text, four choices sharing a context), else made-up ones."""
    path = SHARED_DATA / "Rowan" / "hellaswag"
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else []
    pairs: list[list[str]] = []
    if files:
        with open(files[0], encoding="utf-8") as f:
            for line in list(f)[:n_docs]:
                doc = json.loads(line)
                ctx = doc["activity_label"] + ": " + doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
                pairs += [[ctx, " " + e] for e in doc["endings"]]
    else:
        pairs = [[f"question {i} what is", f" answer {j}"] for i in range(n_docs) for j in range(4)]
    return pairs


@ahead.job("tokenised")
def _children(ctx: ahead.Context):
    """One child process per backend: one LM load (a vLLM engine is 15-20 s on 2 CPU cores) for the three
    modes, not one per mode (started ahead: tests/ahead.py)."""
    pairs = _pairs(60)
    data = ctx.mktemp("pretok") / "pairs.json"
    data.write_text(json.dumps(pairs))
    cmds = {}
    for backend, module in (("hf", hf), ("vllm", vllm)):
        spec = RunSpec(model="m", tasks=("t",), cells=build_cells([backend], ["fp32"], 8, []), device="cpu",
                       leaf_docs=(("t", 1),))
        env = cell_environment(module.environment(spec, spec.cells[0]), offline=True)
        cmd = [sys.executable, "-c", SCRIPT, backend, str(ctx.fixture("tiny_model")), str(data), ",".join(MODES)]
        cmds[backend] = (cmd, env)
    return lambda: (pairs, {b: ctx.run(cmd, env=env, timeout=600) for b, (cmd, env) in cmds.items()})


@pytest.fixture(scope="module")
def tokenised(request):
    """``tokenised(backend)``: the pairs, and the requests as each mode tokenised them. The modes run on one
    LM in turn, the clean LM first, each from the backend's own batch encoder with no memo left over from
    the one before (``memo_left``)."""
    pairs, procs = ahead.take("tokenised", request)

    def get(backend: str) -> tuple[list, dict]:
        proc = procs[backend]
        assert proc.returncode == 0, proc.stderr[-3000:]
        return pairs, json.loads(proc.stdout.strip().splitlines()[-1])
    return get


@pytest.mark.parametrize("backend", ["hf", "vllm"])
@pytest.mark.parametrize("mode", MODES)
def test_batched_tokenisation_matches_lm_eval(backend, mode, tokenised):
    pairs, by_mode = tokenised(backend)
    got = by_mode[mode]
    assert got["memo_used"] is (mode == "batched") and got["memo_left"] is None
    n = len(got["theirs"])
    assert len(got["ours"]) == n == len(pairs) + 7
    for i, (ours, theirs) in enumerate(zip(got["ours"], got["theirs"])):
        if theirs is not None:
            assert ours == theirs, f"request {i} tokenised differently: {ours} != {theirs}"
    empty = got["ours"][n - 3]  # ["", "empty context"]: lm-eval's prefix token as the context
    assert len(empty[0]) == 1 and empty[1]


def test_request_strings_follow_encode_pair():
    got = request_strings([("ctx  ", "a"), ("ctx  ", "b"), ("", "c"), ("x", " y")])
    # trailing spaces move to the continuation; the shared context appears once; empty contexts are skipped
    assert got == ["ctx  a", "ctx", "ctx  b", "x y", "x"]


def test_whitespace_contexts_are_left_to_lm_eval():
    # "  " strips to "": lm-eval's vLLM model encodes "" as [] without the tokenizer, so it is never memoised
    assert request_strings([("  ", "the cat"), ("\n", "dog")]) == ["  the cat", "\ndog"]


def test_the_check_covers_every_kind_of_string():
    memo = {f"<s>text {i}": [i] for i in range(5)} | {f"plain {i}" * (i + 1): [i] for i in range(200)} | {"x": [0]}
    keys = checked_keys(memo, "<s>")
    assert "<s>text 0" in keys and "<s>text 4" in keys  # both ends of the BOS group, encoded apart
    assert "x" in keys and max(memo, key=len) in keys  # the shortest and the longest
    assert len(keys) <= 32 + 6 and len(set(keys)) == len(keys)
