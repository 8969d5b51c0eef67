"""``evalparity compare``: turn existing lm-eval output directories into cells of a run directory.

Each directory (what ``lm_eval --log_samples --output_path`` wrote, from any model type) becomes one cell:
its samples go through the same table builder as ``evalparity run``'s cells, so the statistics and report
that follow are the same code.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

from evalparity import samples
from evalparity.errors import EvalParityError
from evalparity.files import sha256, write_json
from evalparity.rundir import check_name, check_names, contents, layout, records, recover_outputs, units
from evalparity.rundir.records import STATUS_OK
from evalparity.spec import SHORT_DTYPE, dtype_of

logger = logging.getLogger(__name__)
MISSING_TASKS = "tasks_not_in_every_input"  # compare.json: [{"task", "missing_from": [cell names]}]


def dtype_for(results: dict) -> str | None:
    """The dtype lm-eval's config gave the model (``float32``, ``bfloat16``, ``float16``), or None."""
    args = (results.get("config", {}) or {}).get("model_args") or ""
    if isinstance(args, dict):
        dtype = args.get("dtype")
    else:
        m = re.search(r"dtype=([A-Za-z0-9_.]+)", str(args))
        dtype = m.group(1) if m else None
    return dtype_of(dtype) if dtype else None


def cell_name_for(results: dict, fallback: str) -> str:
    """'<model type>-<dtype>' from lm-eval's config (e.g. hf-fp32, vllm-bf16), else the folder name."""
    cfg = results.get("config", {}) or {}
    mtype = str(cfg.get("model") or "").lower()
    dtype = dtype_for(results)
    if mtype and mtype != "custom":
        base = re.sub(r"[^A-Za-z0-9_.-]+", "_", mtype)
        return f"{base}-{SHORT_DTYPE[dtype]}" if dtype else base
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", fallback) or "cell"


def input_id(folder: Path, stamp: str | None) -> str:
    """How compare.json names an input: the resolved folder, plus ``@STAMP`` when one run in it was picked."""
    return str(Path(folder).resolve()) + (f"{samples.PICK}{stamp}" if stamp else "")


def claim_out(run_dir: Path, inputs: list[str], names: list[str], record: dict | None = None) -> None:
    """Make ``run_dir`` this comparison's: an empty (or new) directory, or one that holds the same
    comparison (same inputs, same names), whose cells are then replaced. Anything else is refused, so that
    no stale cell of another comparison is read into this one's statistics. ``inputs``: ``input_id``s;
    ``record``: more to keep in compare.json (not part of the comparison's identity)."""
    ident = {"inputs": inputs, "names": names}
    if contents(run_dir):
        if not layout.compare_file(run_dir).is_file():
            raise EvalParityError(f"--out {run_dir} exists and does not hold an evalparity comparison: use another "
                                  "--out (or an empty directory)")
        old = records.check_compare_json(layout.compare_file(run_dir), f"use another --out, or remove {run_dir}")
        if old["inputs"] != ident["inputs"] or old["names"] != ident["names"]:
            was = ", ".join(f"{n}={p}" for n, p in zip(old["names"], old["inputs"]))
            raise EvalParityError(f"--out {run_dir} holds another comparison ({was}): use another --out, or remove "
                                  "that directory")
    recover_outputs(run_dir)  # what a killed compare left: its moved-aside folders, its staging folder
    layout.cells_dir(run_dir).mkdir(parents=True, exist_ok=True)
    records.write_compare(run_dir, records.CompareRecord(tuple(inputs), tuple(names),
                                                         tuple((record or {}).get(MISSING_TASKS, ()))))


def refuse_same_input(inputs: list[tuple[Path, str | None]], args: list[Path]) -> None:
    """The same folder (and run) given twice compares a run with itself: a PASS that says nothing."""
    seen: dict[str, int] = {}
    for i, (folder, stamp) in enumerate(inputs):
        key = input_id(folder, stamp)
        if key in seen:
            raise EvalParityError(f"{args[seen[key]]} and {args[i]} are the same lm-eval output ({key}): compare "
                                  "two different runs")
        seen[key] = i


def refuse_identical_samples(files: list[dict[str, Path]], args: list[Path], tasks: set[str]) -> None:
    """Two inputs whose samples files of the ``tasks`` compared are byte-identical (a copied folder) are one
    run given twice: every difference would be zero and the verdict a PASS for nothing."""
    digests = [{t: sha256(f[t]) for t in sorted(tasks) if t in f} for f in files]
    for j in range(len(files)):
        for i in range(j):
            if digests[i] and digests[i] == digests[j]:
                raise EvalParityError(f"{args[i]} and {args[j]} hold byte-identical samples for "
                                      f"{', '.join(sorted(digests[i]))} (one run, copied?): compare two different "
                                      "runs; identical samples agree exactly and need no statistics")


def import_lm_eval_dirs(paths: list[Path], names: list[str], run_dir: Path) -> list[str]:
    """Read every lm-eval output folder (``DIR`` or ``DIR@STAMP``), check that they can be paired honestly
    (different runs, aligned docs, tasks in common), and publish each as a cell of ``run_dir``."""
    if names and len(names) != len(paths):
        raise EvalParityError(f"--name was given {len(names)} times for {len(paths)} paths: give one per path")
    check_names(names, "--name")  # before anything is read or written: a name becomes cells/<name>
    inputs = [samples.split_pick(p) for p in paths]
    refuse_same_input(inputs, paths)
    loaded = []
    for i, (folder, stamp) in enumerate(inputs):
        results, task_samples = samples.read_lm_eval_dir(folder, stamp)
        table = samples.samples_to_table(task_samples, results)
        name = names[i] if names else cell_name_for(results, folder.name)
        files = {t: f.path for t, f in task_samples.items() if f.path is not None}
        loaded.append((name, folder, results, table, files))
    used: dict[str, int] = {}
    final = []
    for name, *_ in loaded:
        used[name] = used.get(name, 0) + 1
        final.append(check_name(name if used[name] == 1 else f"{name}-{used[name]}",
                                "cell name (from the lm-eval config; set it with --name)"))
    tasks = {n: set(t["task"]) for n, (_, _, _, t, _) in zip(final, loaded)}
    common = set.intersection(*tasks.values())
    if not common:
        raise EvalParityError("the lm-eval outputs have no task in common: compare runs of the same tasks")
    files = [f for *_, f in loaded]
    refuse_identical_samples(files, paths, set.intersection(*(set(f) for f in files)))
    missing = records.tasks_left_out(tasks)  # named on the terminal and in compare.json (MISSING_TASKS)
    if missing:
        logger.warning("not in every input, so not compared: " + "; ".join(
            f"{m['task']} (missing from {', '.join(m['missing_from'])})" for m in missing)
            + f"; compared: {', '.join(sorted(common))}")
    tables = {n: t[t["task"].isin(common)].reset_index(drop=True) for n, (_, _, _, t, _) in zip(final, loaded)}
    samples.check_alignment(tables)
    sources = [input_id(*i) for i in inputs]
    claim_out(run_dir, sources, final, {MISSING_TASKS: missing})
    for name, source, (_, _, results, _, _) in zip(final, sources, loaded):
        tmp = units.tmp_dir(run_dir, name)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        t = tables[name].copy()
        t.insert(0, "cell", name)
        samples.write_table(t, layout.table(tmp))
        cfg = results.get("config", {}) or {}
        write_json(layout.lm_eval_results(tmp), {k: results.get(k) for k in ("results", "configs", "config")})
        batch = cfg.get("batch_size")
        records.write_cell(tmp, {
            "cell": name, "status": STATUS_OK, "source": source, "tag": "", "base_cell": name,
            "backend": str(cfg["model"]) if cfg.get("model") else None, "dtype": dtype_for(results),
            "model_args": cfg.get("model_args"),
            "batch_size": batch if isinstance(batch, (int, str)) and not isinstance(batch, bool) else None,
            "versions": {"lm_eval": (results.get("lm_eval_version") or "?")},
            "finished": json.dumps(results.get("date")),
            "spec_identity": records.compare_identity(sources, final),  # what compare.json names
            "input_tasks": sorted(tasks[name]),  # what compare.json's MISSING_TASKS is checked against
            "table": records.seal_table(tmp, len(t)).to_json(),
        })
        units.publish(run_dir, name, STATUS_OK)
    return final
