"""Drift localisation on the tiny model: fp32 at round-off at every layer, bf16 larger; mismatched
tokenisations reported, not compared."""

from __future__ import annotations

import json

import ahead
import pytest
import torch
from conftest import cli, evalparity, evalparity_here, one_line_error
from synthetic import make_run

from evalparity import rundir
from evalparity.backends.probes import Probe
from evalparity.drift.measure import DriftAccumulator
from evalparity.drift.worker import probe_prompts

PROMPTS = ["the cat sat on the mat and ran far away to the big red house",
           "one two three four five six seven eight nine ten is the answer",
           "what is the question and which answer is true or false"]


@ahead.job("drift_dir")
def _drift_run(ctx: ahead.Context):
    root = ctx.mktemp("drift")
    (root / "prompts.txt").write_text("\n".join(PROMPTS))
    out = root / "out"
    args = cli("drift", "--model", str(ctx.fixture("tiny_model")), "--prompts", str(root / "prompts.txt"),
               "--cells", "vllm-fp32,vllm-bf16", "--gen-tokens", "8", "--max-length", "256", "--device", "cpu",
               "--out", str(out))
    return lambda: (out, ctx.run(args))


@pytest.fixture(scope="module")
def drift_dir(request):
    """vllm-fp32 and vllm-bf16 against hf-fp32 on three prompts (started ahead: tests/ahead.py)."""
    out, proc = ahead.take("drift_dir", request)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_fp32_layers_at_roundoff_and_bf16_larger(drift_dir):
    fp32 = json.loads((drift_dir / "vllm-fp32.json").read_text())
    bf16 = json.loads((drift_dir / "vllm-bf16.json").read_text())
    assert fp32["n_prompts"] == 3 and len(fp32["layers"]) == 3  # embeddings, 1 inner layer, final norm
    for layer in fp32["layers"]:
        assert layer["rel_error"] < 1e-5, layer  # fp32 round-off
        assert layer["cosine"] > 1 - 1e-9
    assert fp32["first_layer_over_threshold"] is None
    assert fp32["prompt_logprobs"]["abs_max"] < 1e-3
    for a, b in zip(fp32["layers"], bf16["layers"]):
        assert b["rel_error"] > 100 * max(a["rel_error"], 1e-9)
    assert bf16["first_layer_over_threshold"] is not None
    assert fp32["generations"]["identical"] == 1.0


class FakeTokenizer:
    def __init__(self, shift: int):
        self.shift = shift

    def __call__(self, text):
        return {"input_ids": [len(w) + (self.shift if i == 2 else 0) for i, w in enumerate(text.split())]}

    def decode(self, ids):
        return " ".join(map(str, ids))


class FakeProbe:
    def __init__(self, shift: int, noise: float):
        self.tokenizer = FakeTokenizer(shift)
        self.noise = noise

    def run(self, ids):
        g = torch.Generator().manual_seed(len(ids))
        hidden = [torch.randn(len(ids), 4, generator=g) + self.noise for _ in range(3)]
        return Probe(hidden, torch.zeros(len(ids) - 1) + self.noise)

    def generate(self, ids, n):
        return list(range(n))


def test_mismatched_tokenization_is_reported_not_compared(tmp_path):
    ref, other = FakeProbe(0, 0.0), FakeProbe(0, 0.01)
    odd = FakeProbe(1, 0.0)  # splits the third word differently
    acc = probe_prompts(ref, other, ["a bb ccc dddd", "e ff ggg"], 64, 4, dump=tmp_path)
    assert acc.n_prompts == 2 and not acc.tokenization_mismatches
    import numpy as np

    saved = np.load(tmp_path / "0.npz")
    assert saved["reference"].shape == (3, 4, 4) and saved["cell"].shape == (3, 4, 4)
    acc = probe_prompts(ref, odd, ["a bb ccc dddd", "e ff"], 64, 4)
    assert acc.n_prompts == 1
    assert acc.tokenization_mismatches == [{"prompt": 0, "first_difference": 2, "reference_len": 4,
                                            "cell_len": 4, "text": "a bb ccc dddd"}]
    assert isinstance(acc, DriftAccumulator)


# ---------------------------------------------------------------- what drift owns (issue 25, items 3 and 5)
def _snapshot(root):
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_drift_refuses_a_folder_that_names_no_model(tmp_path):
    """A compare folder holds lm-eval outputs of some model it does not name: drift probed the embedded
    SmolLM2 instead and added it to that folder's report."""
    cmp_dir = tmp_path / "cmp"
    (cmp_dir / "cells").mkdir(parents=True)
    (cmp_dir / "compare.json").write_text(json.dumps({"schema": "evalparity.compare/1", "inputs": [], "names": []}))
    before = _snapshot(cmp_dir)
    for extra in ([], ["--model", str(tmp_path / "some-model")]):
        line = one_line_error(evalparity_here("drift", "--run-dir", str(cmp_dir), *extra, "--device", "cpu"))
        assert "comparison of lm-eval outputs" in line and "pass --model and --prompts" in line, line
    line = one_line_error(evalparity_here("drift", "--run-dir", str(tmp_path), "--device", "cpu"))
    assert "no spec.json" in line and "pass --model and --prompts" in line, line
    assert _snapshot(cmp_dir) == before


def test_drift_takes_the_run_lock(tmp_path):
    run = make_run(tmp_path / "run", n_tasks=1, cells=["hf-fp32", "hf-bf16"], docs_per_task=4)
    with rundir.acquire(run, create=False):  # a live holder: this test's own process
        before = _snapshot(run)
        proc = evalparity("drift", "--run-dir", str(run), "--cells", "hf-bf16", "--device", "cpu", timeout=120)
        line = one_line_error(proc)
        assert proc.returncode == 2 and "in use by another evalparity" in line, line
        assert _snapshot(run) == before


def test_drift_publishes_into_the_run_staged_and_leaves_it_alone_with_out(tiny_model, tmp_path):
    """With --out elsewhere the run is only read (its report was rewritten); without, drift/ and the report
    are swapped in together, with nothing of the staging left behind."""
    run = make_run(tmp_path / "run", n_tasks=1, cells=["hf-fp32", "hf-bf16"], docs_per_task=3)
    assert evalparity_here("report", str(run)).returncode in (0, 3, 4)
    before = _snapshot(run)
    args = ["--model", str(tiny_model), "--cells", "hf-bf16", "--n-prompts", "2", "--gen-tokens", "2",
            "--max-length", "128", "--device", "cpu"]
    proc = evalparity("drift", "--run-dir", str(run), "--out", str(tmp_path / "elsewhere"), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "elsewhere" / "hf-bf16.json").is_file()
    assert _snapshot(run) == before
    proc = evalparity("drift", "--run-dir", str(run), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "drift" / "hf-bf16.json").is_file() and (run / "drift" / "hf-bf16.log").is_file()
    assert "hf-bf16" in (run / "report" / "report.md").read_text().split("drift", 1)[-1]
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []  # no stage, trash or lock
