"""Where the drift comes from: per-token prompt logprobs, layer-by-layer hidden states, generation divergence.

``evalparity drift`` (or ``evalparity run --drift N``) takes prompts from a run's tasks (or a file), and for
every cell compares the cell's backend and dtype with the reference (HF at fp32 by default) on identical
token ids, one process per cell (``python -m evalparity.drift.worker``), writing ``drift/<cell>.json``.
Only running summaries are kept (see ``measure``), so it stays usable on large models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from evalparity import backends, procs
from evalparity.errors import EvalParityError
from evalparity.files import write_json
from evalparity.matrix import cell_environment
from evalparity.rundir import layout, records
from evalparity.spec import CellSpec, RunSpec, parse_backend, parse_dtype


def prompts_from_run(run_dir: Path, n: int, seed: int = 0) -> list[str]:
    """Up to ``n`` distinct scored sequences (prompt + first continuation) from the run's reference cell."""
    cells = [t for _, t in records.finished_tables(run_dir)]
    if not cells:
        raise EvalParityError(f"{run_dir} has no finished cells to take prompts from: run it first, or pass --prompts")
    t = pd.read_parquet(cells[0])
    t = t[t["choice"] == 0].drop_duplicates("prompt_hash")
    text = (t["context"].fillna("") + t["continuation"].fillna("")).tolist()
    if len(text) > n:
        t = t.sample(n=n, random_state=seed)
        text = (t["context"].fillna("") + t["continuation"].fillna("")).tolist()
    return text


def prompts_from_file(path: Path) -> list[str]:
    if not path.exists():
        raise EvalParityError(f"prompt file {path} does not exist: give a .txt (one prompt a line) or .jsonl file")
    if path.suffix == ".jsonl":
        out = []
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    out.append(json.loads(line)["prompt"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise EvalParityError(f"{path}:{i} is not a JSON object with a 'prompt' field") from None
        return out
    return [x for x in path.read_text().splitlines() if x.strip()]


def parse_cell(name: str) -> tuple[str, str, bool]:
    """'vllm-bf16' -> ('vllm', 'bfloat16', False); 'vllm-fp32-tf32' -> ('vllm', 'float32', True)."""
    backend, _, rest = name.partition("-")
    dtype, _, tag = rest.partition("-")
    if tag not in ("", "tf32") or (tag == "tf32" and parse_dtype(dtype) != "float32"):
        raise EvalParityError(f"cell {name!r} is not backend-dtype[-tf32]: write e.g. vllm-bf16 or vllm-fp32-tf32")
    return parse_backend(backend), parse_dtype(dtype or "?"), tag == "tf32"


def run_drift(model_path: str, prompts: list[str], cells: list[str], out: Path, *, reference: str = "hf-fp32",
              device: str = "cpu", max_len: int = 2048, gen_tokens: int = 32, threshold: float = 1e-3,
              dump: bool = False, console: Console | None = None, shown: Path | None = None) -> dict[str, dict]:
    """Probe every cell against the reference, one worker process per cell (``procs.popen``: it dies with this
    process, its engine subprocesses with it), into ``out``. ``shown``: where ``out`` will be once published
    (``out`` a staging folder), for the paths that messages name."""
    console = console or Console(stderr=True)
    shown = shown or out
    if not prompts:
        raise EvalParityError("no prompts to probe: pass --prompts FILE or a run directory with samples")
    parse_cell(reference)
    todo = [c for c in cells if c != reference]
    for c in todo:
        parse_cell(c)
    out.mkdir(parents=True, exist_ok=True)
    write_json(layout.drift_spec(out), {"model_path": model_path, "reference": reference, "cells": todo,
                                   "device": device, "max_len": max_len, "gen_tokens": gen_tokens,
                                   "threshold": threshold, "n_prompts": len(prompts), "dump": dump})
    write_json(layout.drift_prompts(out), {"prompts": prompts})
    results = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console) as bar:
        for c in todo:
            b, d, tf32 = parse_cell(c)
            spec = RunSpec(model=model_path, tasks=(), cells=(CellSpec(b, d, 1, tf32=tf32),), device=device)
            env = os.environ | cell_environment(spec, backends.get(b).environment(spec, spec.cells[0]), offline=True)
            task = bar.add_task(f"drift {c} vs {reference}", total=len(prompts))
            t0 = time.perf_counter()
            with open(layout.drift_log(out, c), "w") as log:
                proc = procs.popen([sys.executable, "-m", "evalparity.drift.worker", str(out), c],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
                try:
                    while proc.poll() is None:
                        try:
                            st = json.loads(layout.drift_progress(out, c).read_text())
                            bar.update(task, completed=st.get("n", 0))
                        except (OSError, json.JSONDecodeError):
                            pass
                        time.sleep(0.5)
                except BaseException:  # Ctrl-C, or an error here: the worker and its engine go first
                    procs.stop(proc)
                    raise
                procs.ended(proc)
            wall = time.perf_counter() - t0
            path = layout.drift_summary(out, c)
            if proc.returncode != 0 or not path.exists():
                tail = layout.drift_log(out, c).read_text().strip().splitlines()[-1:] or ["no output"]
                console.print(f"[red]drift {c} failed[/red]: {tail[0][:200]} (log: {layout.drift_log(shown, c)})")
                continue
            results[c] = json.loads(path.read_text())
            bar.update(task, completed=len(prompts), description=f"drift {c} vs {reference}: {wall:.0f}s")
    return results
