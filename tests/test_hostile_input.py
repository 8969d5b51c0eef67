"""Hostile text and interrupts: a folder, task or model name holding rich markup (``[/]``, ``[bold]``), ANSI
escapes, carriage returns, C1 controls, bidirectional overrides, markdown or HTML is shown as written on the
terminal, in report.md and in report.html, and nothing in it is obeyed; the sign-off line reaches stdout, and
its exit code stands, whatever the console or a Ctrl-C does after it.

No model: the run folders are synthetic (``synthetic.make_run``), each CLI call a subprocess of a few seconds.
"""

from __future__ import annotations

import html
import io
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import evalparity, one_line_error, sigint_as_on_a_terminal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from synthetic import make_run

from evalparity.cli import output
from evalparity.errors import EXIT_DIFFERENT, EXIT_INCONCLUSIVE
from evalparity.printable import CONTROL, visible
from evalparity.report import md_escape, md_fence

# Pieces that each meant something to a terminal, rich, markdown or HTML before they were escaped.
HOSTILE = ["[/]", "[bold]", "[red]", "[/red]", "\x1b[31m", "\x1b]8;;http://x\x07", "\r", "\x9b2J", "\x07", "\x00",
           "\u202e", "\u2028", "|", "`", "```", "<script>", "</td>", "&", "$", "\\", "*", "_", "~", "#", "\n",
           ":smile:"]
hostile_text = st.lists(st.sampled_from(HOSTILE) | st.text(max_size=3), min_size=1, max_size=8).map("".join)
# Names a run folder or a task can have on disk (no slash, no NUL), hostile all the same.
hostile_name = st.lists(st.sampled_from([p for p in HOSTILE if p not in ("\x00", "</td>")] + ["a", "b1"]),
                        min_size=1, max_size=6).map(lambda parts: "x" + "".join(parts))
CODES = {"PASS": 0, "FAIL": EXIT_DIFFERENT, "INCONCLUSIVE": EXIT_INCONCLUSIVE}


def plain_console() -> tuple[Console, io.StringIO]:
    """A console set up like ``output.console`` (no emoji codes) writing to a buffer, with no colour codes of
    its own, so that any escape character in what it wrote came from the text printed."""
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, color_system=None, width=400, emoji=False), buf


def sign_off_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].split(":")[0] in CODES, stdout
    return lines[0]


# ---------------------------------------------------------------- the helpers, on any text
@settings(max_examples=200, deadline=None)
@given(hostile_text)
def test_visible_leaves_no_control_character_and_keeps_the_rest(text):
    shown = visible(text)
    assert not CONTROL.search(shown)
    assert visible(CONTROL.sub("", text)) == CONTROL.sub("", text)  # printable text is left as it is
    assert visible(text, keep_newlines=True).count("\n") == text.count("\n")


@settings(max_examples=200, deadline=None)
@given(hostile_text)
def test_safe_text_prints_exactly_as_visible(text):
    """rich reads none of it as markup (no MarkupError, no tag swallowed), whatever brackets it holds; an
    error line (``error_line``) ends with it, as written."""
    console, buf = plain_console()
    console.print(f"[red]x[/red]{output.safe(text)}[bold]y[/bold]", soft_wrap=True, highlight=False)
    console.print(output.error_line(text), soft_wrap=True, highlight=False)
    assert buf.getvalue() == f"x{visible(text)}y\nerror: {visible(text)}\n"


@settings(max_examples=100, deadline=None)
@given(hostile_text)
def test_log_records_show_control_characters(text):
    console, buf = plain_console()
    old, output.console = output.console, console
    try:
        record = logging.LogRecord("evalparity.x", logging.WARNING, __file__, 1, "task %s: %s", (text, "[/]"), None)
        output.ConsoleHandler().emit(record)
    finally:
        output.console = old
    written = buf.getvalue()
    assert not CONTROL.search(written.replace("\n", ""))  # no control character but the lines' ends
    assert visible(f"task {text}: [/]", keep_newlines=True) + "\n" == written


@settings(max_examples=200, deadline=None)
@given(hostile_text)
def test_markdown_escape_and_fence_leave_nothing_to_interpret(text):
    escaped = md_escape(text)
    assert not CONTROL.search(escaped) and "<" not in escaped and "\n" not in escaped
    assert not re.search(r"(?<!\\)[|`*_\[\]~]", escaped.replace("\\\\", ""))  # each one backslash-escaped
    fenced = md_fence(text)
    assert not CONTROL.search(fenced.replace("\n", ""))
    fence = fenced.split("\n")[0]
    body = fenced[len(fence) + 1:-len(fence) - 2]
    assert body == visible(text, keep_newlines=True) and fence not in body


# ---------------------------------------------------------------- the command line, end to end
@pytest.fixture(scope="module")
def odd_run(tmp_path_factory) -> Path:
    """A run folder whose own name holds rich markup."""
    return make_run(tmp_path_factory.mktemp("odd") / "mk[/][bold]", n_tasks=2, cells=["hf-fp32", "vllm-fp32"],
                    docs_per_task=40, drift={"vllm-fp32": 0.3})


def test_markup_in_the_run_folder_is_printed_as_written(odd_run):
    """Was: the report written, then a MarkupError traceback, exit 1, and no sign-off line on stdout."""
    proc = evalparity("report", str(odd_run))
    assert "Traceback" not in proc.stderr, proc.stderr
    status = sign_off_line(proc.stdout).split(":")[0]
    assert proc.returncode == CODES[status]
    assert f"report: {odd_run / 'report' / 'report.html'}" in proc.stderr


def test_markup_in_a_path_does_not_change_the_error(tmp_path):
    """Was: ``[bold]`` vanished from the path the error named."""
    missing = tmp_path / "x[bold]y[/]z\x1b[2J"
    line = one_line_error(evalparity("report", str(missing)))
    assert f"{visible(missing)} is not a run directory" in line and "\x1b" not in line


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_sign_off_stands_after_ctrl_c(odd_run, sig):
    """Ctrl-C (or SIGTERM, a CI job's time limit) just after the sign-off line: the exit code is still the
    sign-off's (was: 130, or -2 when the interrupt came while the interpreter shut down)."""
    expected = evalparity("report", str(odd_run)).returncode
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-m", "evalparity.cli", "report", str(odd_run)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=sigint_as_on_a_terminal)
        line = proc.stdout.readline()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert sign_off_line(line) and proc.returncode == expected, (proc.returncode, err)
        assert "Traceback" not in err, err


@pytest.mark.parametrize("sig, code, says", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "stopped by SIGTERM before the sign-off")])
def test_ctrl_c_before_the_sign_off_is_130(odd_run, sig, code, says):
    """(It failed in CI-shaped runs started with ``.ci/run &``: the report then inherited SIGINT ignored.)
    SIGTERM, how CI stops a job, likewise: 143 and a line saying so (was: killed by the signal, silently)."""
    proc = subprocess.Popen([sys.executable, "-m", "evalparity.cli", "report", str(odd_run)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_on_a_terminal)
    assert proc.stderr.readline().startswith("statistics")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code and out == "", (out, err)
    assert says in err and "Traceback" not in err


def test_a_closed_terminal_stops_the_command_with_129(odd_run):
    """The terminal a command runs in is closed before its sign-off (SIGHUP, and every later write to it
    fails with EIO): exit 129, as for SIGHUP. Was 1 with a traceback: the stop's own line, and the progress
    display's last write, failed on the dead terminal and were taken for an internal error."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own, the pty its terminal, SIGHUP at its default (not nohup's)
        sigint_as_on_a_terminal()
        os.execv(sys.executable, [sys.executable, "-m", "evalparity.cli", "report", str(odd_run)])
    seen = b""
    deadline = time.time() + 120
    while b"statistics" not in seen and time.time() < deadline:
        try:
            seen += os.read(fd, 4096)
        except OSError:
            break
    os.close(fd)  # the terminal closes: SIGHUP to its session, EIO on every write from here on
    _, status = os.waitpid(pid, 0)
    assert b"statistics" in seen, seen
    assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGHUP


TWICE = """
import os, signal, sys, time
from evalparity import cli
from evalparity.cli import output
cli._stop_on_signals()
output._signed_off = 3  # a sign-off line printed, FAIL's code
os.kill(os.getpid(), signal.SIGTERM)  # noted: the cleanup would carry on
os.kill(os.getpid(), signal.SIGTERM)  # ends it at once
time.sleep(30)
"""


def test_a_second_sigterm_after_the_sign_off_keeps_its_code():
    """After the sign-off, a first SIGTERM lets the cleanup finish and a second ends the command at once: with
    the sign-off's code, as for Ctrl-C (was: killed by the signal, -15)."""
    proc = subprocess.run([sys.executable, "-c", TWICE], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert "the sign-off above is final" in proc.stderr


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_name, hostile_name)
def test_hostile_task_and_model_names_in_terminal_and_reports(group, model):
    """A task (group) and model name of hostile pieces: the console shows them escaped, report.md holds them
    markdown-escaped, report.html HTML-escaped, none holds a raw control character or a live tag."""
    with tempfile.TemporaryDirectory() as tmp:
        run = make_run(Path(tmp) / "run", n_tasks=2, cells=["hf-fp32", "vllm-fp32"], docs_per_task=30, group=group,
                       model=model, drift={"vllm-fp32": 0.2})
        proc = evalparity("report", str(run))
        assert "Traceback" not in proc.stderr, proc.stderr
        status = sign_off_line(proc.stdout).split(":")[0]
        assert proc.returncode == CODES[status]
        assert not CONTROL.search(proc.stderr.replace("\n", "")), proc.stderr
        md = (run / "report" / "report.md").read_text()
        page = (run / "report" / "report.html").read_text()
        for text in (md, page):
            assert not CONTROL.search(text.replace("\n", "")), "a raw control character in a report"
        assert md_escape(group) in md and md_escape(model) in md
        for name in (group, model):  # a newline in HTML text is a space: kept; everything else written out
            assert html.escape(visible(name, keep_newlines=True), quote=False) in page
        assert page.count("<script>") == 1  # the report's own self-check, nothing from a name
