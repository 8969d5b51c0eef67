"""``--help`` at 80 columns (issue 27, item 6): every option of ``run`` in a panel, its flags and its default
shown whole (never cut with "…"), and a help column wide enough to read."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import typer.main

from evalparity.cli import app

WIDTH = 80


def help_text(verb: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("TERMINAL_WIDTH", "FORCE_COLOR")}
    argv = [sys.executable, "-m", "evalparity.cli", *([verb] if verb else []), "--help"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env={**env, "COLUMNS": str(WIDTH), "NO_COLOR": "1"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def options(verb: str) -> list:
    group = typer.main.get_command(app)
    ctx = group.make_context("evalparity", [verb, "--help"], resilient_parsing=True)
    command = group.get_command(ctx, verb)
    return [p for p in command.get_params(ctx) if getattr(p, "param_type_name", "") == "option"]


def expected_default(p) -> str | None:
    """What a user types to get the default: the value, or for an on/off flag the flag that is on."""
    if getattr(p, "is_flag", False):
        if not p.secondary_opts or p.default is None:
            return None
        return p.opts[0] if p.default else p.secondary_opts[0]
    return None if p.default in (None, (), [], "") else str(p.default)


@pytest.mark.parametrize("verb", ["", "run", "report", "compare", "plan", "drift", "doctor"])
def test_help_fits_80_columns_and_cuts_nothing(verb):
    out = help_text(verb)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, max(lines, key=len)
    assert "…" not in out, [line for line in lines if "…" in line]


def test_run_help_shows_every_flag_and_default_whole():
    out = help_text("run")
    rows = [line.strip("│ ") for line in out.splitlines()]
    checked = 0
    for p in options("run"):
        for flag in [*p.opts, *p.secondary_opts]:
            assert re.search(rf"(^|\s){re.escape(flag)}(\s|$)", out, flags=re.M), flag
        default = expected_default(p)
        if default is not None:  # on a line of its own in the help column, whole
            assert any(row.endswith(f"[default: {default}]") for row in rows), (p.opts, default)
            checked += 1
    # many options have one (the repeatable ones, --cell, --python, --repeat ..., have none): the loop did look
    assert checked >= len(options("run")) * 2 // 5


def test_run_help_column_is_wide_and_its_options_are_in_panels():
    out = help_text("run")
    line = next(line for line in out.splitlines() if "--model" in line)
    help_width = WIDTH - len("│ ") - line.index("Local path")
    assert help_width > WIDTH // 2, line  # typer's own layout left it 20 characters at 80 columns
    assert "─ Options " in out and out.index("─ Options ") > out.index("─ Staging ")  # only --help left unpanelled
    panelled = [p for p in options("run") if getattr(p, "rich_help_panel", None)]
    assert len(panelled) == len(options("run")) - 1  # all but --help
