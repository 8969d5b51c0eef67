"""The backend registry and contract: unknown names are one line listing the known ones, every backend
implements ``Backend``, and a backend registered from one test file (``toy_backend.py``: ``hfcopy``) goes
through ``evalparity run``, ``report`` and ``drift`` with nothing in the package naming it."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import ahead
import pytest
from conftest import cli, evalparity, evalparity_here, one_line_error

from evalparity import backends, devices
from evalparity.backends import registry
from evalparity.backends.base import Backend
from evalparity.errors import EXIT_USAGE, EvalParityError

TESTS = Path(__file__).resolve().parent
# How a run finds a plugin backend: the module on PYTHONPATH, its name in EVALPARITY_PLUGINS.
PLUGIN_ENV = {registry.PLUGINS_ENV: "toy_backend",
              "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)}


def run_args(model: Path, tasks: Path, out: Path, *extra: str) -> list[str]:
    return ["run", "--model", str(model), "--tasks", "tiny_mc,tiny_gen", "--include-path", str(tasks),
            "--dtypes", "fp32", "--limit", "6", "--max-length", "512", "--device", "cpu", "--out", str(out), *extra]


@pytest.fixture
def toy(monkeypatch):
    """The toy backend registered in this process too, the way the CLI's processes register it; for this
    test only (the registry's state and the imported module are put back afterwards)."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv(registry.PLUGINS_ENV, "toy_backend")
    for attr in ("_TARGETS", "_resolved", "_plugins"):
        monkeypatch.setattr(registry, attr, copy.copy(getattr(registry, attr)))
    sys.modules.pop("toy_backend", None)
    yield backends.get("hfcopy")
    sys.modules.pop("toy_backend", None)


def test_every_backend_implements_the_contract(toy):
    assert backends.names() == ("hf", "vllm", "server", "hfcopy")
    for name in backends.names():
        b = backends.get(name)
        assert isinstance(b, Backend) and b.name == name and b.lm_eval_model
        assert isinstance(b.versions(), dict) and isinstance(b.snags(), list)
    assert backends.get("HF") is backends.get("hf")


def test_unknown_backend_lists_the_known_ones_in_one_line(tiny_model, tiny_tasks, tmp_path):
    out = tmp_path / "run"
    proc = evalparity(*run_args(tiny_model, tiny_tasks, out, "--backends", "hf,tgi"))
    assert one_line_error(proc) == "error: unknown backend 'tgi': use one of hf, vllm, server"
    assert proc.returncode == EXIT_USAGE and not out.exists()
    proc = evalparity(*run_args(tiny_model, tiny_tasks, out, "--backends", "hf,tgi"), env=PLUGIN_ENV)
    assert one_line_error(proc) == "error: unknown backend 'tgi': use one of hf, vllm, server, hfcopy"
    assert proc.returncode == EXIT_USAGE
    with pytest.raises(EvalParityError, match=r"^unknown backend 'tgi': use one of hf, vllm, server"):
        backends.get("tgi")


def test_a_plugin_that_cannot_be_imported_is_one_line(tiny_model, tiny_tasks, tmp_path):
    proc = evalparity(*run_args(tiny_model, tiny_tasks, tmp_path / "run", "--backends", "hf,vllm"),
                      env={registry.PLUGINS_ENV: "no_such_plugin_module"})
    line = one_line_error(proc)
    assert "cannot import 'no_such_plugin_module' from EVALPARITY_PLUGINS" in line and proc.returncode == EXIT_USAGE


def test_registration_is_checked(toy):
    with pytest.raises(EvalParityError, match="not usable"):
        registry.register("my-backend", toy)
    registry.register("half", object())
    with pytest.raises(EvalParityError, match=r"does not implement .*create_lm.*of evalparity.backends.base"):
        backends.get("half")
    registry.register("half", toy)
    with pytest.raises(EvalParityError, match="calls itself 'hfcopy'"):
        backends.get("half")


def test_the_backends_own_checks_are_asked(toy, monkeypatch):
    """Each backend's dtype limits (the toy has no float16; vLLM's CPU half precision needs AVX2)."""
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2"})
    with pytest.raises(EvalParityError, match="dtype float16 cannot run on cpu: the toy backend"):
        devices.check_dtypes("cpu", ["float32", "float16"], ["hf", "hfcopy"])
    devices.check_dtypes("cpu", ["float32", "float16"], ["hf", "vllm"])
    assert registry.plugin_environment() == {registry.PLUGINS_ENV: "toy_backend"}  # what Ray cells get


def test_import_of_the_cli_loads_no_backend():
    """The registry is lazy: importing the CLI imports the registry of names (spec checks them) and the
    contract it checks a backend against (``base``, typing only), but no backend module, let alone an engine."""
    heavy = ("evalparity.backends.", "torch", "vllm", "lm_eval", "pandas")
    code = f"import json, sys, evalparity.cli; print(json.dumps([m for m in sys.modules if m.startswith({heavy})]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert sorted(json.loads(out)) == ["evalparity.backends.base", "evalparity.backends.registry"]


@ahead.job("toy_run")
def _toy_run(ctx: ahead.Context):
    out = ctx.mktemp("toy") / "r"
    args = run_args(ctx.fixture("tiny_model"), ctx.fixture("tiny_tasks"), out, "--backends", "hf,hfcopy")
    return lambda: (out, ctx.run(cli(*args), env=PLUGIN_ENV))


@pytest.fixture(scope="module")
def toy_run(request):
    """hf and hfcopy at fp32 (about 60 s on 2 CPU cores; started ahead: tests/ahead.py)."""
    out, proc = ahead.take("toy_run", request)
    assert proc.returncode in (0, 4), proc.stderr[-3000:]  # the same numbers: never DIFFERENT
    return out


def test_toy_backend_runs_through_evalparity_run(toy_run):
    from evalparity.samples import read_table

    hf = json.loads((toy_run / "cells" / "hf-fp32" / "cell.json").read_text())
    toy = json.loads((toy_run / "cells" / "hfcopy-fp32" / "cell.json").read_text())
    assert toy["status"] == "ok" and toy["backend"] == "hfcopy", toy.get("error")
    assert toy["model_args"] == hf["model_args"]
    assert toy["settings"]["toy_backend"] == "hfcopy" and toy["settings"]["toy_lm_class"] == "RecordingHFLM"
    assert toy["versions"]["hfcopy"] == "test backend" and hf["versions"]["hfcopy"] == "test backend"
    assert toy["precision"]["attention_backend"] == hf["precision"]["attention_backend"]
    a = read_table(toy_run / "cells" / "hf-fp32" / "samples.parquet")
    b = read_table(toy_run / "cells" / "hfcopy-fp32" / "samples.parquet")
    assert len(a) == len(b) > 0
    assert a["loglikelihood"].fillna(0).tolist() == b["loglikelihood"].fillna(0).tolist()  # bit for bit
    v = json.loads((toy_run / "stats" / "verdicts.json").read_text())
    assert {r["cell"] for r in v["comparisons"]} == {"hfcopy-fp32"}
    assert all(r["verdict"] != "DIFFERENT" for r in v["comparisons"])


def test_toy_backend_in_report_and_drift(toy_run):
    # The report reads files only: no plugin needed, and the toy cell can be the reference.
    proc = evalparity_here("report", str(toy_run), "--reference", "hfcopy-fp32", "--no-fail-on-inconclusive")
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (toy_run / "report" / "report.md").read_text()
    assert "hfcopy-fp32" in md and "hfcopy test backend" in md  # its version, in the cells table
    # Drift: the toy backend's own probe, against HF's, in a worker process that registers it too.
    proc = evalparity("drift", "--run-dir", str(toy_run), "--cells", "hfcopy-fp32", "--reference", "hf-fp32",
                      "--n-prompts", "3", "--gen-tokens", "4", "--max-length", "256", "--device", "cpu",
                      env=PLUGIN_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads((toy_run / "drift" / "hfcopy-fp32.json").read_text())
    assert d["n_prompts"] == 3 and all(layer["rel_error"] == 0 for layer in d["layers"])
    assert d["generations"]["identical"] == 1.0
    proc = evalparity("drift", "--run-dir", str(toy_run), "--cells", "hfcopy-fp32", "--reference", "hf-fp32",
                      "--device", "cpu")  # without the plugin: the name is unknown
    assert one_line_error(proc) == "error: unknown backend 'hfcopy': use one of hf, vllm, server"
