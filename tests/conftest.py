"""Shared fixtures: a tiny random Llama model and two small local tasks, made once per test session; the
shared runs on them, started ahead of the tests that read them (``ahead``)."""

from __future__ import annotations

import gc
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import ahead  # noqa: E402
import venvs  # noqa: E402
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
def alt_venv(tmp_path_factory) -> Path:
    """(The interpreter of) a second venv with another transformers (``venvs.make_alt_venv``); here, not in
    test_cell_envs, because a job started ahead asks for it from the session's first test, wherever that is."""
    return venvs.make_alt_venv(tmp_path_factory)


@pytest.fixture(scope="session", autouse=True)
def _ahead(request):
    """The long runs the collected tests read, started in the background as the session begins (``ahead``)."""
    ahead.start(request)
    yield
    ahead.stop()


def cli(*args: str) -> list[str]:
    """The command line of ``evalparity ARGS`` as the tests run it (this interpreter, the installed package)."""
    return [sys.executable, "-m", "evalparity.cli", *args]


@ahead.job("tiny_run", first=True)  # the longest job (~100 s), read from test_compare on: started first
def _tiny_run(ctx: ahead.Context):
    out = ctx.mktemp("run") / "r"
    copy = ctx.mktemp("run-copy") / "r"
    args = tiny_run_args(ctx.fixture("tiny_model"), ctx.fixture("tiny_tasks"), out)

    def work():
        proc = ctx.run(cli(*args))
        if proc.returncode in (0, 3, 4):
            shutil.copytree(out, copy, symlinks=True)
        return out, proc, copy
    return work


@pytest.fixture(scope="session")
def tiny_run(request):
    """One run of the tiny matrix (about 100 s on 2 CPU cores), shared by the tests that read it."""
    out, proc, _ = ahead.take("tiny_run", request)
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]
    return out, proc


def tiny_run_copy() -> Path:
    """A copy of the shared tiny run made as it finished, before any test rewrote its report (test_run_tiny
    does): for the one test that changes a copy of it (test_tamper's forced rerun). The tiny run's job
    (ahead) waited for, or run here."""
    return ahead.take("tiny_run", None)[2]


# A second shared run, of HF cells only: a named variant cell with a repeat of its own, a copy of the tiny model
# given a chat template and applied, progress every 0.5 s on a pipe. Three features, one run, each read by its
# own test (test_variants, test_cli_lmeval, test_progress_logs): each was a run of its own (about 80 s in all).
VARIANT_CELLS = ["hf-fp32", "eager", "eager-bs2"]
CHAT_TEMPLATE = "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}{% endfor %}"


def hf_variant_args(model: Path, tasks: Path, out: Path, cell: str = "eager=hf:fp32:attn_implementation=eager",
                    *extra: str) -> list[str]:
    return ["run", "--model", str(model), "--tasks", "tiny_mc", "--include-path", str(tasks), "--limit", "6",
            "--max-length", "256", "--cell", cell, "--apply-chat-template", "--system-instruction", "Be brief.",
            *extra, "--out", str(out)]


@ahead.job("hf_variant_run")
def _hf_variant_run(ctx: ahead.Context):
    root = ctx.mktemp("hfvariant")
    model, out = root / "chat-model", root / "run"
    tiny, tasks = ctx.fixture("tiny_model"), ctx.fixture("tiny_tasks")

    def work():
        import json

        from evalparity.progress import INTERVAL_ENV

        shutil.copytree(tiny, model)
        cfg = json.loads((model / "tokenizer_config.json").read_text())
        cfg["chat_template"] = CHAT_TEMPLATE
        (model / "tokenizer_config.json").write_text(json.dumps(cfg))
        proc = ctx.run(cli(*hf_variant_args(model, tasks, out, "eager=hf:fp32:attn_implementation=eager",
                                            "--repeat", "eager:2")), env={INTERVAL_ENV: "0.5"})
        return model, out, proc
    return work


@pytest.fixture(scope="session")
def hf_variant_run(request):
    """That run: (its model, its folder, the finished command)."""
    return ahead.take("hf_variant_run", request)


def crash_args(model: Path, tasks: Path, out: Path) -> list[str]:
    """A one-cell run whose cell crashes for real: ``backend=seq2seq`` makes HF load an encoder-decoder class
    for a Llama config."""
    return ["run", "--model", str(model), "--tasks", "tiny_mc", "--include-path", str(tasks), "--backends", "hf",
            "--dtypes", "fp32", "--limit", "2", "--max-length", "256", "--single-cell", "--hf-args", "backend=seq2seq",
            "--out", str(out)]


@ahead.job("crashed_cell")
def _crashed_cell(ctx: ahead.Context):
    out = ctx.mktemp("crash") / "r"
    args = crash_args(ctx.fixture("tiny_model"), ctx.fixture("tiny_tasks"), out)
    return lambda: (out, ctx.run(cli(*args)))


@pytest.fixture(scope="session")
def crashed_cell(request):
    """That run, once: (its folder, the finished command). test_run_tiny reads it; test_faults reruns a copy
    for the second attempt."""
    return ahead.take("crashed_cell", request)


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
    return ahead.run(cli(*args), env=env, cwd=cwd, timeout=timeout)


def evalparity_here(*args: str) -> subprocess.CompletedProcess:
    """``evalparity ARGS`` in this process (``tamper.run_cli``: the console script's ``main``, its exit code,
    stdout and stderr), as ``evalparity`` gives them. The same code without a new interpreter's start and
    imports: measured, a report of a small synthetic run is 3.6 s of CPU as a process and 0.7 s here, a
    compare 3.2 s and 0.45 s. Only for commands that end by themselves and need nothing of a process of
    their own: not ``run`` (it sets the offline variables in its process), not a kill hook, a signal, a lock
    this process holds, another environment or folder, or a check that no Python warning reached stderr
    (pytest keeps warnings off stderr in its own process)."""
    from tamper import run_cli

    code, out, err = run_cli(list(args))
    return subprocess.CompletedProcess(["evalparity", *args], code, out, err)


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


def sigint_as_on_a_terminal() -> None:
    """``preexec_fn`` for a child a test will Ctrl-C: a terminal's foreground job has SIGINT at its default,
    but a job started in the background of a non-interactive shell (``.ci/run &``, as CI scripts may be)
    inherits it ignored, and then Python never raises KeyboardInterrupt. Gives the child what a terminal
    gives it. SIGHUP likewise: ``nohup`` (as a CI-shaped run may be started) leaves it ignored."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
