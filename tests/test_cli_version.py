"""``evalparity --version`` and the exit codes in ``--help``: what a pipeline pins and branches on."""

from __future__ import annotations

import subprocess
import sys

from evalparity import __version__


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalparity.cli", *args], capture_output=True, text=True,
                          timeout=120, env={"COLUMNS": "200", **__import__("os").environ})


def test_version_prints_the_package_version_and_exits_0():
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"evalparity {__version__}"


def test_help_names_every_exit_code():
    out = cli("--help").stdout
    for code in ("0 PASS", "3 FAIL", "4 INCONCLUSIVE", "5 INCOMPLETE", "2 bad input", "130 interrupted",
                 "1 an internal error"):
        assert code in " ".join(out.split()), code


def test_run_help_groups_its_options_in_panels():
    out = cli("run", "--help").stdout
    for panel in ("Model and tasks", "Cells", "Alignment", "Staging", "Statistics", "Placement",
                  "Run folder and outputs"):
        assert f"─ {panel}" in out, panel
