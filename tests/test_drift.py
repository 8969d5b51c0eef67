"""Drift localisation on the tiny model: fp32 at round-off at every layer, bf16 larger; mismatched
tokenisations reported, not compared."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import evalparity

from evalparity.backends.probes import Probe
from evalparity.drift.measure import DriftAccumulator
from evalparity.drift.worker import probe_prompts

PROMPTS = ["the cat sat on the mat and ran far away to the big red house",
           "one two three four five six seven eight nine ten is the answer",
           "what is the question and which answer is true or false"]


@pytest.fixture(scope="module")
def drift_dir(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("drift")
    (root / "prompts.txt").write_text("\n".join(PROMPTS))
    out = root / "out"
    proc = evalparity("drift", "--model", str(tiny_model), "--prompts", str(root / "prompts.txt"),
                      "--cells", "vllm-fp32,vllm-bf16", "--gen-tokens", "8", "--max-length", "256",
                      "--device", "cpu", "--out", str(out))
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
