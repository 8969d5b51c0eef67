"""A stored reference: an earlier run's verified cell reused as this run's reference (``--reference-from``).

A CI gate that rescored the fp32 HF reference for every candidate would spend most of its GPU time on it. A
reference cell whose inputs are this run's (``open_source`` checks each, naming the first that differs) is the
same measurement, so its rows are taken instead of scored: for an unstaged run the rows of the documents the
run scores, for a staged run each round's rows as the round asks for them (``Source.rows``; a source with more
documents than needed is fine, one with fewer is refused naming the task). The reused rows are published in
this run's folder as a cell (or a round's part) like any other, by ``stager.publish_reused``: a table written
here, its seal, and a record made under this run's identity that names where the rows come from
(``reused_from``, ``Source.published_record``). Everything downstream (statistics, report, verification,
resume) reads it unchanged; a cell folder copied by hand carries the other run's identity and is still
refused.

What must match (``differences``): the model's files (and hub revision), the task configurations' digest, the
tasks and their leaf tasks (with their document counts), few-shot, every alignment setting (seed included),
lm-eval's version and the versions the reference's own scoring ran on (torch, transformers, and its backend's),
the device and the reference's tensor parallelism (the GPUs its replica spread over: its own
``tensor_parallel_size=``, else that run's ``--tensor-parallel``; ``spec.cell_gpus``), and the cell's own
settings: backend, dtype, TF32 and variant (``CellSpec.variant``). Its batch size need not: the reference keeps
the one it was scored at, and this run's spec records that one for it (``adopt``), so that spec and record
agree. The prompts themselves are compared once the candidates have scored them (``check_prompts``): lm-eval
draws few-shot examples in scoring order, so a reference scored on other documents or in other rounds may have
seen other prompts.

The source is only read, never written: no lock is taken (a lock would be a write, and a stored reference may
sit on a read-only archive); the cell is verified with the rest of its run (``records.verify_run``), then its
table's bytes are read once and checked against its seal, so that a cell replaced while it was read is
refused instead of half taken.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from evalparity.backends import registry
from evalparity.config import CELLS, STAGES
from evalparity.errors import EvalParityError
from evalparity.rundir import layout, records, rounds
from evalparity.rundir.fingerprint import fingerprint_change
from evalparity.rundir.names import check_name_ok
from evalparity.spec import CellSpec, RunSpec

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)

FLAG = "--reference-from"
# What every cell's scoring runs on; the reference's backend adds its own (``Backend.versions``).
SOFTWARE = ("lm_eval", "torch", "transformers")
# Fields of the source's record that describe its own process or its own table, not the cell: a reused cell
# was not loaded, timed or sharded in this run, and its table, seal and aggregates are the ones written here.
NOT_CARRIED = ("load_s", "eval_s", "write_s", "wall_s", "phases", "eval_cpu", "peak_rss_gib", "peak_gpu_gib", "pid",
               "round", "rounds", "shard", "shards", "aggregate_note", "unrecorded", "n_rows", "table", "aggregate",
               "error", "reused_from")


def _refuse(label: str, what: str, fix: str) -> EvalParityError:
    return EvalParityError(f"{FLAG} {label}: {what}: {fix}")


def split_source(text: str) -> tuple[Path, str | None]:
    """``RUN_DIR[:CELL]`` -> (RUN_DIR, CELL or None). A path that exists is a path, even with a ':' in it."""
    if Path(text).exists() or ":" not in text:
        return Path(text), None
    head, _, tail = text.rpartition(":")
    if head and check_name_ok(tail):
        return Path(head), tail
    return Path(text), None


def check_folder(text: str) -> None:
    """The option's folder exists: checked with the arguments, before anything starts (the rest of the check
    needs this run's spec: ``open_source``)."""
    folder, cell = split_source(text)
    if not folder.is_dir():
        raise _refuse(f"{folder}:{cell}" if cell else str(folder), f"{folder} is not a folder",
                      "give the --out of an earlier evalparity run")


@dataclass(frozen=True)
class Source:
    """A verified cell of an earlier run that matches this run's reference: ``target`` is this run's name for
    it, ``table`` its sealed rows as read."""

    label: str               # RUN_DIR:CELL as the messages name it
    run_dir: Path            # absolute
    cell: str                # its name there
    target: str              # this run's reference
    spec: RunSpec            # the source run's spec
    identity: str            # ... and its identity
    record: records.CellRecord
    table: pd.DataFrame

    def reused_from(self) -> dict:
        """The record's note of where the rows come from (read by the report and the verdicts)."""
        return {"run_dir": str(self.run_dir), "cell": self.cell, "made": self.record.extra.get("finished"),
                "source_identity": self.identity}

    def rows(self, docs: dict[str, list[int]], where: str = "") -> pd.DataFrame:
        """The source's rows of ``docs`` (leaf task -> doc ids), in its order, named as this run's reference; a
        one-line refusal naming the first task of which it lacks a document (``where``: "in round 3")."""
        import pandas as pd  # heavy: pandas

        t = self.table
        held = t.groupby("task", sort=False)["doc_id"].agg(lambda s: set(map(int, s))).to_dict() if len(t) else {}
        for leaf, ids in sorted(docs.items()):
            lacking = set(map(int, ids)) - held.get(leaf, set())
            if lacking:
                have = len(set(map(int, ids)) & held.get(leaf, set()))
                raise _refuse(self.label, f"it holds {have:,} of the {len(set(ids)):,} documents of {leaf} this run "
                              f"scores{' ' + where if where else ''} (doc {min(lacking)} is not there)",
                              f"drop {FLAG} to score {self.target} here, or reuse a reference scored on more "
                              "documents (a larger --limit, or --full)")
        want = pd.MultiIndex.from_tuples([(leaf, int(d)) for leaf, ids in docs.items() for d in ids],
                                         names=["task", "doc_id"])
        keep = pd.MultiIndex.from_frame(t[["task", "doc_id"]].astype({"doc_id": "int64"})).isin(want)
        return t[keep].assign(cell=self.target).reset_index(drop=True)

    def published_record(self, spec: RunSpec, seal: records.TableSeal, n_rows: int, aggregate: dict,
                         **extra) -> dict:
        """The record of the rows published in this run (a cell, or a round's part with ``round=r``): what the
        source's record says of the cell (settings, versions, environment, precision, when it was made), its
        identity and fields of this run's entry (the statistics and ``verify_run`` read those), the seal of
        the table written here, and ``reused_from``."""
        entry = next(c for c in spec.cells if c.name == self.target)
        kept = {k: v for k, v in self.record.to_json().items() if k not in NOT_CARRIED}
        return kept | {
            "cell": entry.name, "status": records.STATUS_OK, "backend": entry.backend, "dtype": entry.dtype,
            "batch_size": entry.batch_size, "tag": entry.tag, "tf32": entry.tf32, "base_cell": entry.base_name,
            "variant": entry.variant(), "spec_identity": spec.identity(),
            "run_cells": [c.name for c in spec.cells],  # this run's cells, not the source's (records.verify_run)
            "model_fingerprint": spec.model_digest, "table": seal.to_json(),
            "n_rows": int(n_rows), "aggregate": aggregate, "reused_from": self.reused_from()} | extra

    def check_published(self, folder: Path) -> None:
        """A unit of this run (the reference's cell or a round's part, finished under its identity) that a
        resume finds: nothing to do when it holds these rows already; refused in one line when it holds
        others (scored here, or reused from another run or cell), which this run would otherwise mix in."""
        rec = records.read_cell(folder)
        was = rec.extra.get("reused_from") if rec is not None else None
        if was == self.reused_from():
            return
        made = f"reused from {was.get('run_dir')}:{was.get('cell')}" if isinstance(was, dict) else "scored in this run"
        raise _refuse(self.label, f"{folder} is already this run's {self.target}, {made}",
                      f"rerun without {FLAG} to keep it, --force to replace it, or use another --out")

    def check_prompts(self, run_dir: Path, tables: dict[str, pd.DataFrame]) -> None:
        """The reference's rows against the other cells' (the same documents), prompt by prompt: lm-eval draws
        few-shot examples in scoring order, so a reference scored on other documents, or in other rounds,
        can hold other prompts for the same document. One line naming the first, instead of the statistics'
        general refusal of unaligned cells; the reused rows are set aside first (``set_aside``), so that
        rerunning without the option scores the reference and keeps the other cells."""
        import pandas as pd  # heavy: pandas

        key, hashes = ["task", "filter", "doc_id", "choice"], ["doc_hash", "prompt_hash", "target_hash"]
        ref = tables.get(self.target)
        if ref is None:
            return
        for name, other in tables.items():
            if name == self.target or not len(other):
                continue
            joined = pd.merge(ref[key + hashes], other[key + hashes], on=key, suffixes=("", "_cell"))
            for h in hashes:
                bad = joined[joined[h] != joined[h + "_cell"]]
                if len(bad):
                    row = bad.iloc[0]
                    what = {"doc_hash": "document", "prompt_hash": "prompt", "target_hash": "target"}[h]
                    moved = self.set_aside(run_dir)
                    raise _refuse(self.label, f"its {what} of {row['task']} doc {int(row['doc_id'])} is not the one "
                                  f"{name} scored here (lm-eval draws few-shot examples in scoring order, so a "
                                  "reference scored on other documents or in other rounds can hold other prompts)",
                                  f"rerun the same command without {FLAG}: {self.target} is then scored in this run "
                                  f"(its reused rows were moved to {', '.join(moved) or 'attempts/'})")

    def set_aside(self, run_dir: Path) -> list[str]:
        """Move this run's units that hold these reused rows (the reference's cell, a staged run's parts) to
        ``attempts/<folder>/<unit>/reused-<time>``, as ``--force`` moves what it reruns; nothing is deleted."""
        found = [(CELLS, self.target)]
        r = 0
        while layout.unit_dir(run_dir, rounds.part_name(self.target, r), STAGES).exists():
            found.append((STAGES, rounds.part_name(self.target, r)))
            r += 1
        stamp, moved = time.strftime("%Y%m%d-%H%M%S"), []
        for folder, unit in found:
            src = layout.unit_dir(run_dir, unit, folder)
            rec = records.read_cell(src) if src.is_dir() and not src.is_symlink() else None
            if rec is None or rec.extra.get("reused_from") != self.reused_from():
                continue
            dest = layout.attempts_dir(run_dir, unit, folder) / f"reused-{stamp}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            src.replace(dest)
            moved.append(str(dest.relative_to(run_dir)))
        return moved


def open_source(text: str, spec: RunSpec, reference: str, run_dir: Path, gpu: str | None = None) -> Source:
    """The cell ``text`` (``RUN_DIR[:CELL]``, CELL by default this run's ``reference``) verified with its run
    and matched against this run's ``spec``: a one-line refusal naming what is missing, failed, tampered or
    different otherwise. Reads the source; writes nothing."""
    folder, cell = split_source(text)
    cell = cell or reference
    label = f"{folder}:{cell}"
    check_folder(text)
    src = Path(os.path.realpath(folder))
    if src == Path(os.path.realpath(run_dir)):
        raise _refuse(label, "it is this run's own folder", f"give an earlier run's folder, or drop {FLAG}")
    try:
        run = records.verify_run(src)
    except EvalParityError as err:
        raise _refuse(label, f"that run does not verify ({err})",
                      f"drop {FLAG}, or reuse a run that verifies") from None
    if run.kind != "run":
        raise _refuse(label, "it is an `evalparity compare` folder, whose cells record no run spec to match",
                      "give the folder of an `evalparity run`")
    if cell not in run.named:
        raise _refuse(label, f"that run has no cell {cell} (its cells: {', '.join(run.named)})",
                      f"give RUN_DIR:CELL with one of them, or drop {FLAG}")
    if cell not in run.cells:
        why = dict(run.incomplete).get(cell, "it did not finish")
        raise _refuse(label, f"its cell {cell} cannot be reused: {why}",
                      f"rerun that run to finish it, or drop {FLAG} to score {reference} here")
    src_spec = RunSpec.from_json(run.spec)
    rec = run.cells[cell]
    entry = next((c for c in spec.cells if c.name == reference), None)
    if entry is None:
        raise _refuse(label, f"{reference} is not a cell of this run", "pass --reference with one of its cells")
    found = differences(src_spec, rec, next(c for c in src_spec.cells if c.name == cell), spec, entry, gpu)
    if found:
        what, there, here = found
        said = f"the runs differ in {what} ({there} there, {here} here)" if here is not None else \
            f"the runs differ in {what}: {there}"
        raise _refuse(label, f"it cannot be this run's {reference}: {said}",
                      f"drop {FLAG} to score {reference} here, or rerun the reference with this run's settings")
    table = _sealed_table(src, cell, rec, label)
    logger.info(f"{reference}: reused from {label} (made {rec.extra.get('finished') or 'at a time not recorded'}), "
                "not scored in this run")
    return Source(label, src, cell, reference, src_spec, run.identity, rec, table)


def _sealed_table(run_dir: Path, cell: str, rec: records.CellRecord, label: str) -> pd.DataFrame:
    """The cell's table from bytes read once and checked against its seal (so a table replaced after
    ``verify_run`` read it is refused, never mixed), with the rows its seal counts, all of that cell."""
    import pandas as pd  # heavy: pandas

    path = layout.table(layout.cell_dir(run_dir, cell))
    data = path.read_bytes()
    seal = rec.table
    if seal is None or len(data) != seal.bytes or hashlib.sha256(data).hexdigest() != seal.sha256:
        raise _refuse(label, f"{path} changed while it was read", "retry once no command is writing that run")
    table = pd.read_parquet(io.BytesIO(data), engine="pyarrow")
    cells_in = sorted(map(str, table["cell"].unique())) if "cell" in table else []
    if len(table) != seal.n_rows or (len(table) and cells_in != [cell]):
        raise _refuse(label, f"{path} holds {len(table)} rows of {', '.join(cells_in) or 'no cell'}, its record seals "
                      f"{seal.n_rows} of {cell}", f"drop {FLAG}, or rerun that cell there")
    return table


def differences(src: RunSpec, rec: records.CellRecord, src_entry: CellSpec, spec: RunSpec,
                entry: CellSpec, gpu: str | None = None) -> tuple[str, str, str | None] | None:
    """The first of what the reference's rows depend on that differs between the source run (``src``, its
    cell's record ``rec`` and spec entry) and this run (``spec``, its reference ``entry``): (what, there,
    here, or None where ``there`` says it all); None when all match. See the module docstring for the list,
    and for why the batch size is not on it."""
    fp_there, fp_here = src.model_fingerprint or {}, spec.model_fingerprint or {}
    if (fp_there.get("revision"), fp_there.get("files")) != (fp_here.get("revision"), fp_here.get("files")) \
            or not fp_there or not fp_here:
        change = fingerprint_change(fp_there | {"source": fp_here.get("source")}, fp_here) if fp_there and fp_here \
            else "no fingerprint recorded"
        return "the model", change or "another model", None
    checks: list[tuple[str, object, object]] = [
        ("the task configurations' digest (task_configs/ and --include-path)", src.task_configs, spec.task_configs),
        ("the tasks", ",".join(sorted(src.tasks)), ",".join(sorted(spec.tasks))),
        ("the leaf tasks", ",".join(sorted(dict(src.leaf_docs))), ",".join(sorted(dict(spec.leaf_docs)))),
    ]
    there_docs, here_docs = dict(src.leaf_docs), dict(spec.leaf_docs)
    checks += [(f"the documents of {leaf}", there_docs[leaf], here_docs.get(leaf)) for leaf in sorted(there_docs)]
    checks.append(("--num-fewshot", src.num_fewshot, spec.num_fewshot))
    checks += [(f"the alignment setting {f.name}", getattr(src.alignment, f.name), getattr(spec.alignment, f.name))
               for f in fields(src.alignment)]
    ran, here_sw = dict(src.software) | rec.versions, dict(spec.software)
    keys = SOFTWARE + tuple(sorted(_backend_versions(entry.backend)))
    checks += [(f"the version of {k}", ran.get(k), here_sw.get(k)) for k in keys]
    there_kind, here_kind = src.device.split(":")[0], spec.device.split(":")[0]  # cuda:0 is cuda
    checks.append(("the device", there_kind, here_kind))
    if gpu is not None and here_kind == "cuda":  # the GPU's model: other kernels (a CPU's name is not compared)
        checks.append(("the GPU", rec.extra.get("device_name"), gpu))
    # the GPUs the reference's replica spread over (its own tensor_parallel_size=, else --tensor-parallel):
    # another split is another reduction order; the run-wide value of cells other than the reference is not
    checks += [("the reference's tensor parallel size (GPUs per replica)", src.cell_gpus(src_entry),
                spec.cell_gpus(entry)),
               ("the backend", src_entry.backend, entry.backend), ("the dtype", src_entry.dtype, entry.dtype),
               ("TF32", src_entry.tf32, entry.tf32),
               ("the cell's variant", src_entry.variant() or "none", entry.variant() or "none")]
    for what, there, here in checks:
        if there != here:
            return what, str(there), str(here)
    return None


def _backend_versions(backend: str) -> dict[str, str]:
    """The versions a backend adds to every cell's (``Backend.versions``: ``vllm`` for vLLM, none for HF, whose
    engine is torch and transformers); none for a backend this install does not have."""
    try:
        return registry.get(backend).versions()
    except EvalParityError:
        return {}


def adopt(spec: RunSpec, source: Source) -> RunSpec:
    """This run's spec with its reference at the batch size the source scored it at: not one of the inputs
    that must match (another batch size is the noise floor's question, not the reference's), and recorded
    as it was, so that the spec and the reused record agree (``records.verify_cell`` holds them to it)."""
    was = next(c for c in source.spec.cells if c.name == source.cell)
    cells = tuple(replace(c, batch_size=was.batch_size) if c.name == source.target else c for c in spec.cells)
    same = next((c for c in cells if c.tag.startswith("bs") and c.base_name == source.target
                 and str(c.batch_size) == str(was.batch_size)), None)
    if same is not None:  # its noise floor would compare the reference with itself (session 32's review)
        raise EvalParityError(f"--reference-from {source.cell} was scored at batch size {was.batch_size}, so this "
                              f"run's {source.target} is too, and the repeat {same.name} would measure nothing: "
                              "give the repeat another batch size")
    return replace(spec, cells=cells)
