"""Shared fixtures: a tiny random Llama model and two small local tasks, made once per test session."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from tiny import make_tasks, make_tiny_model  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"
SHARED_DATA = SHARED / "data"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_tasks(tmp_path_factory) -> Path:
    return make_tasks(tmp_path_factory.mktemp("tasks"), n_docs=12)


# The shared tiny run: both backends x fp32/bf16 on a multiple-choice and a generation task, plus hf-fp32
# again split over two shards. test_run_tiny checks it; test_ray reruns it through Ray and compares.
TINY_CELLS = ["vllm-fp32", "vllm-bf16", "hf-fp32", "hf-bf16"]


def tiny_run_args(model: Path, tasks: Path, out: Path) -> list[str]:
    return ["run", "--model", str(model), "--tasks", "tiny_mc,tiny_gen", "--include-path", str(tasks),
            "--dtypes", "fp32,bf16", "--limit", "10", "--max-length", "512", "--repeat", "hf:fp32:dp2",
            "--out", str(out)]


@pytest.fixture(scope="session")
def tiny_run(tiny_model, tiny_tasks, tmp_path_factory):
    """One run of the tiny matrix (about 100 s on 2 CPU cores), shared by the tests that read it."""
    out = tmp_path_factory.mktemp("run") / "r"
    proc = evalparity(*tiny_run_args(tiny_model, tiny_tasks, out))
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]
    return out, proc


def crash_args(model: Path, tasks: Path, out: Path) -> list[str]:
    """A one-cell run whose cell crashes for real: ``backend=seq2seq`` makes HF load an encoder-decoder class
    for a Llama config."""
    return ["run", "--model", str(model), "--tasks", "tiny_mc", "--include-path", str(tasks), "--backends", "hf",
            "--dtypes", "fp32", "--limit", "2", "--max-length", "256", "--single-cell", "--hf-args", "backend=seq2seq",
            "--out", str(out)]


@pytest.fixture(scope="session")
def crashed_cell(tiny_model, tiny_tasks, tmp_path_factory):
    """That run, once: (its folder, the finished command). test_run_tiny reads it; test_faults reruns a copy
    for the second attempt."""
    out = tmp_path_factory.mktemp("crash") / "r"
    return out, evalparity(*crash_args(tiny_model, tiny_tasks, out))


@pytest.fixture
def frozen_heap():
    """The heap as it is, frozen for one test (``gc.freeze``), so that a ``gc.collect()`` walks only what the
    test allocates. statsmodels' Holm calls ``gc.collect()`` every time (evalparity/stats/multiplicity.py
    says why the product avoids it); in the suite's process, with torch, transformers and lm-eval's task
    index loaded, each call walks about 470,000 objects: 0.6-1.2 s a call, 29 s for test_verdicts' 50 calls
    in CI. Garbage collection changes no number a test compares."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def evalparity(*args: str, cwd: Path | None = None, timeout: float = 900,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the installed CLI as a user would, capturing its output."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "evalparity.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=e)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The error a bad input produced: one 'error:' line, last on stderr (progress lines may precede it),
    a non-zero exit and no traceback."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr
    return errors[0]


def pytest_terminal_summary(terminalreporter):
    """The fault-injection suite's cases and outcomes (tests/test_faults.py), whatever ``-s`` says."""
    from faults_table import render

    table = render()
    if table:
        terminalreporter.write_sep("=", "fault injection: case -> outcome")
        terminalreporter.write_line(table)
