"""Fault injection: hostile names, changed models, concurrent runs, kills, full disks, read-only and
truncated files. Every case asserts the same things: no finished-looking cell that is not finished, no
cell from another spec or model, nothing outside the run directory touched, one line on stderr, and the
documented exit code. The cases and their outcomes are printed as a table at the end of the session."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import evalparity, one_line_error
from faults_table import record
from synthetic import make_lm_eval_dir


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and mtime: to show nothing outside a run dir was touched."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def lm_dirs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lm")
    return (make_lm_eval_dir(root / "a", dtype="float32"), make_lm_eval_dir(root / "b", dtype="bfloat16", seed=1))


@pytest.mark.parametrize("bad", ["../../victim", "org/model", "..", ".", ".hidden", "a b", ""])
def test_hostile_compare_names(lm_dirs, tmp_path, bad):
    a, b = lm_dirs
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    before = snapshot(tmp_path)
    out = tmp_path / "o"
    proc = evalparity("compare", str(a), str(b), "--name", bad, "--name", "other", "--out", str(out))
    assert (victim / "precious.txt").read_text() == "keep me"
    line = one_line_error(proc)
    assert proc.returncode == 2 and "not a safe name" in line, line
    assert snapshot(tmp_path) == before  # nothing written, nothing left behind
    assert not out.exists()
    record(f"compare --name {bad!r}", f"exit 2, one line, nothing written ({line[:60]}...)")


def test_compare_out_reused_with_other_inputs_is_refused(lm_dirs, tmp_path):
    a, b = lm_dirs
    c = make_lm_eval_dir(tmp_path / "c", dtype="float16", flip=12, seed=2)  # a cell that would FAIL
    out = tmp_path / "o"
    first = evalparity("compare", str(a), str(c), "--out", str(out), "--no-fail-on-inconclusive")
    assert first.returncode in (0, 3, 4), first.stderr[-2000:]
    before = snapshot(out)
    again = evalparity("compare", str(a), str(b), "--out", str(out))
    line = one_line_error(again)
    assert again.returncode == 2 and "holds another comparison" in line, line
    assert snapshot(out) == before  # the earlier comparison is left as it was
    same = evalparity("compare", str(a), str(c), "--out", str(out), "--no-fail-on-inconclusive")
    assert same.returncode == first.returncode, same.stderr[-2000:]  # the same comparison may be redone
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    line2 = one_line_error(evalparity("compare", str(a), str(b), "--out", str(foreign)))
    assert "does not hold an evalparity comparison" in line2 and (foreign / "notes.txt").read_text() == "mine"
    record("compare --out reused with other inputs", "exit 2, one line, earlier comparison untouched")
    record("compare --out a foreign non-empty dir", "exit 2, one line, nothing written")


def test_compare_input_holding_two_runs_is_refused(lm_dirs, tmp_path):
    a, _ = lm_dirs
    two = tmp_path / "two"
    make_lm_eval_dir(two, sub="org__model-a")
    make_lm_eval_dir(two, sub="org__model-b", flip=10)
    proc = evalparity("compare", str(a), str(two), "--out", str(tmp_path / "o"))
    line = one_line_error(proc)
    assert proc.returncode == 2 and "holds 2 lm-eval runs" in line, line
    assert "org__model-a" in line and "org__model-b" in line
    assert not (tmp_path / "o").exists()
    record("compare input dir with two lm-eval runs", "exit 2, one line listing both runs")
