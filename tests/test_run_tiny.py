"""End to end on a tiny random Llama: both backends, fp32 and bf16, a multiple-choice and a generation task.

One run is shared by the tests of this module (about 90 s on 2 CPU cores); each test reads what it wrote.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import ahead
import pandas as pd
import pytest
from conftest import (
    TINY_CELLS,
    cli,
    evalparity,
    evalparity_here,
    one_line_error,
    sigint_as_on_a_terminal,
    tiny_run_args,
)
from verdict_schema import check_verdicts

from evalparity.samples import HASHES, KEY, check_alignment, read_table

CELLS = TINY_CELLS


@pytest.fixture(scope="module")
def run_dir(tiny_run):
    return tiny_run


def test_every_cell_finished_with_its_files(run_dir):
    out, proc = run_dir
    for name in CELLS:
        cell = out / "cells" / name
        meta = json.loads((cell / "cell.json").read_text())
        assert meta["status"] == "ok", meta
        for f in ("samples.parquet", "cell.log", "lm_eval_results.json"):
            assert (cell / f).exists(), f
        assert list((cell / "lm_eval").rglob("samples_tiny_mc_*.jsonl"))
        assert meta["load_s"] > 0 and meta["eval_s"] > 0 and meta["peak_rss_gib"] > 0
        cpu = meta["eval_cpu"]  # CPU time of the evaluation phase: on CPU, the model's own threads' work
        assert cpu["user_s"] > 0 and cpu["sys_s"] >= 0 and cpu["voluntary_switches"] >= 0
        assert 0 <= cpu["gc_full_s"] <= cpu["gc_s"] <= meta["eval_s"] and cpu["gc_full_passes"] >= 0
        phases = meta["phases"]  # evalparity/phases.py: the evaluation's phases add up to its wall time
        assert phases["load_s"] == meta["load_s"] and phases["write_s"] == meta["write_s"]
        inner = phases["requests_s"] + phases["tokenize_s"] + phases["engine_s"] + phases["postprocess_s"]
        assert inner == pytest.approx(meta["eval_s"], abs=0.05) and min(phases.values()) >= 0
        assert phases["engine_s"] > 0 and phases["tokenize_s"] > 0  # tiny_mc is scored by loglikelihood
        assert meta["settings"]["batched_tokenization"] is True  # test_pretokenize.py
        if meta["backend"] == "vllm":  # scored with flat prompt logprobs (test_vllm_scoring.py)
            assert meta["settings"]["flat_logprobs"] is True
        else:  # scores read back once per batch, checked against lm-eval's own loop (test_hf_scoring.py)
            assert meta["settings"]["deferred_scoring"] is True
        assert meta["versions"]["lm_eval"] and meta["versions"]["vllm"] != "not installed"
    assert not list((out / "cells").glob(".tmp-*"))


def test_run_json_says_where_the_time_went(run_dir):
    out, _ = run_dir
    log = json.loads((out / "run.json").read_text())
    stages = log["stages_s"]
    assert list(stages) == ["setup", "executor_start", "cells", "statistics", "report"]
    assert log["executor"] == "local" and log["jobs"] == len(CELLS) + 2  # and hf-fp32-dp2, as two shard jobs
    assert all(v >= 0 for v in stages.values()) and stages["cells"] > stages["executor_start"]
    assert 0 <= log["outside_stages_s"] < log["total_s"]


def test_engine_logs_stay_off_the_terminal(run_dir):
    out, proc = run_dir
    assert "INFO" not in proc.stderr and "Loading weights" not in proc.stderr
    log = (out / "cells" / "vllm-fp32" / "cell.log").read_text()
    assert "vllm" in log.lower()


def test_confounds_are_aligned_and_recorded(run_dir):
    out, _ = run_dir
    hf = json.loads((out / "cells" / "hf-bf16" / "cell.json").read_text())
    vl = json.loads((out / "cells" / "vllm-bf16" / "cell.json").read_text())
    assert hf["model_args"]["softmax_dtype"] == "float32"
    assert vl["model_args"]["enable_prefix_caching"] is False
    assert hf["model_args"]["max_length"] == vl["model_args"]["max_model_len"] == 512
    assert hf["settings"]["add_bos_token"] == vl["settings"]["add_bos_token"]
    assert "request_cache" in hf["settings"] and hf["settings"]["seeds"]["random"] == 1234
    fp32 = json.loads((out / "cells" / "hf-fp32" / "cell.json").read_text())
    assert fp32["precision"]["float32_matmul_precision"] == "highest"
    assert fp32["precision"]["triton_f32_default"] == "ieee"


def test_per_sample_tables_are_aligned_and_shaped(run_dir):
    out, _ = run_dir
    tables = {c: read_table(out / "cells" / c / "samples.parquet") for c in CELLS}
    check_alignment(tables)
    t = tables["hf-fp32"]
    mc = t[t["task"] == "tiny_mc"]
    assert len(mc) == 40 and set(mc["choice"]) == {0, 1, 2, 3}  # 10 docs x 4 choices
    assert mc["loglikelihood"].notna().all() and mc["gold"].notna().all()
    assert {"m:acc", "m:acc_norm"} <= set(t.columns)
    gen = t[t["task"] == "tiny_gen"]
    assert len(gen) == 10 and gen["generated_ids"].map(lambda x: x is not None and len(x) > 0).all()
    for h in HASHES:
        assert t[h].str.len().min() > 0
    assert not t.duplicated(KEY).any()


def test_fp32_backends_agree_to_roundoff_and_bf16_drifts_more(run_dir):
    out, _ = run_dir
    def ll(c):
        t = read_table(out / "cells" / c / "samples.parquet")
        return t[t["task"] == "tiny_mc"].set_index(["doc_id", "choice"])["loglikelihood"]
    d32 = (ll("vllm-fp32") - ll("hf-fp32")).abs()
    d16 = (ll("vllm-bf16") - ll("hf-fp32")).abs()
    assert d32.max() < 1e-3, d32.max()
    assert d16.mean() > 10 * d32.mean()


def test_stats_and_report_written(run_dir):
    out, proc = run_dir
    v = check_verdicts(out / "stats" / "verdicts.json")  # the shipped JSON Schema, and its own counts
    assert v["schema"] == "evalparity.verdicts/4"
    assert v["sign_off"]["status"] in ("PASS", "FAIL", "INCONCLUSIVE")
    assert proc.returncode == v["sign_off"]["exit_code"]
    cells = {r["cell"] for r in v["comparisons"]}
    assert cells == {"vllm-fp32", "vllm-bf16", "hf-bf16", "hf-fp32-dp2"}
    for r in v["comparisons"]:
        if r["kind"] == "noise_floor":  # the yardstick: no verdict of its own
            assert r["verdict"] == "" and r["reason"]
        else:
            assert r["verdict"] in ("EQUIVALENT", "DIFFERENT", "SHIFT", "INCONCLUSIVE", "NO MARGIN") and r["reason"]
            assert r["ci_level"] in (0.9, pytest.approx(0.9)) or r["verdict"] == "DIFFERENT"
        assert r["n"] == 10 or r["metric"] == "loglikelihood"
    for f in ("report.md", "report.html"):
        assert (out / "report" / f).stat().st_size > 1000
    assert list((out / "report" / "figures").glob("*.png"))
    env = json.loads((out / "cells" / "vllm-fp32" / "cell.json").read_text())["environment"]  # hostenv, per cell
    assert env["cpu_cores"] == str(os.cpu_count()) and env["triton"] and env["python"]
    assert env["$VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["$TOKENIZERS_PARALLELISM"] == "false"  # as set
    assert "| environment |" in (out / "report" / "report.md").read_text()
    gens = pd.read_parquet(out / "stats" / "generations.parquet")
    assert set(gens["cell"]) == {"vllm-fp32", "vllm-bf16", "hf-bf16", "hf-fp32-dp2"}
    assert gens["n_without_ids"].eq(0).all()


def test_rerun_skips_every_cell(run_dir, tiny_model, tiny_tasks):
    out, _ = run_dir
    before = {c: (out / "cells" / c / "cell.json").stat().st_mtime for c in CELLS}
    t0 = time.perf_counter()
    proc = evalparity(*tiny_run_args(tiny_model, tiny_tasks, out))
    took = time.perf_counter() - t0
    assert proc.returncode in (0, 3, 4), proc.stderr[-2000:]
    assert "5 cell(s) already done, skipped" in proc.stderr
    assert {c: (out / "cells" / c / "cell.json").stat().st_mtime for c in CELLS} == before
    print(f"rerun with every cell skipped took {took:.1f} s")


def test_a_shard_edited_before_its_cell_was_merged_is_refused_on_resume(run_dir, tiny_model, tiny_tasks, tmp_path):
    """A run killed after its shards finished and before they were merged: the resume merges them. A shard's
    table edited meanwhile was merged and sealed as the cell's (until session 33), and signed off; now each
    shard is verified as a part of its cell first (``records.verify_part``), and the resume refused in one
    line naming it, with nothing merged."""
    import shutil

    out = tmp_path / "r"
    shutil.copytree(run_dir[0], out, symlinks=True)
    shutil.rmtree(out / "cells" / "hf-fp32-dp2")
    shard = out / "shards" / "hf-fp32-dp2.0of2" / "samples.parquet"
    table = read_table(shard)
    row = table["loglikelihood"].notna().idxmax()  # a multiple-choice row (a generation's is NaN: no edit)
    table.loc[row, "loglikelihood"] += 1.0
    table.to_parquet(shard, index=False)
    proc = evalparity(*tiny_run_args(tiny_model, tiny_tasks, out))
    said = one_line_error(proc)
    assert proc.returncode == 2 and "hf-fp32-dp2.0of2" in said and "not the table its cell wrote" in said, said
    assert not (out / "cells" / "hf-fp32-dp2").exists()


def test_report_regenerates_alone(run_dir):
    out, _ = run_dir
    (out / "report" / "report.md").unlink()
    proc = evalparity_here("report", str(out), "--no-fail-on-inconclusive")
    assert proc.returncode in (0, 3), proc.stderr
    assert (out / "report" / "report.md").exists()


def test_a_crashing_cell_is_recorded(crashed_cell):
    # conftest.crash_args: a real crash in the cell (HF loads an encoder-decoder class for a Llama config).
    # (That the other cells are kept when one fails is test_ray's killed-worker test.)
    out, proc = crashed_cell
    assert proc.returncode == 5, proc.stderr[-2000:]
    for c in ("hf-fp32",):
        meta = json.loads((out / "cells" / c / "cell.json").read_text())
        assert meta["status"] == "failed" and meta["error"]
        assert "Traceback" in (out / "cells" / c / "cell.log").read_text()


@ahead.job("killed_and_resumed")
def _killed_and_resumed(ctx: ahead.Context):
    """A two-cell run SIGKILLed (its whole process group) once its first cell has started, then the same
    command again (started ahead: tests/ahead.py): (its folder, whether hf-fp32 looked finished right after
    the kill, the rerun)."""
    out = ctx.mktemp("killed") / "killed"
    args = cli("run", "--model", str(ctx.fixture("tiny_model")), "--tasks", "tiny_mc", "--include-path",
               str(ctx.fixture("tiny_tasks")), "--backends", "hf", "--dtypes", "fp32,bf16", "--limit", "4", "--out",
               str(out), "--no-fail-on-inconclusive")

    def work():
        proc = ctx.popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 300
        while time.time() < deadline and not (out / "cells" / ".tmp-hf-fp32" / "cell.log").exists():
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        looked_finished = (out / "cells" / "hf-fp32" / "cell.json").exists()
        return out, looked_finished, ctx.run(args)
    return work


@pytest.fixture
def killed_and_resumed(request):
    return ahead.take("killed_and_resumed", request)


def test_killed_run_leaves_no_finished_looking_cell_and_resumes(killed_and_resumed):
    out, looked_finished, done = killed_and_resumed
    assert not looked_finished
    assert done.returncode == 0, done.stderr[-2000:]
    for c in ("hf-fp32", "hf-bf16"):
        assert json.loads((out / "cells" / c / "cell.json").read_text())["status"] == "ok"
    assert not list((out / "cells").glob(".tmp-*"))  # the stale temp dir was replaced by the rerun
    assert math.isfinite(json.loads((out / "stats" / "verdicts.json").read_text())["comparisons"][0]["n"])


def test_ctrl_c_says_how_to_resume_and_records_its_timings(tiny_model, tiny_tasks, tmp_path):
    out = tmp_path / "interrupted"
    args = [sys.executable, "-m", "evalparity.cli", "run", "--model", str(tiny_model), "--tasks", "tiny_mc",
            "--include-path", str(tiny_tasks), "--backends", "hf", "--dtypes", "fp32", "--limit", "4", "--single-cell",
            "--out", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=sigint_as_on_a_terminal)
    deadline = time.time() + 300
    while time.time() < deadline and not (out / "cells" / ".tmp-hf-fp32" / "cell.log").exists():
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C: the whole foreground group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "rerun the same command" in err and "Traceback" not in err
    assert "cells" in json.loads((out / "run.json").read_text())["stages_s"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_stops_a_run_as_ctrl_c_does(tiny_model, tiny_tasks, tmp_path, sig):
    """How CI stops a job (a time limit or a cancel: SIGTERM), `timeout`, a closed terminal (SIGHUP): the
    run says in one line that it was stopped and how to resume, records its timings, releases its lock,
    leaves no cell running, and exits with the shell's code for the signal. Ended by the signal's default
    action, it had left none of that (a 14B run stopped by `timeout` on an H200 wrote no run.json)."""
    import psutil

    from evalparity.config import LOCK_NAME

    out = tmp_path / "stopped"
    args = [sys.executable, "-m", "evalparity.cli", "run", "--model", str(tiny_model), "--tasks", "tiny_mc",
            "--include-path", str(tiny_tasks), "--backends", "hf", "--dtypes", "fp32", "--limit", "4", "--single-cell",
            "--out", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=sigint_as_on_a_terminal)  # SIGHUP at its default under nohup too
    deadline = time.time() + 300
    while time.time() < deadline and not (out / "cells" / ".tmp-hf-fp32" / "cell.log").exists():
        time.sleep(0.2)
    everyone = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    assert everyone, "the cell's process had not started"
    os.kill(proc.pid, sig)  # the command's own process only, as `kill PID` or a job runner sends it
    _, err = proc.communicate(timeout=120)
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, err[-2000:]
    assert [line for line in err.splitlines() if "stopped by" in line] == [
        f"stopped by {name} before the sign-off: finished cells are kept; rerun the same command to resume"]
    assert "Traceback" not in err
    assert "cells" in json.loads((out / "run.json").read_text())["stages_s"]
    assert not (out / LOCK_NAME).exists()
    assert not [p for p in everyone if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
