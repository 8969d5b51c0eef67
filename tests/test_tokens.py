"""The probes' batch encodes use every core for the call (``backends.tokens.all_cores``) and give the same ids."""

from __future__ import annotations

import os
import random

import pytest

from evalparity.backends.tokens import SWITCH, all_cores


@pytest.mark.parametrize("before", [None, "false", "0"])
def test_the_switch_is_on_inside_and_as_it_was_after_even_on_an_error(before, monkeypatch):
    if before is None:
        monkeypatch.delenv(SWITCH, raising=False)
    else:
        monkeypatch.setenv(SWITCH, before)
    with pytest.raises(RuntimeError):
        with all_cores():
            assert os.environ[SWITCH] == "true"
            raise RuntimeError("inside")
    assert os.environ.get(SWITCH) == before


def test_threaded_batch_ids_equal_one_thread_and_one_prompt_at_a_time(tiny_model, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv(SWITCH, "false")  # as a cell's process starts
    tok = AutoTokenizer.from_pretrained(tiny_model)
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "é", "日本", "  ", "\n", "1234", "<s>", "what?"]
    texts = ["".join(rng.choice(words) + rng.choice(["", " "]) for _ in range(rng.randint(1, 60)))
             for _ in range(3000)]
    one_thread = tok(texts).input_ids
    with all_cores():
        threaded = tok(texts).input_ids
    assert threaded == one_thread == [tok(t).input_ids for t in texts]


@pytest.mark.parametrize("cls", ["HFProbe", "VLLMProbe"])
def test_the_probes_encode_on_all_cores_and_the_cells_batch_encode_does_not(cls, monkeypatch):
    """Only the probes' encode turns the switch on (a cell's scoring keeps the one thread its recorded
    environment says): the probe's call sees it on, the cell's own ``batch_encode`` sees it as it was."""
    from evalparity.backends import probes

    monkeypatch.setenv(SWITCH, "false")
    seen = []
    probe = object.__new__(getattr(probes, cls))  # no model: only the encode's wiring
    probe._batch_encode = lambda texts: seen.append(os.environ.get(SWITCH)) or [[1]] * len(texts)
    assert probe.encode(["a", "b"]) == [[1], [1]] and seen == ["true"]
    probe._batch_encode(["c"])
    assert seen == ["true", "false"] and os.environ[SWITCH] == "false"
