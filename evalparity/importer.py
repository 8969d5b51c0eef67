"""``evalparity compare``: turn existing lm-eval output directories into cells of a run directory.

Each directory (what ``lm_eval --log_samples --output_path`` wrote, from any model type) becomes one cell:
its samples go through the same table builder as ``evalparity run``'s cells, so the statistics and report
that follow are the same code.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from evalparity import cells, samples
from evalparity.config import CELL_FILE, CELLS, COMPARE_FILE, LM_EVAL_RESULTS, TABLE_FILE
from evalparity.errors import EvalParityError
from evalparity.files import write_json
from evalparity.rundir import check_name, contents, recover_outputs
from evalparity.spec import DTYPE_ALIASES, SHORT_DTYPE


def cell_name_for(results: dict, fallback: str) -> str:
    """'<model type>-<dtype>' from lm-eval's config (e.g. hf-fp32, vllm-bf16), else the folder name."""
    cfg = results.get("config", {}) or {}
    mtype = str(cfg.get("model") or "").lower()
    args = cfg.get("model_args") or ""
    dtype = None
    if isinstance(args, dict):
        dtype = args.get("dtype")
    else:
        m = re.search(r"dtype=([A-Za-z0-9_.]+)", str(args))
        dtype = m.group(1) if m else None
    dtype = DTYPE_ALIASES.get(str(dtype).replace("torch.", "").lower()) if dtype else None
    if mtype and mtype != "custom":
        base = re.sub(r"[^A-Za-z0-9_.-]+", "_", mtype)
        return f"{base}-{SHORT_DTYPE[dtype]}" if dtype else base
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", fallback) or "cell"


def claim_out(run_dir: Path, paths: list[Path], names: list[str]) -> None:
    """Make ``run_dir`` this comparison's: an empty (or new) directory, or one that holds the same
    comparison (same inputs, same names), whose cells are then replaced. Anything else is refused, so that
    no stale cell of another comparison is read into this one's statistics."""
    ident = {"schema": "evalparity.compare/1", "inputs": [str(Path(p).resolve()) for p in paths], "names": names}
    if contents(run_dir):
        if not (run_dir / COMPARE_FILE).is_file():
            raise EvalParityError(f"--out {run_dir} exists and does not hold an evalparity comparison: use another "
                                  "--out (or an empty directory)")
        old = cells.check_compare_json(run_dir / COMPARE_FILE, f"use another --out, or remove {run_dir}")
        if old["inputs"] != ident["inputs"] or old["names"] != names:
            was = ", ".join(f"{n}={p}" for n, p in zip(old["names"], old["inputs"]))
            raise EvalParityError(f"--out {run_dir} holds another comparison ({was}): use another --out, or remove "
                                  "that directory")
    recover_outputs(run_dir)  # what a killed compare left: its moved-aside folders, its staging folder
    (run_dir / CELLS).mkdir(parents=True, exist_ok=True)
    write_json(run_dir / COMPARE_FILE, ident)


def import_lm_eval_dirs(paths: list[Path], names: list[str], run_dir: Path) -> list[str]:
    if names and len(names) != len(paths):
        raise EvalParityError(f"--name was given {len(names)} times for {len(paths)} paths: give one per path")
    for n in names:  # before anything is read or written: a name becomes cells/<name>
        check_name(n, "--name")
    loaded = []
    for i, p in enumerate(paths):
        results, task_samples = samples.read_lm_eval_dir(Path(p))
        table = samples.samples_to_table(task_samples, results)
        name = names[i] if names else cell_name_for(results, Path(p).name)
        loaded.append((name, p, results, table))
    used: dict[str, int] = {}
    final = []
    for name, *_ in loaded:
        used[name] = used.get(name, 0) + 1
        final.append(check_name(name if used[name] == 1 else f"{name}-{used[name]}",
                                "cell name (from the lm-eval config; set it with --name)"))
    tasks = [set(t["task"]) for *_, t in loaded]
    common = set.intersection(*tasks)
    if not common:
        raise EvalParityError("the lm-eval outputs have no task in common: compare runs of the same tasks")
    tables = {n: t[t["task"].isin(common)].reset_index(drop=True) for n, (*_, t) in zip(final, loaded)}
    samples.check_alignment(tables)
    claim_out(run_dir, paths, final)
    for name, (_, p, results, _) in zip(final, loaded):
        tmp = cells.tmp_dir(run_dir, name)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        t = tables[name].copy()
        t.insert(0, "cell", name)
        samples.write_table(t, tmp / TABLE_FILE)
        cfg = results.get("config", {}) or {}
        write_json(tmp / LM_EVAL_RESULTS, {k: results.get(k) for k in ("results", "configs", "config")})
        write_json(tmp / CELL_FILE, {
            "cell": name, "status": cells.STATUS_OK, "source": str(Path(p).resolve()), "tag": "", "base_cell": name,
            "backend": cfg.get("model"), "model_args": cfg.get("model_args"), "batch_size": cfg.get("batch_size"),
            "versions": {"lm_eval": (results.get("lm_eval_version") or "?")},
            "finished": json.dumps(results.get("date")),
        })
        cells.publish(run_dir, name, cells.STATUS_OK)
    return final
