"""The README's CI examples (GitHub Actions, GitLab CI, Buildkite) are what those systems consume: each block
is valid YAML of that system's shape, every `evalparity` command in it parses with this version's options,
and the file each system reads as JUnit is the one the command writes (issue 27, item 4). That the JUnit file
itself is what junitparser and the common JUnit structure accept is tests/test_ci_outputs.py's."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
import yaml

from evalparity.cli import app

README = Path(__file__).resolve().parents[1] / "README.md"


def _block_after(heading: str) -> dict | list:
    text = README.read_text()
    at = text.index(heading)
    m = re.compile(r"```yaml\n(.*?)```", re.S).search(text, at)
    assert m, f"no yaml block after {heading!r} in the README"
    return yaml.safe_load(m.group(1))


def _commands(node) -> list[str]:
    """Every string in the YAML that runs evalparity."""
    if isinstance(node, dict):
        return [c for v in node.values() for c in _commands(v)]
    if isinstance(node, list):
        return [c for v in node for c in _commands(v)]
    return [node] if isinstance(node, str) and node.startswith("evalparity ") else []


def _parse(command: str):
    """The command as this version's CLI parses it (options and their values checked; nothing runs)."""
    argv = shlex.split(command.replace('"$MODEL"', "/models/m"))
    assert argv[0] == "evalparity"
    group = typer.main.get_command(app)
    verb = group.get_command(group.context_class(group), argv[1])
    assert verb is not None, f"{command}: no verb {argv[1]!r}"
    return verb.make_context(argv[1], argv[2:], resilient_parsing=False)


def _junit_path(command: str) -> str:
    argv = shlex.split(command)
    return argv[argv.index("--junit-xml") + 1]


def test_github_actions_example():
    steps = _block_after("GitHub Actions (")
    assert isinstance(steps, list) and all(isinstance(s, dict) for s in steps)
    (command,) = _commands(steps)
    assert _parse(command).params["junit_xml"] is not None
    report = next(s for s in steps if str(s.get("uses", "")).startswith("mikepenz/action-junit-report@"))
    assert report["with"]["report_paths"] == _junit_path(command) and report["if"] == "always()"
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@"))
    out = shlex.split(command)[shlex.split(command).index("--out") + 1]
    assert upload["with"]["path"].rstrip("/") == f"{out}/report"


def test_gitlab_ci_example():
    jobs = _block_after("GitLab CI:")
    (job,) = jobs.values()
    (command,) = _commands(job["script"])
    _parse(command)
    assert job["artifacts"]["reports"]["junit"] == _junit_path(command)
    assert job["artifacts"]["when"] == "always"
    md = shlex.split(command)[shlex.split(command).index("--summary-md") + 1]
    assert md in job["artifacts"]["paths"]


def test_buildkite_example():
    pipeline = _block_after("Buildkite (")
    steps = pipeline["steps"]
    (command,) = _commands(steps)
    _parse(command)
    junit = _junit_path(command)
    run_step = next(s for s in steps if s.get("command") == command)
    assert junit in run_step["artifact_paths"]
    annotate = next(p for s in steps for p in s.get("plugins", []) if any(k.startswith("junit-annotate#") for k in p))
    assert next(iter(annotate.values()))["artifacts"] == junit
    assert any(s.get("continue_on_failure") for s in steps if "wait" in s)  # annotate after a failed gate too


def test_a_misspelt_option_in_an_example_would_fail_here():
    with pytest.raises(Exception, match="No such option: --junit-xlm"):
        _parse("evalparity run --tasks hellaswag --junit-xlm parity-junit.xml")
