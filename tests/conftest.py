"""Shared fixtures: a tiny random Llama model and two small local tasks, made once per test session."""

from __future__ import annotations

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
