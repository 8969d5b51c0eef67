"""Fault injection: hostile names, changed models, concurrent runs, kills, full disks, read-only and
truncated files. Every case asserts the same things: no finished-looking cell that is not finished, no
cell from another spec or model, nothing outside the run directory touched, one line on stderr, and the
documented exit code. The cases and their outcomes are printed as a table at the end of the session.

A command that needs nothing of a process of its own (a report or a comparison that ends by itself) runs in
this process (``conftest.evalparity_here``: the console script's ``main``, ~3 s less each); kills, signals,
locks this process holds, mounts, other folders or environments, and the checks that no Python warning
reached stderr run the CLI as a process (``conftest.evalparity``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import ahead
import pytest
from conftest import cli, crash_args, evalparity, evalparity_here, one_line_error
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
    proc = evalparity_here("compare", str(a), str(b), "--name", bad, "--name", "other", "--out", str(out))
    assert (victim / "precious.txt").read_text() == "keep me"
    line = one_line_error(proc)
    assert proc.returncode == 2 and "not a safe name" in line, line
    assert snapshot(tmp_path) == before  # nothing written, nothing left behind
    assert not out.exists()
    record(f"compare --name {bad!r}", f"exit 2, one line, nothing written ({line[:60]}...)")


def test_a_compare_name_given_twice_is_refused_before_anything_is_written(lm_dirs, tmp_path):
    """Two inputs under one ``--name``: the second became ``<name>-2``, which nobody asked for."""
    a, b = lm_dirs
    out = tmp_path / "o"
    proc = evalparity_here("compare", str(a), str(b), "--name", "x", "--name", "x", "--out", str(out))
    line = one_line_error(proc)
    assert proc.returncode == 2 and "--name x is given twice" in line, line
    assert not out.exists()


def test_compare_out_reused_with_other_inputs_is_refused(lm_dirs, tmp_path):
    a, b = lm_dirs
    c = make_lm_eval_dir(tmp_path / "c", dtype="float16", flip=12, seed=2)  # a cell that would FAIL
    out = tmp_path / "o"
    first = evalparity_here("compare", str(a), str(c), "--out", str(out), "--no-fail-on-inconclusive")
    assert first.returncode in (0, 3, 4), first.stderr[-2000:]
    before = snapshot(out)
    again = evalparity_here("compare", str(a), str(b), "--out", str(out))
    line = one_line_error(again)
    assert again.returncode == 2 and "holds another comparison" in line, line
    assert snapshot(out) == before  # the earlier comparison is left as it was
    same = evalparity_here("compare", str(a), str(c), "--out", str(out), "--no-fail-on-inconclusive")
    assert same.returncode == first.returncode, same.stderr[-2000:]  # the same comparison may be redone
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    line2 = one_line_error(evalparity_here("compare", str(a), str(b), "--out", str(foreign)))
    assert "does not hold an evalparity comparison" in line2 and (foreign / "notes.txt").read_text() == "mine"
    record("compare --out reused with other inputs", "exit 2, one line, earlier comparison untouched")
    record("compare --out a foreign non-empty dir", "exit 2, one line, nothing written")


def test_compare_input_holding_two_runs_is_refused(lm_dirs, tmp_path):
    a, _ = lm_dirs
    two = tmp_path / "two"
    make_lm_eval_dir(two, sub="org__model-a")
    make_lm_eval_dir(two, sub="org__model-b", flip=10)
    proc = evalparity_here("compare", str(a), str(two), "--out", str(tmp_path / "o"))
    line = one_line_error(proc)
    assert proc.returncode == 2 and "holds 2 lm-eval runs" in line, line
    assert "org__model-a" in line and "org__model-b" in line
    assert not (tmp_path / "o").exists()
    record("compare input dir with two lm-eval runs", "exit 2, one line listing both runs")


def _tiny_args(model: str, tasks: Path, out: Path, *extra: str) -> list[str]:
    return ["run", "--model", model, "--tasks", "tiny_mc", "--include-path", str(tasks), "--backends", "hf",
            "--dtypes", "fp32", "--limit", "2", "--max-length", "256", "--out", str(out), *extra]


def _cells(out: Path) -> dict[str, str]:
    return {p.name: p.joinpath("cell.json").read_text() for p in sorted((out / "cells").iterdir())
            if p.joinpath("cell.json").exists()}


@ahead.job("model_at_m")
def _model_at_m(ctx: ahead.Context):
    """A copy of the tiny model at ./m and a finished one-cell run of it from that folder (started ahead:
    tests/ahead.py)."""
    import shutil

    root = ctx.mktemp("model_at_m")
    shutil.copytree(ctx.fixture("tiny_model"), root / "m")
    cmd = cli(*_tiny_args("./m", ctx.fixture("tiny_tasks"), root / "r", "--single-cell"))
    return lambda: (root, ctx.run(cmd, cwd=root))


@pytest.fixture
def model_at_m(request):
    return ahead.take("model_at_m", request)


def test_changed_model_at_the_same_path_is_refused(model_at_m, tiny_model, tiny_tasks):
    import shutil

    tmp_path, first = model_at_m
    out = tmp_path / "r"
    assert first.returncode == 0, first.stderr[-3000:]
    spec = json.loads((out / "spec.json").read_text())
    fp = spec["model_fingerprint"]
    assert fp["source"] == str((tmp_path / "m").resolve())
    assert fp["files"]["model.safetensors"]["kind"] == "weights" and fp["files"]["config.json"]["kind"] == "config"
    assert json.loads((out / "cells" / "hf-fp32" / "cell.json").read_text())["model_fingerprint"] == fp["digest"]
    cells_before = _cells(out)
    # the same model, the same spec, another batch size for a finished cell: refused, nothing rerun
    bs = evalparity(*_tiny_args("./m", tiny_tasks, out, "--dtypes", "fp32,bf16", "--batch-size", "4"), cwd=tmp_path)
    line = one_line_error(bs)
    assert bs.returncode == 2 and "finished with --batch-size 8, this run asks for 4" in line, line
    record("rerun with another --batch-size", "exit 2, one line; spec.json and cells unchanged")
    # new weights at the same path (same size): refused, naming the file
    w = tmp_path / "m" / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-100:] = bytes(100)
    w.write_bytes(bytes(data))
    changed = evalparity(*_tiny_args("./m", tiny_tasks, out, "--dtypes", "fp32,bf16"), cwd=tmp_path)
    line = one_line_error(changed)
    assert changed.returncode == 2 and "holds cells of another model" in line, line
    assert "weights file model.safetensors changed" in line, line
    record("weights overwritten at the same path", "exit 2, one line naming model.safetensors; no cell rerun")
    # ./m from another folder is another model
    other = tmp_path / "elsewhere"
    shutil.copytree(tiny_model, other / "m")
    moved = evalparity(*_tiny_args("./m", tiny_tasks, out, "--dtypes", "fp32,bf16"), cwd=other)
    line = one_line_error(moved)
    assert moved.returncode == 2 and f"model: '{(tmp_path / 'm').resolve()}' there" in line, line
    assert f"'{(other / 'm').resolve()}' now" in line, line
    record("--model ./m from another folder", "exit 2, one line naming both paths")
    assert _cells(out) == cells_before and json.loads((out / "spec.json").read_text()) == spec


def test_single_cell_run_is_refused_before_any_model_loads(tiny_model, tiny_tasks, tmp_path):
    out = tmp_path / "r"
    proc = evalparity(*_tiny_args(str(tiny_model), tiny_tasks, out))
    line = one_line_error(proc)
    assert proc.returncode == 2 and "single cell (hf-fp32)" in line and "--single-cell" in line, line
    assert not out.exists()
    record("run with a single cell", "exit 2, one line, nothing written")


def test_a_second_run_on_a_locked_dir_names_the_holder(tiny_model, tiny_tasks, tmp_path):
    import platform

    from evalparity import rundir

    out = tmp_path / "r"
    with rundir.acquire(out):
        before = snapshot(tmp_path)
        proc = evalparity(*_tiny_args(str(tiny_model), tiny_tasks, out, "--dtypes", "fp32,bf16"))
        line = one_line_error(proc)
        assert proc.returncode == 2 and f"pid {os.getpid()} on {platform.node()}" in line, line
        assert snapshot(tmp_path) == before
        rep = evalparity("compare", str(tmp_path), str(tmp_path), "--out", str(out))
        assert "is in use by another evalparity" in one_line_error(rep)
    assert not out.exists()  # the lock's own directory goes with it, being empty
    record("second run while a run holds the dir", "exit 2, one line naming host and pid; nothing written")


@pytest.mark.parametrize("to", ["nowhere", "outside"])
def test_a_lock_that_is_a_symbolic_link_is_named_so(tmp_path, to):
    """A dangling link at the lock's name read as "no lock" twenty times, and the refusal said the lock
    "keeps changing hands"; a link to a file outside is never written through or followed into a takeover."""
    from evalparity import rundir
    from evalparity.errors import EvalParityError

    run = tmp_path / "r"
    run.mkdir()
    outside = tmp_path / "outside.txt"
    if to == "outside":
        outside.write_text("keep me")
    (run / ".evalparity.lock").symlink_to(outside)
    with pytest.raises(EvalParityError, match="is a symbolic link .*not a lock evalparity writes"):
        rundir.acquire(run, create=False)
    assert (run / ".evalparity.lock").is_symlink()
    assert (outside.read_text() == "keep me") if to == "outside" else not outside.exists()


def test_a_stale_lock_of_a_dead_process_is_taken_over(tiny_model, tiny_tasks, tmp_path):
    import platform
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    out = tmp_path / "r"
    out.mkdir()
    (out / ".evalparity.lock").write_text(json.dumps({"host": platform.node(), "pid": dead.pid,
                                                      "started": "2025-01-01T00:00:00", "argv": ["run"]}))
    proc = evalparity(*_tiny_args(str(tiny_model), tiny_tasks, out))  # refused later (one cell): lock taken first
    assert "took over a stale lock" in proc.stderr and f"pid {dead.pid}" in proc.stderr, proc.stderr
    assert "single cell" in one_line_error(proc)
    assert not (out / ".evalparity.lock").exists()
    record("stale lock of a dead pid on this host", "taken over, with a message")


@pytest.fixture()
def syn_run(tmp_path):
    from synthetic import make_run

    run = make_run(tmp_path / "run", n_tasks=2, cells=["hf-fp32", "vllm-fp32", "vllm-bf16"], docs_per_task=30)
    return run


@pytest.mark.parametrize("victim", ["spec.json", "cells/vllm-fp32/cell.json", "cells/vllm-fp32/samples.parquet"])
def test_report_on_a_truncated_file_is_one_line(syn_run, victim):
    first = evalparity_here("report", str(syn_run), "--no-fail-on-inconclusive")
    assert first.returncode in (0, 3), first.stderr[-2000:]
    f = syn_run / victim
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    before = snapshot(syn_run)
    proc = evalparity_here("report", str(syn_run))
    line = one_line_error(proc)
    says = "not the table its cell wrote" if victim.endswith(".parquet") else "truncated or corrupt"  # its seal
    assert proc.returncode == 2 and says in line and victim.split("/")[-1] in line, line
    assert snapshot(syn_run) == before  # the earlier report is left whole
    record(f"report with a truncated {victim.split('/')[-1]}", "exit 2, one line naming it; old report kept")


def _mount_tmpfs(path: Path, size_kb: int) -> bool:
    import subprocess

    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def _umount(path: Path) -> None:
    import subprocess

    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_report_on_a_read_only_run_dir(tmp_path):
    import shutil
    import subprocess

    from synthetic import make_run

    mnt = tmp_path / "ro"
    if not _mount_tmpfs(mnt, 20_000):
        pytest.skip("needs root to mount a tmpfs (chmod does not stop root)")
    try:
        run = make_run(mnt / "run", n_tasks=1, cells=["hf-fp32", "vllm-fp32"], docs_per_task=20)
        assert subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True).returncode == 0
        proc = evalparity("report", str(run))
        line = one_line_error(proc)
        assert proc.returncode == 2 and "read-only filesystem" in line and "cp -r" in line, line
        record("report on a read-only run dir", "exit 2, one line: copy it somewhere writable")
        out = evalparity("compare", str(tmp_path), str(tmp_path), "--out", str(mnt / "new"))
        line = one_line_error(out)
        assert out.returncode == 2 and "read-only filesystem" in line, line
        record("--out on a read-only filesystem", "exit 2, one line")
    finally:
        _umount(mnt)
        shutil.rmtree(mnt, ignore_errors=True)


def test_out_that_is_a_file(tiny_model, tiny_tasks, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    for args in (_tiny_args(str(tiny_model), tiny_tasks, f, "--dtypes", "fp32,bf16"),
                 ["compare", str(tmp_path), str(tmp_path), "--out", str(f / "sub")]):
        proc = evalparity(*args)
        line = one_line_error(proc)
        assert proc.returncode == 2 and "file" in line and "give --out a directory" in line, line
    assert f.read_text() == "x"
    record("--out that is a file (or below one)", "exit 2, one line")


def test_report_on_a_full_disk_publishes_nothing(tmp_path):
    import shutil

    from synthetic import make_run

    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, 1200):
        pytest.skip("needs root to mount a small tmpfs")
    try:
        run = make_run(mnt / "run", n_tasks=2, cells=["hf-fp32", "vllm-fp32"], docs_per_task=40)
        first = evalparity("report", str(run), "--no-fail-on-inconclusive")
        assert first.returncode in (0, 3), first.stderr[-2000:]
        before = snapshot(run)
        filler = mnt / "filler"
        free = shutil.disk_usage(mnt).free
        filler.write_bytes(bytes(max(0, free - 150_000)))  # room for part of a report, not all of it
        proc = evalparity("report", str(run), "--margin", "0.02")
        line = one_line_error(proc)
        assert proc.returncode == 2 and "could not write" in line and "No space left" in line, line
        assert snapshot(run) == before  # report.md, report.html and verdicts.json all still the old ones
        assert not [p for p in run.iterdir() if p.name.startswith(".")]
        record("ENOSPC during report", "exit 2, one line; previous stats/ and report/ unchanged")
    finally:
        _umount(mnt)
        shutil.rmtree(mnt, ignore_errors=True)


def test_every_failed_attempt_keeps_its_reason_and_log(crashed_cell, tiny_model, tiny_tasks, tmp_path):
    import shutil

    out = tmp_path / "r"
    # conftest.crash_args: a real crash in the cell. Attempt 1 is the session's crashed run (test_run_tiny
    # reads it too), attempt 2 this test's rerun of a copy of it.
    shutil.copytree(crashed_cell[0], out, symlinks=True)
    attempts = (crashed_cell[1], evalparity(*crash_args(tiny_model, tiny_tasks, out)))
    for n, proc in enumerate(attempts, 1):
        assert proc.returncode == 5, proc.stderr[-2000:]
        assert f"hf-fp32 attempt {n}:" in proc.stderr and f"attempts/cells/hf-fp32/attempt-{n}.log" in proc.stderr
    hist = out / "attempts" / "cells" / "hf-fp32"
    for n in (1, 2):
        assert "Traceback" in (hist / f"attempt-{n}.log").read_text()
        assert json.loads((hist / f"attempt-{n}.json").read_text())["error"]
    assert json.loads((out / "cells" / "hf-fp32" / "cell.json").read_text())["status"] == "failed"
    record("a cell failing twice", "exit 5; attempt-1 and attempt-2 logs and reasons kept and printed")


# ---------------------------------------------------------------- metric values written as strings
@pytest.fixture(scope="module")
def text_dirs(tmp_path_factory) -> dict[str, Path]:
    """The issue's case: a real drop of 11 of 100 docs, with the per-sample values written as numbers or as
    strings ("1.0"), and one whose field mixes numbers with a non-numeric string on doc 7."""
    root = tmp_path_factory.mktemp("text")
    return {"ref": make_lm_eval_dir(root / "ref", n_docs=100),
            "ref_text": make_lm_eval_dir(root / "ref_text", n_docs=100, as_text=True),
            "new_text": make_lm_eval_dir(root / "new_text", dtype="bfloat16", n_docs=100, flip=11, seed=1,
                                         as_text=True),
            "new_mixed": make_lm_eval_dir(root / "new_mixed", dtype="bfloat16", n_docs=100, flip=11, seed=1,
                                          bad={7: "n/a"})}


@pytest.mark.parametrize("ref,new", [("ref", "new_text"), ("ref_text", "new_text"), ("new_text", "ref")])
def test_metric_values_written_as_strings_are_read(text_dirs, tmp_path, ref, new):
    out = tmp_path / "o"
    proc = evalparity("compare", str(text_dirs[ref]), str(text_dirs[new]), "--out", str(out))
    assert proc.returncode == 3 and proc.stdout.startswith("FAIL"), proc.stdout + proc.stderr[-2000:]
    verdicts = json.loads((out / "stats" / "verdicts.json").read_text())
    assert "Traceback" not in proc.stderr and "RuntimeWarning" not in proc.stderr
    assert json.dumps(verdicts).count('"acc"') >= 1
    record(f"compare, acc as strings ({ref} vs {new}), -11 pp", "exit 3 FAIL, as with numbers (was: no comparison)")


def test_a_field_mixing_numbers_and_text_is_refused(text_dirs, tmp_path):
    out = tmp_path / "o"
    proc = evalparity_here("compare", str(text_dirs["ref"]), str(text_dirs["new_mixed"]), "--out", str(out))
    line = one_line_error(proc)
    jsonl = next((text_dirs["new_mixed"] / "model__x").glob("samples_*.jsonl"))
    assert proc.returncode == 2 and str(jsonl) in line and "'acc'" in line and ":8 " in line, line
    assert "'n/a'" in line, line
    assert not out.exists()
    record("compare, a metric field mixing numbers and 'n/a'", "exit 2, one line: file, field, first bad line")


# ---------------------------------------------------------------- corrupted (not just truncated) files
@pytest.fixture(scope="module")
def reported_run(tmp_path_factory) -> Path:
    """A synthetic run with its report written once; each case corrupts a copy of it."""
    from synthetic import make_run

    run = make_run(tmp_path_factory.mktemp("reported") / "run", n_tasks=2, cells=["hf-fp32", "vllm-fp32"],
                   docs_per_task=20)
    first = evalparity_here("report", str(run), "--no-fail-on-inconclusive")
    assert first.returncode in (0, 3), first.stderr[-2000:]
    return run


def _random_bytes(n: int = 4096) -> bytes:
    import random

    return random.Random(18).randbytes(n)


def _other_parquet() -> bytes:
    import io

    import pandas as pd

    buf = io.BytesIO()
    pd.DataFrame({"x": [1, 2], "y": ["a", "b"]}).to_parquet(buf, index=False)
    return buf.getvalue()


CORRUPT = {
    "cell.json: a list": ("cells/vllm-fp32/cell.json", b"[1, 2]", "not an object"),
    "cell.json: status missing": ("cells/vllm-fp32/cell.json", b'{"cell": "vllm-fp32", "backend": "vllm"}',
                                  "'status'"),
    "cell.json: status a number": ("cells/vllm-fp32/cell.json", b'{"cell": "vllm-fp32", "status": 1}', "'status'"),
    "cell.json: another cell's": ("cells/vllm-fp32/cell.json", b'{"cell": "hf-fp32", "status": "ok"}',
                                  "record of cell 'hf-fp32'"),
    "cell.json: settings a string": ("cells/vllm-fp32/cell.json",
                                     b'{"cell": "vllm-fp32", "status": "ok", "settings": "x"}', "'settings'"),
    "samples.parquet: random bytes": ("cells/vllm-fp32/samples.parquet", _random_bytes(),
                                      "not the table its cell wrote"),
    "samples.parquet: another table": ("cells/vllm-fp32/samples.parquet", _other_parquet(),
                                       "not the table its cell wrote"),
    "spec.json: random bytes": ("spec.json", _random_bytes(), "truncated or corrupt"),
    "spec.json: a list": ("spec.json", b"[]", "not an object"),
    "spec.json: cells a string": ("spec.json", b'{"model": "m", "cells": "hf-fp32"}', "'cells'"),
    "spec.json: a cell named ../x": ("spec.json", b'{"model": "m", "cells": [{"name": "../x"}]}', "not a safe name"),
    "spec.json: tasks a number": ("spec.json", b'{"model": "m", "tasks": 5, "cells": []}', "'tasks'"),
}


CORRUPT_BY_CLI = ("cell.json: a list", "samples.parquet: random bytes", "samples.parquet: another table",
                  "spec.json: a list")  # the rest are checked in-process (the same check, a second less each)


@pytest.mark.parametrize("case", list(CORRUPT))
def test_report_on_a_corrupt_file_is_one_line(reported_run, tmp_path, case):
    import shutil

    from evalparity import cells
    from evalparity.errors import EvalParityError

    victim, data, says = CORRUPT[case]
    run = tmp_path / "run"
    shutil.copytree(reported_run, run, symlinks=True)
    (run / victim).write_bytes(data)
    before = snapshot(run)
    if case in CORRUPT_BY_CLI:
        proc = evalparity_here("report", str(run))
        line = one_line_error(proc)
        assert proc.returncode == 2, line
    else:
        with pytest.raises(EvalParityError) as err:
            cells.check_readable(run)  # what `report` (and `run`, `compare`) check before any statistics
        line = str(err.value)
    assert str(run / victim) in line and says in line, line
    assert snapshot(run) == before  # the earlier report is left whole
    record(f"report, {case}", "exit 2, one line naming the file; old report kept")


def test_a_corrupt_compare_json(lm_dirs, tmp_path):
    from evalparity import cells, importer
    from evalparity.errors import EvalParityError

    a, b = lm_dirs
    out = tmp_path / "o"
    first = evalparity_here("compare", str(a), str(b), "--out", str(out), "--no-fail-on-inconclusive")
    assert first.returncode in (0, 3), first.stderr[-2000:]
    for i, data in enumerate((b'{"inputs": 5, "names": 7}', _random_bytes(), b'{"inputs": ["/x"], "names": "ab"}',
                              b'{"inputs": ["/x"]}')):
        (out / "compare.json").write_bytes(data)
        before = snapshot(out)
        if i == 0:
            again = evalparity_here("compare", str(a), str(b), "--out", str(out))
            line = one_line_error(again)
            assert again.returncode == 2 and str(out / "compare.json") in line, line
            rep = evalparity_here("report", str(out))
            line = one_line_error(rep)
            assert rep.returncode == 2 and str(out / "compare.json") in line, line
        for check in (lambda: importer.claim_out(out, [a, b], ["hf-fp32", "hf-bf16"]),
                      lambda: cells.check_readable(out)):
            with pytest.raises(EvalParityError, match="compare.json"):
                check()
        assert snapshot(out) == before
    record("compare / report with a corrupt compare.json", "exit 2, one line naming it; nothing changed")


def test_a_corrupt_fingerprint_cache_is_rebuilt(tiny_model, tmp_path, monkeypatch):
    """The fingerprint cache only saves time: garbage, another shape, wrong-typed entries or a folder in
    its place are ignored (the files are hashed again), never an error; a writable cache is rewritten."""
    import time

    from evalparity import config, files, rundir

    monkeypatch.setenv("EVALPARITY_CACHE", str(tmp_path / "cache"))
    time.sleep(files.RACY_NS / 1e9 + 0.05)  # a file changed just before is not cached (files.HashCache)
    good = rundir.model_fingerprint(tiny_model, str(tiny_model))
    cache = config.fingerprint_cache()
    key = next(iter(json.loads(cache.read_text())))
    for data in (_random_bytes(), b"[1, 2]", json.dumps({key: {"stamp": "x", "sha256": 5}}).encode(),
                 json.dumps({key: [1, 2]}).encode(), json.dumps({key: {"stamp": None}}).encode()):
        cache.write_bytes(data)
        stats = rundir.HashStats()
        assert rundir.model_fingerprint(tiny_model, str(tiny_model), stats=stats) == good
        assert stats.hashed_bytes > 0 and isinstance(json.loads(cache.read_text())[key], dict)
    cache.unlink()
    cache.mkdir()  # a folder where the file should be: hashed, and not cached
    assert rundir.model_fingerprint(tiny_model, str(tiny_model)) == good and cache.is_dir()
    record("fingerprint cache corrupt / another shape / a folder", "ignored and rebuilt, same fingerprint")


def test_a_corrupt_lock_file(lm_dirs, tmp_path):
    import platform
    import time

    a, b = lm_dirs
    out = tmp_path / "o"
    out.mkdir()
    path = out / ".evalparity.lock"
    for data in (_random_bytes(64), b"[1]", json.dumps({"host": platform.node(), "pid": "x"}).encode()):
        path.write_bytes(data)
        proc = evalparity_here("compare", str(a), str(b), "--out", str(out), "--no-fail-on-inconclusive")
        line = one_line_error(proc)
        assert proc.returncode == 2 and str(path) in line and "remove it" in line, line
        assert path.read_bytes() == data and [p.name for p in out.iterdir()] == [path.name]
    old = time.time() - 3600
    os.utime(path, (old, old))  # a corrupt lock an hour old: taken over
    proc = evalparity_here("compare", str(a), str(b), "--out", str(out), "--no-fail-on-inconclusive")
    assert proc.returncode in (0, 3), proc.stderr[-2000:]
    assert "took over a corrupt lock" in proc.stderr and not path.exists()
    record("lock file corrupt (garbage, a list, pid not a number)",
           "exit 2, one line naming it; an hour old: taken over")


def test_run_resuming_a_corrupt_spec_is_refused_before_any_model_loads(reported_run, tiny_tasks, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(reported_run, run, symlinks=True)
    (run / "spec.json").write_text('{"model": "m", "cells": [{"name": "../x"}]}')
    before = snapshot(run)
    proc = evalparity(*_tiny_args(str(tmp_path / "no-model-needed"), tiny_tasks, run, "--dtypes", "fp32,bf16"))
    line = one_line_error(proc)
    assert proc.returncode == 2 and str(run / "spec.json") in line and "not a safe name" in line, line
    assert snapshot(run) == before
    record("run resuming a dir whose spec.json has another shape", "exit 2, one line, before any model loads")


# ---------------------------------------------------------------- no NumPy RuntimeWarning on the terminal
def _degenerate_run(root: Path, *, infinite: bool) -> Path:
    """Three single-document tasks of one group (n = 1 per task and per cluster): acc NaN on both sides in
    one task, a continuous metric that never varies, loglikelihoods NaN on both sides for one doc; with
    ``infinite``, loglikelihoods and the continuous metric are -inf/inf on both sides instead."""
    import numpy as np
    from synthetic import make_run, reseal

    from evalparity.samples import read_table, write_table

    run = make_run(root, n_tasks=3, cells=["hf-fp32", "vllm-fp32"], docs_per_task=1)
    for d in (run / "cells").iterdir():
        t = read_table(d / "samples.parquet")
        t["m:perplexity"] = np.inf if infinite else 3.5
        t.loc[t["task"] == "mmlu_subject_01", "m:acc"] = np.nan
        t.loc[t["task"] == "mmlu_subject_02", "loglikelihood"] = -np.inf if infinite else np.nan
        write_table(t, d / "samples.parquet")
    reseal(run)  # cells that wrote these values, not tables edited afterwards
    return run


def test_degenerate_inputs_print_no_runtime_warning(tmp_path):
    run = _degenerate_run(tmp_path / "run", infinite=False)
    proc = evalparity("report", str(run), "--margin", "acc=1pp,perplexity=0.05", "--cluster", "--gate-logprobs",
                      "--no-fail-on-inconclusive")
    assert proc.returncode in (0, 3, 4), proc.stderr[-2000:]
    assert "Warning" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    record("report: single-doc tasks, n=1 groups, all-NaN, zero variance", "no RuntimeWarning on the terminal")


def test_infinite_values_print_no_runtime_warning(tmp_path):
    run = _degenerate_run(tmp_path / "run", infinite=True)
    proc = evalparity("report", str(run), "--margin", "acc=1pp,perplexity=0.05", "--no-fail-on-inconclusive")
    assert proc.returncode in (0, 3, 4), proc.stderr[-2000:]
    assert "RuntimeWarning" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------- SIGKILL at several points
KILL = "EVALPARITY_TEST_KILL_AT"  # the test hook (config.kill_point)


def _margin_of(run: Path) -> dict[str, float | None]:
    """The margin each of verdicts.json, report.md and report.html was written at (None: file absent)."""
    import re

    out: dict[str, float | None] = {}
    v = run / "stats" / "verdicts.json"
    out["verdicts.json"] = json.loads(v.read_text())["options"]["margin"] if v.exists() else None
    for name in ("report.md", "report.html"):
        p = run / "report" / name
        m = re.search(r"±(\d+(?:\.\d+)?) percentage points", p.read_text()) if p.exists() else None
        out[name] = float(m.group(1)) / 100 if m else None
    return out


def _leftovers(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob(".*") if p.name.startswith((".tmp-", ".trash-")))


@pytest.mark.parametrize("point", ["write:deltas.parquet", "write:report.html", "publish-outputs"])
def test_report_killed_midway_leaves_the_previous_or_the_new_one_whole(reported_run, tmp_path, point):
    """SIGKILL during the statistics, during the report, and between the two renames that publish them."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(reported_run, run, symlinks=True)
    assert set(_margin_of(run).values()) == {0.01}
    before = {k: v for k, v in snapshot(run).items() if k.startswith(("stats/", "report/"))}
    proc = evalparity("report", str(run), "--margin", "2pp", env={KILL: point})
    assert proc.returncode == -9, proc.stderr[-2000:]
    seen = {m for m in _margin_of(run).values() if m is not None}
    assert len(seen) == 1, _margin_of(run)  # never an old file beside a new one
    if point != "publish-outputs":
        assert {k: v for k, v in snapshot(run).items() if k.startswith(("stats/", "report/"))} == before
    else:  # killed between the renames: the next command on the run finishes the publish it began
        from evalparity import rundir

        with rundir.acquire(run, create=False):  # takes over the killed one's stale lock, and its staging folder
            rundir.recover_outputs(run)
        assert set(_margin_of(run).values()) == {0.02} and not _leftovers(run)
    again = evalparity_here("report", str(run), "--margin", "3pp", "--no-fail-on-inconclusive")
    assert again.returncode in (0, 3, 4), again.stderr[-2000:]
    assert set(_margin_of(run).values()) == {0.03} and not _leftovers(run), _leftovers(run)
    where = {"write:deltas.parquet": "statistics", "write:report.html": "report", "publish-outputs": "publish"}
    record(f"SIGKILL of report during its {where[point]}",
           ("previous report whole" if point != "publish-outputs" else "new report whole after the next command")
           + "; rerun completes, nothing left behind")


def test_compare_killed_while_publishing_a_cell(lm_dirs, tmp_path):
    """Three inputs, killed while the third cell is swapped in: a report must not go on with two."""
    a, b = lm_dirs
    c = make_lm_eval_dir(tmp_path / "c", dtype="float16", flip=12, seed=2)  # the cell that FAILs
    out = tmp_path / "o"
    args = ("compare", str(a), str(b), str(c), "--out", str(out), "--no-fail-on-inconclusive")
    first = evalparity_here(*args)
    assert first.returncode == 3, first.stderr[-2000:]
    proc = evalparity(*args, env={KILL: "publish-cell:hf-fp16"})
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert not (out / "cells" / "hf-fp16").exists()  # its old folder moved aside, the new one not yet in
    rep = evalparity_here("report", str(out))  # a cell of the comparison is missing: never a verdict without it
    line = one_line_error(rep)
    assert rep.returncode == 5 and "hf-fp16" in line and "rerun the same" in line, line
    again = evalparity_here(*args)
    assert again.returncode == 3, again.stderr[-2000:]
    assert sorted(p.name for p in (out / "cells").iterdir()) == ["hf-bf16", "hf-fp16", "hf-fp32"]
    assert not _leftovers(out), _leftovers(out)
    record("SIGKILL of compare while publishing a cell", "report: exit 5, one line naming the missing cell; "
           "rerun completes, nothing left behind")


# ---------------------------------------------------------------- a full disk during a cell
def _wait_for(cond, timeout: float = 120.0, proc=None) -> None:
    import time

    t0 = time.monotonic()
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before the point the test waits for: "
                                 f"{proc.stderr.read()[-3000:] if proc.stderr else ''}")
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.05)


def _phase(progress: Path) -> str | None:
    try:
        return json.loads(progress.read_text()).get("phase")
    except (OSError, ValueError, AttributeError):
        return None


def _fill(path: Path) -> None:
    """Write ``path`` until its filesystem is full."""
    import errno

    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 1 << 12, 1 << 9):
            try:
                while True:
                    f.write(bytes(chunk))
            except OSError as err:
                assert err.errno == errno.ENOSPC, err


def _popen(*args: str, env: dict | None = None):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "evalparity.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})


def test_a_full_disk_during_a_cell_keeps_and_prints_the_reason(tiny_model, tiny_tasks, tmp_path):
    import shutil

    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, 40_000):
        pytest.skip("needs root to mount a small tmpfs")
    try:
        out = mnt / "run"
        proc = _popen(*_tiny_args(str(tiny_model), tiny_tasks, out, "--single-cell"))
        progress = out / "cells" / ".tmp-hf-fp32" / "progress.json"
        _wait_for(lambda: _phase(progress) == "loading model", proc=proc)
        _fill(mnt / "filler")  # the disk is full from the model's load on: the cell cannot write its results
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 5, stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
        assert "No space left on device" in stderr and "hf-fp32" in stderr, stderr[-3000:]
        for line in stderr.splitlines():  # every log it names exists
            if "log: " in line and "none written" not in line:
                named = line.split("log: ", 1)[1].split(")")[0].strip()
                assert (out / named).exists() or Path(named).exists(), line
        assert not (out / "cells" / "hf-fp32" / "samples.parquet").exists()
        meta = json.loads((out / "cells" / "hf-fp32" / "cell.json").read_text()) \
            if (out / "cells" / "hf-fp32" / "cell.json").exists() else {"status": "not recorded"}
        assert meta["status"] != "ok"
        record("ENOSPC during a cell", "exit 5; the reason (No space left on device) printed, even where "
               "cell.json could not be written; no log path that does not exist")
    finally:
        _umount(mnt)
        shutil.rmtree(mnt, ignore_errors=True)


def test_lm_evals_swallowed_save_failure_is_an_error(tmp_path, monkeypatch):
    """lm-eval logs a failure to save its output and goes on: a cell must not go on with fewer samples."""
    import errno
    import shutil
    from collections import namedtuple

    from evalparity import cells

    folder = make_lm_eval_dir(tmp_path / "lm", n_docs=5)
    jsonl = next(folder.rglob("samples_*.jsonl"))
    evaluated = {"syn_mc": [{}] * 6}  # lm-eval evaluated 6 samples, saved 5
    with pytest.raises(RuntimeError, match="5 of the 6 samples of task syn_mc were saved"):
        cells._saved(folder, evaluated)
    jsonl.write_text(jsonl.read_text()[:100])  # cut midway, as a full disk leaves it
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10, 10, 0))
    with pytest.raises(OSError, match="No space left on device: lm-eval could not save") as err:
        cells._saved(folder, evaluated)
    assert err.value.errno == errno.ENOSPC and "0 bytes free" in str(err.value)
    record("lm-eval's own save failing silently (full disk)", "the cell fails, naming the disk; never fewer samples")


# ---------------------------------------------------------------- a real run: concurrent runs, kills, rerun
def _finished_looking(out: Path) -> dict[str, bool]:
    """Each published cell folder: does it look finished (status ok), and is it (its table readable)?"""
    from evalparity import samples

    seen = {}
    for d in sorted((out / "cells").iterdir()):
        if d.name.startswith(".") or not (d / "cell.json").exists():
            continue
        ok = json.loads((d / "cell.json").read_text()).get("status") == "ok"
        if ok:
            samples.check_table(d / "samples.parquet")
        seen[d.name] = ok
    return seen


def test_concurrent_run_kills_and_rerun(tiny_model, tiny_tasks, tmp_path):
    """One real run A of two cells. While its first cell runs, a second run on the same --out is refused,
    naming A, and touches nothing of it. Then A's first cell process is SIGKILLed (recorded as failed), and
    the whole run (its process group) is SIGKILLed during its second cell. A rerun takes the stale lock
    over and completes."""
    import signal

    out = tmp_path / "r"
    args = _tiny_args(str(tiny_model), tiny_tasks, out, "--dtypes", "fp32,bf16")
    a = _popen(*args)
    try:
        tmp1 = out / "cells" / ".tmp-hf-fp32"
        _wait_for(lambda: _phase(tmp1 / "progress.json") is not None, proc=a)
        inode, spec = tmp1.stat().st_ino, (out / "spec.json").read_bytes()
        b = evalparity(*args)
        line = one_line_error(b)
        assert b.returncode == 2 and f"pid {a.pid} " in line and "in use by another evalparity" in line, line
        assert tmp1.stat().st_ino == inode and (out / "spec.json").read_bytes() == spec and a.poll() is None
        record("two real runs on one --out at once", "the second: exit 2, one line naming the first's pid; "
               "the first's cells untouched, and it goes on")
        os.kill(json.loads((tmp1 / "progress.json").read_text())["pid"], signal.SIGKILL)  # the cell process
        tmp2 = out / "cells" / ".tmp-hf-bf16"
        _wait_for(lambda: _phase(tmp2 / "progress.json") is not None, proc=a)
        failed = json.loads((out / "cells" / "hf-fp32" / "cell.json").read_text())
        assert failed["status"] == "failed" and "killed by signal 9" in failed["error"], failed
        record("SIGKILL of a cell process", "recorded as failed (killed by signal 9); the run goes on")
        os.killpg(a.pid, signal.SIGKILL)  # the run itself, during its second cell
        a.wait(timeout=60)
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
            a.wait()
    assert _finished_looking(out) == {"hf-fp32": False}
    assert not (out / "stats").exists() and not (out / "report").exists()
    record("SIGKILL of the run during a cell", "no cell looks finished that is not; no stats or report")
    again = evalparity(*args)
    assert again.returncode in (0, 3, 4), again.stderr[-3000:]
    assert "took over a stale lock" in again.stderr and f"pid {a.pid}" in again.stderr
    assert _finished_looking(out) == {"hf-bf16": True, "hf-fp32": True}
    assert (out / "report" / "report.html").exists() and (out / "stats" / "verdicts.json").exists()
    assert not _leftovers(out) and not (out / ".evalparity.lock").exists(), _leftovers(out)
    hist = json.loads((out / "attempts" / "cells" / "hf-fp32" / "attempt-1.json").read_text())
    assert "killed by signal 9" in hist["error"]
    record("rerun after those kills", "stale lock taken over; both cells finished; report whole")


def test_an_old_attempt_history_in_cells_is_moved_not_taken_for_a_cell(reported_run, tmp_path):
    """An earlier evalparity kept attempts as cells/<cell>.attempts, which the statistics take for a cell
    that never finished: every later report of the run was INCOMPLETE. They move to attempts/cells/."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(reported_run, run, symlinks=True)
    old = run / "cells" / "vllm-fp32.attempts"
    old.mkdir()
    (old / "attempt-1.json").write_text(json.dumps({"attempt": 1, "error": "boom", "log": None}))
    proc = evalparity_here("report", str(run), "--no-fail-on-inconclusive")
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr[-2000:]
    assert "INCOMPLETE" not in proc.stdout and not old.exists()
    assert json.loads((run / "attempts" / "cells" / "vllm-fp32" / "attempt-1.json").read_text())["error"] == "boom"
    record("attempt history of an older evalparity in cells/", "moved to attempts/cells/; not taken for a cell")
