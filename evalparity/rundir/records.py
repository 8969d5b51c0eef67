"""The run folder's records, and the check that a folder is what its records say before anything is decided.

A run folder holds these records, each read and written here (its writers call ``write_*``):

- ``spec.json`` (``RunSpec``, written by ``matrix.prepare_run_dir``, read by ``check_spec``/``read_spec``)
  or ``compare.json`` (``CompareRecord``, written by ``importer``): what the run is. Its identity
  (``RunSpec.identity``, or the compare record's inputs and names) is what every cell was made under.
- ``cells/<cell>/cell.json`` (``CellRecord``, written by ``write_cell`` from ``cells``, ``shards``,
  ``matrix`` (a crashed cell) and ``importer``): one cell's settings, the identity it ran under and the
  seal of its table (``TableSeal``: the sha256, size and row count of ``samples.parquet`` as written).
- ``drift/<cell>.json`` (``DriftRecord``, written by ``drift.worker``): one probed cell's drift summary.

``verify_run`` is the one door the statistics come through: it reads the spec, then every cell folder, and
accepts a cell only when its record is whole, is this cell's, was made under this spec and model, and its
table is byte for byte the table it sealed. Anything else is refused in one line naming the file and what
differs (exit 2), or, where rerunning the same command fixes it (a failed, missing or unfinished cell), the
cell is listed as incomplete and the sign-off is INCOMPLETE (exit 5). So an edited, copied, swapped,
duplicated or symlinked cell, a hand-edited spec, or a spec lost beside its cells, never reaches a verdict.

Pandas-free (the checks that need the table's rows, its ``cell`` column and key uniqueness, are the
statistics' when they read it: ``stats.compare.load_cells``), and it imports only leaves, ``spec`` and
``rundir``'s own ``names`` and ``layout``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from evalparity.backends import registry
from evalparity.config import COMPARE_FILE, FAILED_SUFFIX, SPEC_FILE
from evalparity.errors import EXIT_CELL_FAILED, EvalParityError
from evalparity.files import loads, read_json, sha256, write_json
from evalparity.rundir import layout
from evalparity.rundir.names import check_name, check_name_ok
from evalparity.spec import SHORT_DTYPE, CellSpec, RunSpec, cell_from_json, dtype_of, tagged_cell_problem

STATUS_OK, STATUS_FAILED = "ok", "failed"
COMPARE_SCHEMA = "evalparity.compare/1"

_NONE = type(None)
_TYPE_WORDS = {dict: "an object", list: "a list", str: "a string", bool: "true/false", _NONE: "null",
               int: "a number", float: "a number"}

# The fields of spec.json and compare.json that are read, with the types they are read as: a file that
# parses but holds another shape is refused here, in one line, not midway through the statistics.
SPEC_FIELDS: dict[str, tuple[type, ...]] = {
    "model": (str, _NONE), "tasks": (list,), "cells": (list,), "limit": (int, _NONE), "num_fewshot": (int, _NONE),
    "device": (str,), "include_paths": (list,), "datasets_dir": (str, _NONE), "alignment": (dict,),
    "task_limits": (list,), "leaf_docs": (list,), "tensor_parallel": (int,),
    "model_fingerprint": (dict, _NONE), "task_aliases": (list,), "memory_plan": (dict,),
    "task_configs": (str, _NONE), "software": (list,), "staging": (dict, _NONE), "pythons": (list,)}
ALIGNMENT_FIELDS: dict[str, tuple[type, ...]] = {
    "softmax_fp32": (bool,), "add_bos_token": (bool, _NONE), "max_length": (int,), "prefix_caching": (bool,),
    "seed": (int,), "true_fp32": (bool,), "max_gen_toks": (int, _NONE), "apply_chat_template": (bool,),
    "system_instruction": (str, _NONE), "fewshot_as_multiturn": (bool, _NONE)}
CELL_SPEC_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,), "backend": (str,), "dtype": (str,), "batch_size": (int, str), "tag": (str,), "tf32": (bool,),
    "shards": (int,), "label": (str,), "args": (list,), "env": (list,), "model": (str,), "python": (str,),
    "model_fingerprint": (dict, _NONE)}
# list fields of spec.json whose items are pairs, with the types of the pair's two parts
SPEC_PAIRS: dict[str, tuple[type, type]] = {"task_limits": (str, int), "leaf_docs": (str, int),
                                             "task_aliases": (str, str), "software": (str, str),
                                             "pythons": (str, str)}
COMPARE_FIELDS: dict[str, tuple[type, ...]] = {"inputs": (list,), "names": (list,)}


def shape_problem(data, types: dict[str, tuple[type, ...]], required: tuple[str, ...] = ()) -> str | None:
    """What is wrong with the shape of parsed JSON ``data`` (an object whose ``types`` fields have these
    types), in words; None when nothing is."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key in required:
        if key not in data:
            return f"{key!r} is missing"
    for key, want in types.items():
        if key not in data:
            continue
        value = data[key]
        if not isinstance(value, want) or (isinstance(value, bool) and bool not in want):
            words = " or ".join(dict.fromkeys(_TYPE_WORDS.get(t, t.__name__) for t in want))
            return f"{key!r} is {_TYPE_WORDS.get(type(value), type(value).__name__)}, not {words}"
    return None


def _load(path: Path):
    return loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- the table's seal
@dataclass(frozen=True)
class TableSeal:
    """What a cell's ``samples.parquet`` was when its writer published it: any later change to the file
    (edited, replaced, copied from another cell) shows as another sha256."""

    sha256: str
    bytes: int
    n_rows: int

    @classmethod
    def of(cls, path: Path, n_rows: int) -> TableSeal:
        return cls(sha256(path), path.stat().st_size, int(n_rows))

    def to_json(self) -> dict:
        return {"sha256": self.sha256, "bytes": self.bytes, "n_rows": self.n_rows}

    @classmethod
    def from_json(cls, d) -> TableSeal | None:
        if not (isinstance(d, dict) and isinstance(d.get("sha256"), str) and type(d.get("bytes")) is int
                and type(d.get("n_rows")) is int):
            return None
        return cls(d["sha256"], d["bytes"], d["n_rows"])


# ---------------------------------------------------------------- cell.json
@dataclass
class CellRecord:
    """One cell's ``cell.json``: the fields that identify and verify the cell, typed; everything else it
    records (timings, placement, peak memory, model arguments) in ``extra``, written at the same level."""

    cell: str
    status: str
    backend: str | None = None
    dtype: str | None = None
    batch_size: int | str | None = None
    tag: str | None = ""
    base_cell: str | None = None
    tf32: bool | None = None
    spec_identity: str | None = None
    # the run's model's digest (RunSpec.model_fingerprint), which the spec identity is made with; a cell that
    # scores a checkpoint of its own (``model=``) records that one's digest in its variant (``model_digest``),
    # checked against the spec like the rest of the variant, and the checkpoint it loaded in ``model_path``
    model_fingerprint: str | None = None
    table: TableSeal | None = None
    error: str | None = None
    settings: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    precision: dict = field(default_factory=dict)
    aggregate: dict = field(default_factory=dict)
    variant: dict = field(default_factory=dict)  # spec.CellSpec.variant(): what makes a named cell one
    extra: dict = field(default_factory=dict)

    TYPES = {"cell": (str,), "status": (str,), "backend": (str, _NONE), "dtype": (str, _NONE),
             "batch_size": (int, str, _NONE), "tag": (str, _NONE), "base_cell": (str, _NONE),
             "tf32": (bool, _NONE), "spec_identity": (str, _NONE), "model_fingerprint": (str, _NONE),
             "table": (dict, _NONE), "error": (str, _NONE), "settings": (dict,), "versions": (dict,),
             "precision": (dict,), "aggregate": (dict,), "variant": (dict,)}

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("extra", "table")}
        out["table"] = self.table.to_json() if self.table else None
        return self.extra | out

    @classmethod
    def from_json(cls, d: dict, where: str = "cell.json") -> CellRecord:
        """The record in ``d``, shape-checked: a one-line error naming ``where`` otherwise."""
        problem = shape_problem(d, cls.TYPES, required=("cell", "status"))
        if problem is None and d["status"] not in (STATUS_OK, STATUS_FAILED):
            problem = f"'status' is {d['status']!r}, not {STATUS_OK} or {STATUS_FAILED}"
        if problem is None and d.get("table") is not None and TableSeal.from_json(d["table"]) is None:
            problem = "'table' is not a seal (sha256, bytes, n_rows)"
        if problem:
            raise EvalParityError(f"{where} is not a cell record evalparity can read ({problem}): remove its folder "
                                  "and rerun the same command to redo that cell")
        known = {f.name for f in fields(cls)} - {"extra"}
        kw = {k: v for k, v in d.items() if k in known}
        kw["table"] = TableSeal.from_json(d.get("table"))
        return cls(**kw, extra={k: v for k, v in d.items() if k not in known})


def write_cell(folder: Path, record: CellRecord | dict) -> CellRecord:
    """Write ``folder/cell.json`` atomically, from a record or a dict that ``CellRecord.from_json`` accepts
    (checked first, so no writer can publish a record its reader would refuse)."""
    rec = record if isinstance(record, CellRecord) else CellRecord.from_json(record, str(layout.cell_record(folder)))
    write_json(layout.cell_record(folder), rec.to_json())
    return rec


def seal_table(folder: Path, n_rows: int) -> TableSeal:
    """The seal of ``folder/samples.parquet``, just written with ``n_rows`` rows."""
    return TableSeal.of(layout.table(folder), n_rows)


def read_cell(folder: Path) -> CellRecord | None:
    """A cell folder's record, or None when it is missing, unreadable or not a record (never taken as done)."""
    data = read_json(layout.cell_record(folder))
    if data is None:
        return None
    try:
        return CellRecord.from_json(data)
    except EvalParityError:
        return None


def check_cell(folder: Path) -> CellRecord:
    """A cell folder's record, checked: readable, of the right shape, and this folder's cell's record."""
    path = layout.cell_record(folder)
    fix = f"remove {folder} and rerun the same command to redo that cell"
    try:
        data = _load(path)
    except (OSError, ValueError) as err:
        raise EvalParityError(f"{path} is truncated or corrupt ({type(err).__name__}): {fix}") from None
    rec = CellRecord.from_json(data, str(path))
    own = folder.name.removesuffix(FAILED_SUFFIX)
    if rec.cell != own:
        raise EvalParityError(f"{path} is not a cell record evalparity can read (it is the record of cell "
                              f"{rec.cell!r}, not of {own}: a folder copied or renamed by hand): {fix}")
    return rec


def is_done(folder: Path, identity: str | None = None) -> bool:
    """Whether the unit in ``folder`` finished (record ok and table present); with ``identity``, only if it
    finished under that spec and model."""
    rec = read_cell(folder)
    if rec is None or not rec.ok or (identity is not None and rec.spec_identity != identity):
        return False
    return (layout.table(folder)).exists()


# ---------------------------------------------------------------- spec.json and compare.json
def check_spec(path: Path) -> dict:
    """``spec.json``, checked: an object whose fields have the types that are read, whose cells are objects
    with safe names, and that ``RunSpec.from_json`` reads. A one-line error naming the file otherwise."""
    fix = "restore it, or rerun the run into a new --out"
    try:
        spec = _load(path)
    except (OSError, ValueError) as err:
        raise EvalParityError(f"{path} is truncated or corrupt ({type(err).__name__}): {fix}") from None
    problem = shape_problem(spec, SPEC_FIELDS) or _spec_parts_problem(spec)
    if problem is None:
        try:
            RunSpec.from_json(spec)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            problem = f"{type(err).__name__}: {str(err)[:80]}"
    if problem:
        raise EvalParityError(f"{path} is not a spec evalparity can read ({problem}): {fix}")
    return spec


def _spec_parts_problem(spec: dict) -> str | None:
    """What is wrong inside spec.json's lists and objects (every field is read by ``RunSpec.from_json`` and
    into the identity, so each must have the type it is written with), in words; None when nothing is."""
    derived_cells = []
    for c in spec.get("cells", []):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            return f"a cell entry is {json.dumps(c)[:60]}, not an object with a name"
        try:
            check_name(c["name"])
        except EvalParityError as err:
            return str(err).split(":", 1)[0]
        problem = shape_problem(c, CELL_SPEC_FIELDS, required=("backend", "dtype", "batch_size"))
        if problem:
            return f"cell {c['name']}: {problem}"
        if c["dtype"] not in SHORT_DTYPE:
            return f"cell {c['name']}: dtype {c['dtype']!r} is not one of {', '.join(SHORT_DTYPE)}"
        for key in ("args", "env"):
            bad = next((x for x in c.get(key, []) if not (isinstance(x, list) and len(x) == 2
                                                            and all(isinstance(v, str) for v in x))), None)
            if bad is not None:
                return f"cell {c['name']}: {key!r} holds {json.dumps(bad)[:40]}, not a [key, value] pair of strings"
        derived = cell_from_json(c)
        if derived.name != c["name"]:
            return f"cell {c['name']} is named {derived.name} by its backend, dtype, tag and label"
        derived_cells.append(derived)
    found = tagged_cell_problem(derived_cells)
    if found is not None:
        return f"cell {found[0].name} {found[1]}"
    for key in ("tasks", "include_paths"):
        if not all(isinstance(t, str) for t in spec.get(key, [])):
            return f"{key!r} holds something other than names"
    for key, (first, second) in SPEC_PAIRS.items():
        for x in spec.get(key, []):
            if not (isinstance(x, list) and len(x) == 2 and isinstance(x[0], first) and isinstance(x[1], second)
                    and not isinstance(x[1], bool)):
                return f"{key!r} holds {json.dumps(x)[:40]}, not a [{first.__name__}, {second.__name__}] pair"
    alignment = spec.get("alignment", {})
    unknown = sorted(set(alignment) - set(ALIGNMENT_FIELDS))
    if unknown:
        return f"'alignment' has an unknown setting {unknown[0]!r}"
    problem = shape_problem(alignment, ALIGNMENT_FIELDS)
    return f"alignment: {problem}" if problem else None


def read_spec(run_dir: Path) -> RunSpec:
    """The run's spec, checked (``check_spec``)."""
    return RunSpec.from_json(check_spec(layout.spec_file(run_dir)))


def compare_identity(inputs: list[str], names: list[str]) -> str:
    """What a comparison's cells are made under: its inputs and their names, in order."""
    body = json.dumps({"inputs": list(inputs), "names": list(names)}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CompareRecord:
    """``compare.json``: the lm-eval outputs ``evalparity compare`` turned into cells (``inputs``, each a
    resolved path, ``@STAMP`` where one of several runs was picked) and their cell names, in order; and the
    tasks left out because some inputs lack them. ``identity`` is what every cell of the comparison is
    made under (``compare_identity``)."""

    inputs: tuple[str, ...]
    names: tuple[str, ...]
    tasks_not_in_every_input: tuple[dict, ...] = ()
    schema: str = COMPARE_SCHEMA

    @property
    def identity(self) -> str:
        return compare_identity(list(self.inputs), list(self.names))

    def to_json(self) -> dict:
        return {"schema": self.schema, "inputs": list(self.inputs), "names": list(self.names),
                "tasks_not_in_every_input": list(self.tasks_not_in_every_input)}

    @classmethod
    def from_json(cls, d: dict) -> CompareRecord:
        missing = d.get("tasks_not_in_every_input") or []
        return cls(tuple(d["inputs"]), tuple(d["names"]),
                   tuple(i for i in missing if isinstance(i, dict)) if isinstance(missing, list) else (),
                   str(d.get("schema", COMPARE_SCHEMA)))


def write_compare(run_dir: Path, record: CompareRecord) -> None:
    """Write ``compare.json`` (its one writer: ``importer.claim_out``)."""
    write_json(layout.compare_file(run_dir), record.to_json())


def read_compare(run_dir: Path, fix: str = "rerun the same `evalparity compare` into a new --out") -> CompareRecord:
    """``compare.json``, checked (``check_compare_json``)."""
    return CompareRecord.from_json(check_compare_json(layout.compare_file(run_dir), fix))


def check_compare_json(path: Path, fix: str) -> dict:
    """``compare.json`` (what ``evalparity compare`` wrote: its inputs and cell names), checked."""
    try:
        data = _load(path)
    except (OSError, ValueError) as err:
        raise EvalParityError(f"{path} is truncated or corrupt ({type(err).__name__}): {fix}") from None
    problem = shape_problem(data, COMPARE_FIELDS, required=("inputs", "names"))
    if problem is None and (not all(isinstance(x, str) for x in data["inputs"] + data["names"])
                            or len(data["inputs"]) != len(data["names"])):
        problem = "'inputs' and 'names' are not two lists of paths and names, one name per path"
    if problem is None and not all(check_name_ok(n) for n in data["names"]):
        problem = f"a cell name is not a safe name: {next(n for n in data['names'] if not check_name_ok(n))!r}"
    if problem is None and len(set(data["names"])) != len(data["names"]):
        problem = "a cell name is listed twice"
    if problem:
        raise EvalParityError(f"{path} is not a comparison record evalparity can read ({problem}): {fix}")
    return data


# ---------------------------------------------------------------- verification
@dataclass
class VerifiedRun:
    """A run folder as ``verify_run`` accepted it."""

    kind: str                              # "run" (spec.json) or "compare" (compare.json)
    spec: dict                             # spec.json or compare.json, as read
    identity: str                          # what every cell must have been made under
    named: list[str]                       # the cells the spec names, in its order
    cells: dict[str, CellRecord]           # the finished, verified cells
    incomplete: list[tuple[str, str]]      # (cell, why) for named cells a rerun would finish

    @property
    def model(self) -> str | None:
        return self.spec.get("model") if self.kind == "run" else None


def _spec_of(run_dir: Path) -> tuple[str, dict, str, list[str], dict[str, CellSpec | None], str | None]:
    """(kind, spec, identity, named cells, each named cell's ``CellSpec`` (None in a comparison), model
    fingerprint digest)."""
    spec_path, compare_path = layout.spec_file(run_dir), layout.compare_file(run_dir)
    if spec_path.exists() and compare_path.exists():
        raise EvalParityError(f"{run_dir} holds both a {SPEC_FILE} and a {COMPARE_FILE}: one folder is one run or one "
                              "comparison; rerun into a new --out")
    if spec_path.exists():
        data = check_spec(spec_path)
        spec = RunSpec.from_json(data)
        entries = {c.name: c for c in spec.cells}
        return "run", data, spec.identity(), list(entries), entries, spec.model_digest
    if compare_path.exists():
        data = check_compare_json(compare_path, "rerun the same `evalparity compare` into a new --out")
        return ("compare", data, compare_identity(data["inputs"], data["names"]), list(data["names"]),
                {n: None for n in data["names"]}, None)
    raise EvalParityError(f"{run_dir} has no {SPEC_FILE} (nor {COMPARE_FILE}): without the record of what the run is, "
                          "its cells cannot be verified and nothing is signed off; restore it, or rerun into a "
                          "new --out")


def _loaded_dtype(rec: CellRecord) -> str | None:
    """The dtype the cell's model arguments (``model_args``, as the cell recorded them) loaded its model in,
    as a spec dtype (``float32``...), the raw value where it is none of those, or None where they name none."""
    args = rec.extra.get("model_args")
    if not isinstance(args, dict) or args.get("dtype") is None:
        return None
    return dtype_of(args["dtype"]) or str(args["dtype"])


def _refuse(path: Path, what: str, fix: str) -> EvalParityError:
    return EvalParityError(f"{path}: {what}: {fix}")


def role_difference(rec: CellRecord, entry: CellSpec | None, name: str) -> tuple[str, object, object] | None:
    """The first field of ``rec`` that is not what the spec entry says: (field, recorded, the spec's); None
    when none is. What the statistics read of a record decides which comparisons are made (a tag makes a
    noise-floor repeat, tf32 a precision-mode cell, base_cell their pair), and a part of a cell must have
    been scored as the cell is (``matrix``: a resume merges them). ``entry`` None: a comparison's cell
    ``name``, a plain cell of its own (``importer``)."""
    want = {"tag": "", "tf32": None, "base_cell": name} if entry is None else \
        {"backend": entry.backend, "dtype": entry.dtype, "batch_size": entry.batch_size, "tag": entry.tag or "",
         "tf32": entry.tf32, "base_cell": entry.base_name, "variant": entry.variant()}
    for key, value in want.items():
        got = getattr(rec, key) if key != "tag" else (rec.tag or "")
        if key == "tf32" and entry is None:
            got = rec.tf32 or None  # false or absent: a plain cell
        if got != value:
            return key, got, value
    return None


def verify_cell(folder: Path, identity: str, entry: CellSpec | None, fingerprint: str | None) -> CellRecord | str:
    """The verified record of the named cell in ``folder``; or why it is incomplete (a rerun finishes it);
    or a one-line refusal (raised) where the folder is not what its record and the spec say."""
    fix = f"remove {folder} and rerun the same command to redo that cell"
    if folder.is_symlink():
        raise _refuse(folder, "a cell folder is a symbolic link (to "
                      f"{os.readlink(folder)}), so it is not this run's cell", "remove the link and rerun to redo it")
    if not folder.exists():
        return "its folder is missing"
    if not folder.is_dir():
        raise _refuse(folder, "a cell is a file, not a folder", "remove it and rerun to redo that cell")
    if not layout.cell_record(folder).exists():
        return "cell.json is missing (it never finished)"
    rec = check_cell(folder)
    if not rec.ok:
        return f"it {rec.status}" + (f" ({rec.error})" if rec.error else "")
    part = next((k for k in PART_KEYS if k in rec.extra), None)
    if entry is not None and part is not None:  # sealed like a cell, and copied over one, it passed for it
        what = "a staged round" if part == "round" else "a replica"
        raise _refuse(layout.cell_record(folder), f"it is the record of {what}'s part ({part} "
                      f"{json.dumps(rec.extra[part])}), not of a whole cell (a part copied over the cell)", fix)
    return _verified(folder, rec, identity, entry, folder.name, fingerprint, fix) or "samples.parquet is missing"


# what a record says of the part of a cell it is: a staged round's ({"round": r}), a shard's or a replica's
# share ({"shard": {"index": k, "of": n}}), both for a replica's share of a round; a whole cell has neither
PART_KEYS = ("round", "shard")


def verify_part(folder: Path, identity: str, entry: CellSpec, fingerprint: str | None,
                place: dict[str, object]) -> CellRecord | None:
    """The verified record of a part of the cell ``entry`` in ``folder`` (``place``: its ``PART_KEYS``, None
    for a key it must not have), or None where the part has not finished (yet: a rerun scores it). Verified
    as a cell is, and as the part it is said to be: parts are merged into the cell (``shards.stage_merged``)
    and a staged run decides on them, so a part of another cell, round or share, of other settings (a resume
    with other options), or with an edited table would become the cell's. One-line refusal otherwise."""
    if not folder.exists() and not folder.is_symlink():
        return None
    fix = f"remove {folder} and rerun the same command to score that part again"
    if folder.is_symlink() or not folder.is_dir():
        raise _refuse(folder, "a part is a link or a file, not the folder its cell wrote", fix)
    rec = read_cell(folder)
    if rec is None or not rec.ok:
        return None
    said = {k: rec.extra.get(k) for k in place}
    if rec.cell != entry.name or said != place:
        raise _refuse(layout.cell_record(folder), f"it is the record of {rec.cell} {json.dumps(said)}, not of "
                      f"{entry.name} {json.dumps(place)}", fix)
    return _verified(folder, rec, identity, entry, entry.name, fingerprint, fix)


def _verified(folder: Path, rec: CellRecord, identity: str, entry: CellSpec | None, name: str,
              fingerprint: str | None, fix: str) -> CellRecord | None:
    """``rec`` (the record in ``folder`` of the cell ``name``, or of a part of it), checked against the spec:
    made under its identity and model, in the role the spec entry gives the cell, loaded in the dtype it
    claims, its table the one it sealed; None where the table is missing. One-line refusal otherwise."""
    record = layout.cell_record(folder)
    if rec.spec_identity != identity:
        raise _refuse(record, f"made under spec identity {rec.spec_identity}, but this run's is {identity} "
                      "(a cell copied from another run, or a spec edited by hand)", fix)
    if fingerprint is not None and rec.model_fingerprint != fingerprint:
        raise _refuse(record, f"made with model fingerprint {rec.model_fingerprint}, but this run's model "
                      f"is {fingerprint}", fix)
    differs = role_difference(rec, entry, name)
    if differs is not None:
        raise _refuse(record, f"its {differs[0]} is {differs[1]!r}, the spec's is {differs[2]!r}", fix)
    if entry is not None:
        # a named cell's name says nothing of its dtype: the dtype it claims must be the one its model was
        # loaded in (lm-eval's model arguments, recorded beside it), or a bf16 table passes for fp32; a record
        # without them, where its backend always records one, cannot show it
        loaded = _loaded_dtype(rec)
        if not isinstance(rec.extra.get("model_args"), dict):
            raise _refuse(record, "it does not say what its model was loaded with (no model_args)", fix)
        if loaded is None and entry.backend in registry.names() and \
                getattr(registry.get(entry.backend), "model_args_dtype", False):
            raise _refuse(record, f"its model_args do not name the dtype its {entry.backend} model was loaded in",
                          fix)
        if loaded is not None and loaded != rec.dtype:
            raise _refuse(record, f"its dtype is {rec.dtype!r} but its model was loaded as {loaded!r} (model_args)",
                          fix)
    if rec.table is None:
        raise _refuse(record, "it carries no seal of its table (made by an older evalparity, or written "
                      "by hand), so its table cannot be verified", fix)
    table = layout.table(folder)
    if table.is_symlink():
        raise _refuse(table, "the table is a symbolic link, not the table its cell wrote", fix)
    if not table.exists():
        return None
    size = table.stat().st_size
    found = sha256(table) if size == rec.table.bytes else None
    if found != rec.table.sha256:
        got = f"sha256 {found[:12]}" if found else f"{size} bytes"
        raise _refuse(table, f"not the table its cell wrote (recorded: sha256 {rec.table.sha256[:12]}, "
                      f"{rec.table.bytes} bytes; found: {got}): it was edited, replaced or copied", fix)
    return rec


def verify_run(run_dir: Path) -> VerifiedRun:
    """The run folder, verified before any statistics (see the module docstring): its spec, every cell the
    spec names (finished and verified, or listed as incomplete), and no cell folder the spec does not name.
    Raises a one-line ``EvalParityError`` (exit 2) naming the file for anything a rerun would not fix."""
    kind, data, identity, named, entries, fingerprint = _spec_of(run_dir)
    cells_dir = layout.cells_dir(run_dir)
    if cells_dir.is_symlink():
        raise _refuse(cells_dir, "the cells folder is a symbolic link", "restore the run's own cells/ folder")
    if cells_dir.exists() and not cells_dir.is_dir():
        raise _refuse(cells_dir, "cells is a file, not a folder", "restore the run's own cells/ folder")
    for p in sorted(cells_dir.iterdir()) if cells_dir.is_dir() else []:
        if p.name.startswith(".") or p.name.endswith((FAILED_SUFFIX, ".attempts")) and p.is_dir() \
                and not p.is_symlink():
            continue  # work in progress (.tmp-, .trash-), a failed attempt kept beside its cell, old histories
        if p.name not in entries:
            raise _refuse(p, f"not a cell of this run (its {'spec.json' if kind == 'run' else 'compare.json'} names "
                          f"{', '.join(named) or 'none'})", "move it out of cells/")
    cells: dict[str, CellRecord] = {}
    incomplete: list[tuple[str, str]] = []
    for name in named:
        got = verify_cell(layout.cell_dir(run_dir, name), identity, entries[name], fingerprint)
        if isinstance(got, str):
            incomplete.append((name, got))
        else:
            cells[name] = got
    _check_run_cells(run_dir, named, cells)
    if kind == "compare":
        _check_tasks_left_out(run_dir, data, cells)
    return VerifiedRun(kind, data, identity, named, cells, incomplete)


def tasks_left_out(tasks: dict[str, set[str] | list[str]]) -> list[dict]:
    """Per task that some inputs lack, in task order, the cells (inputs, in their order) it is missing from:
    ``compare.json``'s ``tasks_not_in_every_input``, from each cell's input's tasks."""
    have = {name: set(t) for name, t in tasks.items()}
    every = set().union(*have.values()) if have else set()
    return [{"task": t, "missing_from": [n for n, h in have.items() if t not in h]}
            for t in sorted(every) if any(t not in h for h in have.values())]


def _check_tasks_left_out(run_dir: Path, data: dict, cells: dict[str, CellRecord]) -> None:
    """A comparison's ``tasks_not_in_every_input`` is what its cells' inputs had (each record's
    ``input_tasks``): emptied or edited, the report would stop naming a task some inputs lacked, which the
    tables (the tasks in common) cannot show. Not in the comparison's identity, so that comparisons made
    before the records listed their input's tasks still verify: those (any record without the list) say
    nothing here."""
    listed = {name: rec.extra.get("input_tasks") for name, rec in cells.items()}
    if all(v is None for v in listed.values()) or set(cells) != set(data["names"]):
        return
    fix = "rerun the same `evalparity compare` into a new --out"
    for name, v in listed.items():  # one compare writes every cell: some with the list and some without is an edit
        if not isinstance(v, list) or not all(isinstance(t, str) for t in v):
            raise _refuse(layout.cell_record(layout.cell_dir(run_dir, name)), "its input_tasks is not a list of task "
                          "names (the comparison's other cells list theirs)", fix)
    want = tasks_left_out({n: listed[n] for n in data["names"]})
    got = data.get("tasks_not_in_every_input") or []
    if got != want:
        said = "; ".join(f"{m['task']} missing from {', '.join(m['missing_from'])}" for m in want) or "none"
        raise _refuse(layout.compare_file(run_dir), "its tasks_not_in_every_input is not what its cells' inputs had "
                      f"(they say: {said[:300]})", fix)


def _check_run_cells(run_dir: Path, named: list[str], cells: dict[str, CellRecord]) -> None:
    """Every cell a finished cell's record says its run had (``run_cells``: the spec's cells when it was made)
    is a cell of the spec still. The cells are not in the spec's identity, so that a run folder may gain
    cells, and a run only ever adds them (``matrix.prepare_run_dir`` keeps the union); a cell taken out of
    spec.json, with its folder, would otherwise leave the run and its verdict the sign-off without a trace.
    Records made before evalparity wrote the list say nothing here."""
    for name, rec in cells.items():
        listed = rec.extra.get("run_cells")
        if listed is None:
            continue
        path = layout.cell_record(layout.cell_dir(run_dir, name))
        if not isinstance(listed, list) or not all(isinstance(x, str) for x in listed):
            raise _refuse(path, "its run_cells is not a list of cell names", "restore it, or rerun into a new --out")
        gone = [x for x in listed if x not in named]
        if gone:
            raise _refuse(path, f"it was made in a run with cell {gone[0]}, which spec.json no longer names (a cell "
                          "taken out of the spec by hand)", "restore the spec and that cell, or rerun into a new --out")


def incomplete_error(run: VerifiedRun, fix: str = "rerun the same command to finish them") -> EvalParityError:
    """The INCOMPLETE refusal for a run whose named cells cannot all be used (exit 5)."""
    why = "; ".join(f"{c}: {w}" for c, w in run.incomplete)
    return EvalParityError(f"{len(run.incomplete)} cell(s) of the {run.kind} cannot be used ({why}): {fix}",
                           EXIT_CELL_FAILED)



def tasks_not_compared(run_dir: Path) -> list[dict]:
    """The tasks a comparison left out because some inputs lack them (``compare.json``'s
    ``tasks_not_in_every_input``: ``{"task", "missing_from": [cells]}``); empty for a run."""
    if not layout.compare_file(run_dir).exists():
        return []
    return [{"task": str(i.get("task")), "missing_from": [str(c) for c in i.get("missing_from") or []]}
            for i in read_compare(run_dir).tasks_not_in_every_input]


def finished_tables(run_dir: Path) -> list[tuple[str, Path]]:
    """(cell, its table's path) for every verified, finished cell of the run, by cell name."""
    run = verify_run(run_dir)
    return [(name, layout.table(layout.cell_dir(run_dir, name))) for name in sorted(run.cells)]


@dataclass
class DriftRecord:
    """One probed cell's drift summary (``drift/<cell>.json``, written by ``drift.worker``): the cell and its
    reference, typed; the measurements (``drift.measure``'s summary: layers, prompt logprobs, generations,
    timings) in ``extra``, written at the same level."""

    cell: str
    reference: str
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return self.extra | {"cell": self.cell, "reference": self.reference}

    @classmethod
    def from_json(cls, d: dict) -> DriftRecord:
        return cls(d["cell"], d["reference"], {k: v for k, v in d.items() if k not in ("cell", "reference")})


def write_drift_summary(folder: Path, record: DriftRecord) -> None:
    """Write ``<drift folder>/<cell>.json`` atomically (its one writer: ``drift.worker``)."""
    write_json(layout.drift_summary(folder, record.cell), record.to_json())


def read_drift_summaries(folder: Path) -> dict[str, dict]:
    """The per-cell summaries a drift folder holds (``drift/<cell>.json``), by cell; a summary that is not
    a JSON object naming its own cell and a reference is refused in one line."""
    out = {}
    for cell, path in layout.drift_summaries(folder):
        data = read_json(path)
        if data is None or data.get("cell") != cell or not isinstance(data.get("reference"), str):
            raise EvalParityError(f"{path} is not a drift summary of cell {cell} (truncated, corrupt or another "
                                  "cell's): rerun `evalparity drift` to redo it")
        out[cell] = data
    return out


@dataclass
class DriftReference:
    """The reference side of a drift folder (``reference/reference.json``; one writer, ``drift.worker`` probing
    the reference; one reader, the same worker probing each cell): what was probed and where its chunks are.

    ``ids``: per prompt, the token ids the reference probed, or None (shorter than two tokens, or the same
    ids as an earlier prompt, which is probed once). ``chunks``: the prompt indices of each
    ``chunk-<k>.safetensors`` (tensors ``entry.<e>`` and ``logprobs``, in that order). ``generations``:
    prompt index -> greedy ids, or None without ``--gen-tokens``. ``engine``: what the reference's engine ran
    with (``drift.worker.load_side``), None where its probe keeps no such record; ``attention``: an HF probe's
    attention kernels (``backends.probes.HFProbe.attention``), else None. Written and read within one
    drift (``run_drift`` clears the folder before any side starts), so every field is required."""

    cell: str
    ids: list
    chunks: list
    entries: list
    n_entries: int
    pooling: str
    generations: dict | None
    timing: dict
    engine: dict | None
    attention: dict | None

    TYPES = {"cell": (str,), "ids": (list,), "chunks": (list,), "entries": (list,), "n_entries": (int,),
             "pooling": (str,), "generations": (dict, _NONE), "timing": (dict,), "engine": (dict, _NONE),
             "attention": (dict, _NONE)}

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def write_drift_reference(folder: Path, record: DriftReference) -> None:
    """Write ``reference/reference.json`` atomically, after every chunk it names."""
    write_json(layout.drift_reference(folder) / "reference.json", record.to_json())


def read_drift_reference(folder: Path) -> DriftReference:
    path = layout.drift_reference(folder) / "reference.json"
    data = read_json(path)
    problem = "missing or not JSON" if data is None else shape_problem(data, DriftReference.TYPES,
                                                                       required=tuple(DriftReference.TYPES))
    if problem is None and not all(layout.drift_chunk(path.parent, k).is_file() for k in range(len(data["chunks"]))):
        problem = "a chunk it names is missing"
    if problem:
        raise EvalParityError(f"{path} is not the reference of this drift folder ({problem}): rerun `evalparity drift`")
    return DriftReference(**{k: data[k] for k in DriftReference.TYPES})
