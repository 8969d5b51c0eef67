"""Merge the shards of a sharded cell into one cell, as if it had run unsharded.

A cell with ``shards = N`` runs as N processes, shard k evaluating every N-th document of each task
(``RunSpec.shard_samples``). Each shard publishes ``shards/<cell>.<k>of<N>/`` like a cell. Once all have
finished, ``merge`` writes ``cells/<cell>/`` with the concatenated per-sample table (sorted exactly like an
unsharded table), a ``cell.json`` that keeps every shard's timings and placement, and publishes it by one
rename. The shard folders stay, with their lm-eval output and logs.

What sharding changes numerically: each shard batches only its own documents, so a request is padded and
batched with other neighbours than in an unsharded run (the same effect as another batch size, which the
noise-floor rows measure: ``--repeat backend:dtype:dpN``). With few-shot tasks lm-eval draws the examples
from one random sequence per process, so shards would get other examples than an unsharded run; the table
alignment check refuses such a comparison instead of reporting it as drift.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pandas as pd

from evalparity import samples
from evalparity.config import CELLS, unit_location
from evalparity.errors import EvalParityError
from evalparity.files import write_json
from evalparity.rundir import layout, records, units
from evalparity.rundir.records import STATUS_OK
from evalparity.spec import CellSpec, RunSpec


def shard_dirs(run_dir: Path, cell: CellSpec) -> list[Path]:
    return [layout.unit_dir(run_dir, name, folder) for folder, name in
            (unit_location(cell.name, k, cell.shards) for k in range(cell.shards))]


def pending_shards(run_dir: Path, cell: CellSpec, force: bool, identity: str | None = None) -> list[int]:
    def done(k: int) -> bool:
        folder, name = unit_location(cell.name, k, cell.shards)
        return units.is_done(run_dir, name, folder, identity)

    return [k for k in range(cell.shards) if force or not done(k)]


def merge_tables(tables: list[pd.DataFrame], parts: str = "shards") -> pd.DataFrame:
    """One table from the ``parts``' tables (shards, or a staged cell's rounds), in the order an unsharded
    cell's table has (sorted by the key)."""
    df = pd.concat(tables, ignore_index=True)
    df = df.sort_values(samples.KEY, kind="stable").reset_index(drop=True)
    if df.duplicated(samples.KEY).any():
        raise ValueError(f"two {parts} hold the same document: the {parts} overlap")
    return df


# What the parts of one cell must share beyond its settings (its spec entry, checked by records.verify_part):
# a part scored on another device or install (a resume on another machine, a replica on another GPU), or
# reused from an earlier run where the others were scored here, is another cell's, and one record says one.
SAME_IN_PARTS = ("device_name", "versions", "precision", "interpreter", "reused_from")


def check_one_cell(run_dir: Path, cell: str, parts: list[tuple[Path, dict]], what: str) -> None:
    """The records of ``cell``'s parts (folder, record), ``what`` they are ("rounds", "shards", "replicas"):
    a one-line refusal naming the first part that differs from the first in one of ``SAME_IN_PARTS``. Before
    a staged run decides on the parts (``stager.read_parts``), and before anything merged is written."""
    if not parts:
        return
    first, rec0 = parts[0]
    for key in SAME_IN_PARTS:
        other = next(((d, m) for d, m in parts[1:] if m.get(key) != rec0.get(key)), None)
        if other is not None:
            raise EvalParityError(f"the {what} of {cell} ran with different {key} ({_where(run_dir, first)}: "
                                  f"{_short(rec0.get(key))}; {_where(run_dir, other[0])}: {_short(other[1].get(key))})"
                                  ": they are not one cell; score them with one install on like devices (rerun "
                                  "where the run was made), or rerun into a new --out")


def _where(run_dir: Path, folder: Path) -> str:
    try:
        return str(folder.relative_to(run_dir))
    except ValueError:
        return str(folder)


def _short(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str)[:120]


def verify_finished(spec: RunSpec, cell: CellSpec, parts: list[tuple[Path, dict]]) -> None:
    """Each of ``cell``'s parts to be merged (folder, its place: ``records.verify_part``) verified, and
    finished: a resume merges parts that an earlier process published. One-line refusal otherwise."""
    identity = spec.identity()
    for folder, place in parts:
        if records.verify_part(folder, identity, cell, spec.model_digest, place) is None:
            raise EvalParityError(f"{folder}: this part of {cell.name} has not finished: rerun the same command to "
                                  "score it")


def stage_merged(run_dir: Path, cell: str, dirs: list[Path], parts: str = "shards", folder: str = CELLS):
    """The merged table of the unit folders ``dirs`` written into the temp folder of the unit ``cell`` (in
    ``folder``) and sealed, ready for its record and publish: (temp folder, table, seal, the parts' records).
    Shards, staged rounds and a staged round's replicas merge alike. Each part was verified by its caller
    (``records.verify_part``); here, before anything is written, the parts must also be of one cell
    (``check_one_cell``)."""
    metas = [units.read_cell_json(d) or {} for d in dirs]
    check_one_cell(run_dir, cell, list(zip(dirs, metas)), parts)
    table = merge_tables([samples.read_table(layout.table(d)) for d in dirs], parts)
    out = units.tmp_dir(run_dir, cell, folder)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    samples.write_table(table, layout.table(out))
    return out, table, records.seal_table(out, len(table)), metas


def aggregate(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per-task means of the per-sample metrics: what lm-eval reports for mean-aggregated metrics (acc,
    acc_norm, exact_match), computed over the merged documents."""
    out: dict[str, dict[str, float]] = {}
    docs = table.drop_duplicates(["task", "filter", "doc_id"])
    for (task, filt), g in docs.groupby(["task", "filter"], sort=False):
        for col in samples.metric_columns(g):
            vals = g[col].dropna()
            if len(vals):
                out.setdefault(task, {})[f"{col.removeprefix(samples.METRIC_PREFIX)},{filt}"] = float(vals.mean())
    return out


def merge(run_dir: Path, spec: RunSpec, cell: CellSpec) -> dict:
    """Write and publish ``cells/<cell>`` from its finished shards, each verified as a part of the cell
    (``records.verify_part``: a resumed run merges shards an earlier attempt published); return its cell.json."""
    dirs = shard_dirs(run_dir, cell)
    verify_finished(spec, cell, [(d, {"shard": {"index": k, "of": cell.shards}, "round": None})
                                 for k, d in enumerate(dirs)])
    out, table, seal, metas = stage_merged(run_dir, cell.name, dirs)
    layout.log_file(out).write_text("".join(f"shard {k}: {layout.log_file(d).relative_to(run_dir)}\n"
                                          for k, d in enumerate(dirs)))
    first = metas[0]
    meta = {k: v for k, v in first.items() if k not in ("shard", "placement", "pid", "aggregate", "n_rows")}
    meta |= {
        "status": STATUS_OK,
        "shards": [{"index": k, "dir": str(d.relative_to(run_dir)), "n_rows": m.get("n_rows"),
                    "load_s": m.get("load_s"), "eval_s": m.get("eval_s"), "wall_s": m.get("wall_s"),
                    "peak_rss_gib": m.get("peak_rss_gib"), "peak_gpu_gib": m.get("peak_gpu_gib"),
                    "placement": m.get("placement")} for k, (d, m) in enumerate(zip(dirs, metas))],
        # The cell's wall clock is that of its slowest shard when the shards run side by side.
        "load_s": max(m.get("load_s", 0.0) for m in metas),
        "eval_s": max(m.get("eval_s", 0.0) for m in metas),
        "wall_s": max(m.get("wall_s", 0.0) for m in metas),
        "peak_rss_gib": max(m.get("peak_rss_gib", 0.0) for m in metas),
        "placement": [m.get("placement") for m in metas],
        "aggregate": aggregate(table),
        "aggregate_note": "per-task means of the per-sample metrics over the merged shards",
        "n_rows": int(len(table)),
        "table": seal.to_json(),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    records.write_cell(out, meta)
    write_json(layout.lm_eval_results(out), {"results": meta["aggregate"], "shards": cell.shards})
    units.publish(run_dir, cell.name, STATUS_OK)
    return meta
