"""The run's progress without a terminal (issue 27, item 1): timestamped lines while the cells run, at most
``EVALPARITY_PROGRESS_S`` apart or every 10 %, never a frame of rich's live bars; and on a terminal, the bars
with one clock and no phase said twice.

The display is driven with fake ``progress.json`` files and a fake clock; one tiny run end to end checks
that a piped ``evalparity run`` logs its cells before it signs off.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from conftest import VARIANT_CELLS
from rich.console import Console

from evalparity import progress
from evalparity.errors import EvalParityError

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def piped() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=100), out


def write(path: Path, phase: str, desc: str = "", n: int = 0, total: int = 0) -> None:
    path.write_text(json.dumps({"phase": phase, "desc": desc, "n": n, "total": total, "pid": 1}))


def test_log_lines_start_progress_and_end(tmp_path, monkeypatch):
    monkeypatch.setenv(progress.INTERVAL_ENV, "5")
    console, out = piped()
    clock = Clock()
    file = tmp_path / "progress.json"
    shown = progress.display(console, ["hf-fp32"], "cells", total=2)
    assert isinstance(shown, progress.LogLines)
    shown.clock = clock
    with shown:
        assert not shown.watch("hf-fp32", file)  # queued: no file yet, no line
        write(file, "loading model")
        assert shown.watch("hf-fp32", file)
        clock.t += 3
        shown.watch("hf-fp32", file)  # 3 s < 5 s, nothing new: no line
        clock.t += 3
        shown.watch("hf-fp32", file)  # 6 s without a line: a heartbeat
        write(file, "evaluating", "Running loglikelihood requests", 0, 4000)
        clock.t += 1
        shown.watch("hf-fp32", file)  # a new phase: a line
        for n in (100, 200, 300):  # within the interval and the same tenth: silent
            clock.t += 1
            write(file, "evaluating", "Running loglikelihood requests", n, 4000)
            shown.watch("hf-fp32", file)
        clock.t += 1
        write(file, "evaluating", "Running loglikelihood requests", 1200, 4000)
        shown.watch("hf-fp32", file)  # crossed 10 % (and 20 %): a line, though the interval has not passed
        clock.t += 20
        write(file, "evaluating", "Running loglikelihood requests", 1300, 4000)
        shown.watch("hf-fp32", file)  # the same tenth, but the interval has passed: a line
        shown.overall(advance=1)
        shown.finished("hf-fp32", "ok")
    lines = out.getvalue().splitlines()
    assert all(re.match(STAMP + "  ", line) for line in lines), lines
    body = [line.split("  ", 1)[1] for line in lines]
    assert body[0] == "hf-fp32  loading model  elapsed 0:00:00"
    assert body[1] == "hf-fp32  loading model  elapsed 0:00:06"
    assert body[2] == "hf-fp32  evaluating: Running loglikelihood requests 0/4,000 (0 %)  elapsed 0:00:07"
    # 1,200 of 4,000 in 4 s from 0: 300 docs a second, 2,800 to go
    assert body[3] == ("hf-fp32  evaluating: Running loglikelihood requests 1,200/4,000 (30 %)  elapsed 0:00:11  "
                       "eta 0:00:09")
    assert body[4].startswith("hf-fp32  evaluating: Running loglikelihood requests 1,300/4,000 (32 %)  "
                              "elapsed 0:00:31  eta ")
    assert body[5] == "hf-fp32  ok in 0:00:31  (1/2 cells)"
    assert len(body) == 6
    assert "━" not in out.getvalue() and "loading model loading model" not in out.getvalue()


def test_every_tenth_gets_a_line_and_a_new_bar_its_own_tenths(tmp_path, monkeypatch):
    monkeypatch.setenv(progress.INTERVAL_ENV, "1000")
    console, out = piped()
    clock = Clock()
    file = tmp_path / "progress.json"
    shown = progress.display(console, ["c"], "cells")
    shown.clock = clock
    write(file, "evaluating", "a", 0, 100)
    shown.watch("c", file)
    for n in range(0, 101, 5):
        clock.t += 1
        write(file, "evaluating", "a", n, 100)
        shown.watch("c", file)
    write(file, "evaluating", "b", 0, 10)  # the next bar of the same phase: no line of its own
    clock.t += 1
    shown.watch("c", file)
    write(file, "evaluating", "b", 5, 10)
    clock.t += 1
    shown.watch("c", file)
    pcts = re.findall(r"\((\d+) %\)", out.getvalue())
    assert pcts == ["0"] + [str(p) for p in range(10, 101, 10)] + ["50"], out.getvalue()


def test_a_staged_cell_logs_each_round_and_the_rounds_lines(tmp_path, monkeypatch):
    monkeypatch.setenv(progress.INTERVAL_ENV, "30")
    console, out = piped()
    clock = Clock()
    file = tmp_path / "progress.json"
    shown = progress.display(console, ["hf-fp32"], "round 1")
    shown.clock = clock
    shown.overall(description="round 1: 100 docs per cell (t[b]x)")
    write(file, "evaluating", "", 0, 0)
    shown.watch("hf-fp32", file)
    clock.t += 40
    shown.finished("hf-fp32", "round 1 done", count=1)
    shown.line("round 1: t[b]x 100 docs, open (0 settled): next look 200")
    write(file, "waiting for round 2")
    clock.t += 5
    shown.watch("hf-fp32", file)
    clock.t += 10
    shown.finished("hf-fp32", "round 2 done", count=2)
    body = [line.split("  ", 1)[1] for line in out.getvalue().splitlines()]
    assert body == ["round 1: 100 docs per cell (t[b]x)",
                    "hf-fp32  evaluating  elapsed 0:00:00",
                    "hf-fp32  round 1 done in 0:00:40",
                    "round 1: t[b]x 100 docs, open (0 settled): next look 200",
                    "hf-fp32  waiting for round 2  elapsed 0:00:45",
                    "hf-fp32  round 2 done in 0:00:10"]


def test_the_terminal_face_has_one_clock_and_no_phase_twice(tmp_path):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, force_interactive=True, width=120)
    file = tmp_path / "progress.json"
    shown = progress.display(console, ["hf-fp32"], "cells", total=1)
    assert isinstance(shown, progress.LiveBars)
    with shown:
        write(file, "loading model")
        shown.watch("hf-fp32", file)
        shown.bars.refresh()
        write(file, "evaluating", "Running loglikelihood requests", 10, 40)
        shown.watch("hf-fp32", file)
        shown.bars.refresh()
        shown.finished("hf-fp32", "ok")
    text = out.getvalue()
    assert "loading model" in text and "loading model loading model" not in text
    assert "hf-fp32: ok" in text and not re.search(r"ok in \d", text)
    assert "━" in text


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_bad_interval_is_one_line_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(progress.INTERVAL_ENV, value)
    with pytest.raises(EvalParityError, match=progress.INTERVAL_ENV) as err:
        progress.display(Console(file=io.StringIO()), [], "cells")
    assert "\n" not in str(err.value)


def test_a_piped_run_logs_its_cells_before_it_signs_off(hf_variant_run):
    """The shared run of conftest.hf_variant_run: its output went to a pipe, progress every 0.5 s."""
    _, out, proc = hf_variant_run
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]
    err = proc.stderr
    assert "━" not in err[:err.index("┏")], err  # no bar's frame before the cells' summary table (heavy box)
    sign_off = err.index("sign-off:")
    for cell in VARIANT_CELLS:
        lines = re.findall(rf"^{STAMP}  {cell}  .*$", err[:sign_off], flags=re.M)
        assert any("elapsed" in line for line in lines), err  # its start or progress lines
        assert any(re.search(r"  ok in \d+:\d\d:\d\d", line) for line in lines), err  # and its end
    for key, value in (("model", ""), ("device", "cpu"), ("cells", ", ".join(VARIANT_CELLS)), ("out", str(out)),
                       ("executor", "local")):  # the plan, before the first cell's line
        assert re.search(rf"^{STAMP}  {key} +{re.escape(value)}", err[:err.index("hf-fp32  ")], flags=re.M), err
    # Every line of the run's log starts with the time: all before the cells' table, and after it up to the
    # report; the results (the tables, the sign-off) keep their first words where people and scripts look.
    lines = err.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    bottom = next(i for i, line in enumerate(lines) if line.startswith("└"))
    report = next(i for i, line in enumerate(lines) if line.endswith("  report ..."))
    after = lines[bottom + 1:report + 1]
    if any(line.strip() == "scores" for line in after):  # the scores table (a result) follows the cells'
        s = next(i for i, line in enumerate(after) if line.strip() == "scores")
        e = next(i for i in range(s, len(after)) if re.match(STAMP + "  ", after[i]))
        assert any("0." in line for line in after[s:e]), err  # it holds the cells' scores
        after = after[:s] + after[e:]
    logged = lines[:top - 1] + after  # top - 1: the table's title
    assert len(logged) > 10 and all(re.match(STAMP + "  ", line) for line in logged), err
    assert any(line.endswith("  statistics ...") for line in logged), err
    assert re.search(r"^sign-off: ", err, flags=re.M) and not re.search(rf"^{STAMP}  sign-off", err, flags=re.M)


def test_log_lines_and_records_are_timestamped_in_a_piped_run_only(monkeypatch):
    """``output.log`` and the log records: the time first within ``timestamped_log`` on a pipe, the same
    clock as the progress lines; never outside it (``report``'s lines) and never on a terminal."""
    import logging

    from evalparity.cli import output

    record = logging.LogRecord("evalparity.x", logging.WARNING, __file__, 1, "took over a lock\nof %s", ("r",), None)
    for terminal in (False, True):
        out = io.StringIO()
        console = Console(file=out, force_terminal=terminal, force_interactive=terminal, color_system=None,
                          width=40)
        monkeypatch.setattr(output, "console", console)
        with output.timestamped_log():
            output.log("checking 1 task(s) and their data ... " + "x" * 40)  # longer than the console
            output.ConsoleHandler().emit(record)
        output.log("statistics ...")
        output.ConsoleHandler().emit(record)
        lines = out.getvalue().splitlines()
        if terminal:
            assert not any(re.match(STAMP, line) for line in lines), lines
            continue
        assert [bool(re.match(STAMP + "  ", line)) for line in lines] == [True] * 3 + [False] * 3, lines
        assert lines[0].endswith("x" * 40) and lines[2].endswith("of r")  # not wrapped: no line without a time
