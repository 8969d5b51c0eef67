"""Orchestration overhead: one evalparity cell against a plain ``lm_eval.simple_evaluate`` of the same cell.

Prints, for each backend, the wall time of ``evalparity run`` for a one-cell matrix (process start, preflight,
model load, evaluation, writing the table, statistics-free) next to the wall time of a plain
``simple_evaluate`` in a fresh process with the same model arguments.

    python benchmarks/overhead.py --model PATH --tasks hellaswag --datasets-dir ../shared/data --limit 20
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAIN = r"""
import json, sys, time
t0 = time.perf_counter()
from evalparity.backends import compat; compat.apply()
from evalparity.data import mirrors
import lm_eval
from lm_eval.tasks import TaskManager
args = json.loads(sys.argv[1])
mirrors.activate(mirrors.mirror_roots(args.pop("_datasets_dir")))
tasks, limit, backend = args.pop("_tasks"), args.pop("_limit"), args.pop("_backend")
tm = TaskManager()
t1 = time.perf_counter()
r = lm_eval.simple_evaluate(model=backend, model_args=args, tasks=tasks, limit=limit, task_manager=tm,
                            log_samples=True, bootstrap_iters=0)
print(json.dumps({"wall": time.perf_counter() - t0, "simple_evaluate": time.perf_counter() - t1}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tasks", default="hellaswag")
    ap.add_argument("--datasets-dir", default=None)
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--backends", default="hf,vllm")
    a = ap.parse_args()
    from evalparity import backends
    from evalparity.models import _cap
    from evalparity.spec import Alignment, CellSpec, RunSpec, parse_dtype

    max_len = _cap(Path(a.model), 2048)
    for backend in a.backends.split(","):
        tmp = Path(tempfile.mkdtemp())
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "evalparity.cli", "run", "--model", a.model, "--tasks", a.tasks, "--backends",
               backend, "--dtypes", a.dtype, "--limit", str(a.limit), "--out", str(tmp / "run")]
        if a.datasets_dir:
            cmd += ["--datasets-dir", a.datasets_dir]
        subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        meta = json.loads(next((tmp / "run" / "cells").glob("*/cell.json")).read_text())
        mod = backends.get(backend)
        spec = RunSpec(model=a.model, tasks=(a.tasks,), cells=(), alignment=Alignment(max_length=max_len))
        cell = CellSpec(backend, parse_dtype(a.dtype), 8)
        args = mod.model_args(spec, cell, a.model) | {"_tasks": a.tasks.split(","), "_limit": a.limit,
                                                     "_backend": mod.lm_eval_model, "_datasets_dir": a.datasets_dir}
        env = dict(os.environ) | mod.environment(spec, cell)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", PLAIN, json.dumps(args)], capture_output=True, text=True, env=env)
        plain_wall = time.perf_counter() - t0
        plain = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {}
        print(f"{backend}-{a.dtype} {a.tasks} limit {a.limit}: evalparity run (1 cell) {wall:.1f} s wall "
              f"[cell: load {meta.get('load_s', 0):.1f} s, eval {meta.get('eval_s', 0):.1f} s, write "
              f"{meta.get('write_s', 0):.1f} s, process {meta.get('wall_s', 0):.1f} s, peak RSS "
              f"{meta.get('peak_rss_gib', 0):.2f} GiB]; plain simple_evaluate process {plain_wall:.1f} s "
              f"(load+eval inside {plain.get('simple_evaluate', float('nan')):.1f} s); "
              f"overhead {wall - plain_wall:+.1f} s")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
