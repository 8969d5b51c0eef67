"""Bad input: one line, a non-zero exit, no traceback, and nothing half-written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import evalparity, one_line_error


def run_args(model: Path, tasks: Path, out: Path, *extra: str) -> list[str]:
    return ["run", "--model", str(model), "--tasks", "tiny_mc", "--include-path", str(tasks), "--out", str(out),
            "--backends", "hf", "--dtypes", "fp32", "--limit", "2", "--single-cell", *extra]


@pytest.mark.parametrize("extra,needle", [
    (["--backends", "hf,tgi"], "unknown backend 'tgi'"),
    (["--dtypes", "fp32,int8"], "unknown dtype 'int8'"),
    (["--limit", "0"], "--limit 0 would evaluate no documents"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--repeat", "hf:fp32"], "bad --repeat"),
    (["--repeat", "hf:fp16:4"], "a repeat of hf-fp16, which is not a cell of this run"),
    (["--alpha", "2"], "--alpha 2.0 is not a test level"),
    (["--margin", "1"], "too large for a proportion"),
    (["--margin", "5"], "too large for a proportion"),
    (["--margin", "1.5"], "1pp, 1% or 0.01"),
    (["--margin", "acc=x"], "not a margin"),
    (["--direction", "up"], "--direction 'up' is unknown"),
    (["--shards", "0"], "--shards 0 must be at least 1"),
    (["--tensor-parallel", "2"], "--tensor-parallel needs GPUs"),
    (["--mps", "sometimes"], "--mps 'sometimes' is not one of auto, on, off"),
    (["--mps", "on"], "--mps on: the cells run on the CPU: run with --mps auto or off"),
])
def test_bad_options_fail_before_anything_runs(tiny_model, tiny_tasks, tmp_path, extra, needle):
    out = tmp_path / "run"
    line = one_line_error(evalparity(*run_args(tiny_model, tiny_tasks, out), *extra))
    assert needle in line
    assert not out.exists()


def test_unknown_task_names_a_close_match(tiny_model, tiny_tasks, tmp_path):
    args = run_args(tiny_model, tiny_tasks, tmp_path / "run")
    args[args.index("tiny_mc")] = "tiny_mcc"
    line = one_line_error(evalparity(*args))
    assert "unknown task 'tiny_mcc'" in line and "did you mean 'tiny_mc'" in line
    assert not (tmp_path / "run").exists()


def test_missing_model_path(tiny_tasks, tmp_path):
    proc = evalparity(*run_args(tmp_path / "nope", tiny_tasks, tmp_path / "run"))
    line = one_line_error(proc)
    assert "model path" in line and "does not exist" in line
    assert "checking" not in proc.stderr  # before the tasks' data is read (seconds on a first run)


def test_empty_task(tiny_model, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "empty_task.yaml").write_text(
        "task: empty_task\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path / 'empty.jsonl'}\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: '{{q}}'\ndoc_to_choice: '{{c}}'\ndoc_to_target: 0\nmetric_list:\n  - metric: acc\n")
    args = run_args(tiny_model, tmp_path, tmp_path / "run")
    args[args.index("tiny_mc")] = "empty_task"
    line = one_line_error(evalparity(*args))
    assert "empty_task" in line
    assert not (tmp_path / "run").exists()


def test_dtype_the_device_cannot_run(monkeypatch):
    """On a CPU without AVX2, vLLM cannot run half precision; the check names the dtype and the fix."""
    from evalparity import devices
    from evalparity.errors import EvalParityError

    monkeypatch.setattr(devices, "cpu_flags", lambda: {"sse2"})
    with pytest.raises(EvalParityError, match="dtype bfloat16 cannot run on cpu.*drop it from --dtypes"):
        devices.check_dtypes("cpu", ["float32", "bfloat16"], ["vllm"])
    devices.check_dtypes("cpu", ["float32"], ["vllm"])  # fp32 is fine
    devices.check_dtypes("cpu", ["bfloat16"], ["hf"])  # and HF has no such requirement


def test_cuda_device_missing_is_one_line(tiny_model, tiny_tasks, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    line = one_line_error(evalparity(*run_args(tiny_model, tiny_tasks, tmp_path / "run"), "--device", "cuda"))
    assert "device cuda is not available" in line


def test_output_dir_of_a_different_spec(tiny_model, tiny_tasks, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    spec = {"model": "other-model", "tasks": ["tiny_mc"], "cells": [], "limit": 2}
    (out / "spec.json").write_text(json.dumps(spec))
    before = sorted(p.name for p in out.iterdir())
    line = one_line_error(evalparity(*run_args(tiny_model, tiny_tasks, out)))
    assert "holds a run of a different spec" in line and "model" in line
    assert sorted(p.name for p in out.iterdir()) == before
    assert json.loads((out / "spec.json").read_text()) == spec


def test_report_on_a_non_run_directory(tmp_path):
    line = one_line_error(evalparity("report", str(tmp_path)))
    assert "is not a run directory" in line


@pytest.mark.parametrize("args,needle", [
    (["run", "--max-length", "abc"], "Invalid value for '--max-length'"),
    (["run", "--no-such-option"], "No such option: --no-such-option"),
    (["no-such-command"], "No such command 'no-such-command'"),
    (["report"], "Missing argument"),
])
def test_usage_errors_are_one_line(args, needle):
    """typer/click's own usage errors (a value of the wrong type, an unknown option or command) too."""
    line = one_line_error(evalparity(*args))
    assert needle in line and "--help" in line


# ------------------------------------------------------------------ checked where typed, before anything loads
@pytest.mark.parametrize("extra,needle", [
    (["--max-length", "-5"], "--max-length -5 must be at least 1"),
    (["--max-length", "0"], "--max-length 0 must be at least 1"),
    (["--seed", "-1"], "--seed -1 is not a seed"),
    (["--seed", str(2**32)], f"--seed {2**32} is not a seed"),
    (["--drift", "-1"], "--drift -1 must be at least 0"),
    (["--margin", "1pp,acc=1pp,acc=40pp"], "--margin names acc twice"),
    (["--margin", "1pp,2pp"], "gives the proportion margin twice"),
    (["--margin", "1e-160"], "below the smallest margin"),
    (["--margin", "1e309"], "is not a finite number"),
    (["--margin", "1pp,perplexity=1e300"], "above the largest margin"),
    (["--margin", "loglikelihood=0.1"], "use --ll-tolerance 0.1"),
    (["--ll-tolerance", "nan"], "--ll-tolerance nan is not a tolerance"),
    (["--ll-tolerance", "1e-300"], "--ll-tolerance 1e-300 is not a tolerance"),
])
def test_numbers_out_of_range_fail_before_the_model(tmp_path, extra, needle):
    """The model path does not exist: each check must answer before the model is looked for (was: the
    model's error, or every cell loaded and failed with an empty AssertionError for --max-length -5)."""
    out = tmp_path / "run"
    line = one_line_error(evalparity("run", "--model", str(tmp_path / "no-model"), "--tasks", "x", "--out", str(out),
                                     *extra))
    assert needle in line
    assert not out.exists()


@pytest.mark.parametrize("extra,needle", [
    (["--gen-tokens", "-1"], "--gen-tokens -1 must be at least 0"),
    (["--max-length", "0"], "--max-length 0 must be at least 1"),
    (["--threshold", "nan"], "--threshold nan must be a finite number above 0"),
    (["--threshold", "0"], "--threshold 0 must be a finite number above 0"),
])
def test_drift_numbers_out_of_range(tmp_path, extra, needle):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    line = one_line_error(evalparity("drift", "--prompts", str(prompts), "--model", str(tmp_path / "no-model"),
                                     "--out", str(tmp_path / "d"), *extra))
    assert needle in line


@pytest.mark.parametrize("env,needle", [
    ({"EVALPARITY_CACHE": "/dev/null"}, "$EVALPARITY_CACHE=/dev/null is not a directory"),
    ({"EVALPARITY_CACHE": "/dev/null/cache"}, "$EVALPARITY_CACHE=/dev/null/cache is not a directory"),
    ({"EVALPARITY_PROFILE": "maybe"}, "$EVALPARITY_PROFILE='maybe' is not a switch"),
    ({"EVALPARITY_SCORE_AHEAD": "yes"}, "$EVALPARITY_SCORE_AHEAD='yes' is not one of auto, off, always"),
    ({"EVALPARITY_KERNEL_WARMUP": "all"}, "$EVALPARITY_KERNEL_WARMUP='all' is not one of run, vllm"),
    ({"EVALPARITY_DATASETS_DIR": "/dev/null"}, "$EVALPARITY_DATASETS_DIR=/dev/null is not a directory"),
])
def test_bad_environment_switches_are_one_line(tmp_path, env, needle):
    out = tmp_path / "run"
    line = one_line_error(evalparity("run", "--model", str(tmp_path / "no-model"), "--tasks", "x", "--out", str(out),
                                     env=env))
    assert needle in line
    assert not out.exists()


def test_bad_cache_for_models_prepare(tmp_path):
    """Was: a NotADirectoryError traceback."""
    cache = tmp_path / "a-file"
    cache.write_text("")
    line = one_line_error(evalparity("models", "prepare", env={"EVALPARITY_CACHE": str(cache)}))
    assert f"$EVALPARITY_CACHE={cache} is not a directory" in line


def test_unwritable_cache(tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    cache = tmp_path / "ro"
    cache.mkdir()
    cache.chmod(0o500)
    line = one_line_error(evalparity("models", "prepare", env={"EVALPARITY_CACHE": str(cache / "sub")}))
    assert "is not writable" in line


def test_a_misspelt_metric_in_margin_is_refused(tmp_path):
    """Was: `--margin 1pp,perplexty=0.05` exited as if no margin had been given for it."""
    from synthetic import make_run

    run = make_run(tmp_path / "run", n_tasks=2, cells=["hf-fp32", "vllm-fp32"], docs_per_task=30)
    line = one_line_error(evalparity("report", str(run), "--margin", "1pp,acc_nrom=2pp"))
    assert "--margin names acc_nrom" in line and "use one of acc " in line
    proc = evalparity("report", str(run), "--margin", "1pp,acc=2pp")
    assert proc.returncode in (0, 3, 4) and "Traceback" not in proc.stderr, proc.stderr


def test_run_refuses_an_unknown_margin_metric_before_any_model_loads(tiny_model, tiny_tasks, tmp_path):
    """`run --margin 1pp,acc_nrom=2pp` ran every cell before the statistics refused the name; the preflight
    knows the metrics the tasks declare, so it is refused before any cell starts."""
    out = tmp_path / "r"
    proc = evalparity("run", "--model", str(tiny_model), "--tasks", "tiny_mc", "--include-path", str(tiny_tasks),
                      "--dtypes", "fp32,bf16", "--backends", "hf", "--limit", "2", "--out", str(out),
                      "--margin", "1pp,acc_nrom=2pp")
    line = one_line_error(proc)
    assert proc.returncode == 2 and "--margin names acc_nrom" in line and "acc_norm" in line, line
    assert not any((out / "cells").glob("*")) if (out / "cells").exists() else True
