"""Named cell variants: ``--cell NAME=BACKEND:DTYPE[:key=value,...]``, and how two cells differ in words.

A release question is rarely "HF against vLLM" alone: it is fp8 weights against bf16, an fp8 KV cache, CUDA
graphs against eager, tensor parallel 2 against 1, the batch-invariant kernels, a checkpoint quantized
elsewhere. Each becomes a cell of its own with a name the user picks; its settings are part of its identity
(``spec.CellSpec``: recorded in cell.json, verified, refused on a resume that asks for other ones), and every
verdict that involves it says what it changes against the cell it is compared with (``difference``).

The keys of a variant are the backend's lm-eval model arguments (for vLLM, its engine arguments), as lm-eval's
``--model_args`` takes them, plus four of evalparity's own:

- ``env.VAR=value`` sets an environment variable of the cell's process (read at import: VLLM_BATCH_INVARIANT);
- ``model=PATH`` scores another checkpoint of the run's model (a quantized one), whose tokenizer must be the
  run model's (checked before any cell starts);
- ``python=NAME`` runs the cell under an interpreter named with ``--python NAME=/path/to/python``;
- ``batch_size=N`` the cell's batch size (default: the run's ``--batch-size``).

One engine argument also decides where the cell runs: ``tensor_parallel_size=N`` (vllm and server cells) gives
the cell N whole GPUs of its own (``spec.cell_gpus``), never a packed share of one, while the run's other cells
keep ``--tensor-parallel`` and may still share a GPU.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import replace

from evalparity.errors import EvalParityError
from evalparity.rundir.names import check_name
from evalparity.spec import (
    SHORT_DTYPE,
    TENSOR_PARALLEL_ARG,
    CellSpec,
    named_like_a_tagged_cell,
    parse_backend,
    parse_batch_size,
    parse_dtype,
    parse_gpus,
    takes_own_gpus,
)

ENV_PREFIX = "env."
OWN_KEYS = ("model", "python", "batch_size")  # evalparity's keys; everything else is the backend's
# Keys a variant may not set because the cell's syntax or the run owns them: the dtype is the DTYPE part, the
# model is ``model=`` (the run's model resolved, fingerprinted and its tokenizer checked), and the context
# length is one alignment setting for every cell (``--max-length``).
REFUSED = {"dtype": "the dtype is the part after the backend (vllm:bf16)",
           "pretrained": "give another checkpoint as model=PATH (its tokenizer is checked against the run's)",
           "max_model_len": "the context length is the same on every cell: --max-length",
           "max_length": "the context length is the same on every cell: --max-length",
           # files named by path would be read as they are when the cell loads, neither checked nor fingerprinted
           # as model= is (a resume after they changed would keep results made with the old ones)
           "tokenizer": "the tokenizer is the model's: give model=PATH, whose tokenizer is checked and whose files "
                        "are fingerprinted",
           "tokenizer_revision": "give the checkpoint as model=PATH (fingerprinted); revisions are not pinned here",
           "revision": "give the checkpoint as model=PATH (fingerprinted); revisions are not pinned here",
           "gguf_file": "give the checkpoint as model=PATH (fingerprinted)",
           "peft": "adapters are not fingerprinted yet: merge the adapter into a checkpoint and give it as model=PATH",
           "delta": "adapters are not fingerprinted yet: merge the delta into a checkpoint and give it as model=PATH",
           "lora_local_path": "adapters are not fingerprinted yet: merge the adapter into a checkpoint and give it "
                              "as model=PATH",
           # GPUs a cell takes are its tensor_parallel_size (spec.cell_gpus); these multiply them, unplaced: the
           # cell would get one GPU and vLLM fail at its load ("World size (2) is larger than ...")
           "pipeline_parallel_size": "a cell's GPUs are its tensor_parallel_size only: spread it with "
                                     "tensor_parallel_size=N instead",
           "data_parallel_size": "one cell is one engine: score data-parallel replicas as --repeat NAME:dpN "
                                 "shards instead"}
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables evalparity sets for a cell's process after the cell's own (cellenv.cell_environment, placement): a
# cell's value would be recorded but not be what ran.
OWN_ENV = ("PYTHONUNBUFFERED", "TOKENIZERS_PARALLELISM", "TQDM_MININTERVAL", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
           "CUDA_VISIBLE_DEVICES")
RESERVED_SUFFIX = re.compile(r"\.(r\d+|\d+of\d+)$")  # the suffixes of a staged run's parts and replicas
FORM = "NAME=BACKEND:DTYPE[:key=value,...], e.g. vllm-fp8=vllm:bf16:quantization=fp8"


def parse_pairs(text: str, flag: str) -> tuple[tuple[str, str], ...]:
    """``k=v,k=v`` as (key, value) pairs, in order, values as typed (lm-eval parses them); one line for an
    entry without ``=``, an empty key, or a key given twice."""
    out: list[tuple[str, str]] = []
    for item in [t.strip() for t in text.split(",") if t.strip()]:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise EvalParityError(f"{flag}: {item!r} is not key=value: write key=value,key=value, e.g. "
                                  "quantization=fp8,enforce_eager=false")
        if key in dict(out):
            raise EvalParityError(f"{flag}: {key} is given twice: keep one")
        out.append((key, value.strip()))
    return tuple(out)


def backend_pairs(pairs: tuple[tuple[str, str], ...], flag: str, backend: str) -> tuple[tuple[str, str], ...]:
    """The backend's own arguments, with the keys a cell may not set refused in one line, and a tensor-parallel
    size checked (``check_tensor_parallel``)."""
    for key, value in pairs:
        if key in REFUSED:
            raise EvalParityError(f"{flag}: {key} cannot be set per cell: {REFUSED[key]}")
        if key == TENSOR_PARALLEL_ARG:
            check_tensor_parallel(backend, value, flag)
    return pairs


def check_tensor_parallel(backend: str, value: str, flag: str) -> None:
    """``tensor_parallel_size=N`` on a cell: a whole number of GPUs (``spec.parse_gpus``), on a backend whose
    engine spreads a replica by it (``cell_tensor_parallel``: vllm, server); the placement then gives the cell
    N whole GPUs (``spec.cell_gpus``). An hf cell has no such engine argument: it splits its layers over the
    run's ``--tensor-parallel`` GPUs."""
    if not takes_own_gpus(backend):
        raise EvalParityError(f"{flag}: {TENSOR_PARALLEL_ARG} is not an argument of the {backend} backend: its "
                              "cells take the run's --tensor-parallel N (hf splits the layers over them); give "
                              f"{TENSOR_PARALLEL_ARG} to a vllm cell")
    parse_gpus(value, flag)


def parse_cell(text: str, batch_size: int | str, shards: int, backend_args: dict[str, str]) -> CellSpec:
    """One ``--cell`` as a cell: its name, backend, dtype, and the rest as backend arguments (over the
    backend's ``--hf-args``/``--vllm-args``), environment, model, interpreter and batch size."""
    flag = f"--cell {text}"
    name, eq, rest = text.partition("=")
    name = name.strip()
    if not eq or not name or not rest.strip():
        raise EvalParityError(f"bad --cell {text!r}: write {FORM}")
    check_name(name, "--cell name")
    if RESERVED_SUFFIX.search(name):  # a staged run's parts are <cell>.r<r> and <cell>.r<r>.<k>of<n>
        raise EvalParityError(f"--cell name {name!r} ends like a staged run's part or replica (.r<N>, .<K>of<N>), "
                              f"which would share its folders: choose another name")
    if named_like_a_tagged_cell(name):
        raise EvalParityError(f"--cell name {name!r} ends like a repeat's or a TF32 cell's (-bs<N>, -dp<N>, -tf32), "
                              "which take no part in the gating comparisons: choose another name")
    parts = rest.split(":", 2)  # values may hold ':' (a URL): only the first two separate
    if len(parts) < 2 or not parts[0].strip() or not parts[1].strip():
        raise EvalParityError(f"bad --cell {text!r}: write {FORM}")
    backend, dtype = parse_backend(parts[0]), parse_dtype(parts[1])
    pairs = parse_pairs(parts[2], flag) if len(parts) == 3 else ()
    env, own, engine = [], {}, []
    for key, value in pairs:
        if key.startswith(ENV_PREFIX):
            var = key[len(ENV_PREFIX):]
            if not ENV_NAME.fullmatch(var):
                raise EvalParityError(f"{flag}: {var!r} is not an environment variable's name: write env.NAME=value, "
                                      "e.g. env.VLLM_BATCH_INVARIANT=1")
            if var in OWN_ENV or var.startswith("EVALPARITY_"):
                raise EvalParityError(f"{flag}: evalparity sets {var} for every cell itself, so env.{var} would be "
                                      "recorded but not be what ran: drop it")
            env.append((var, value))
        elif key in OWN_KEYS:
            if not value:
                raise EvalParityError(f"{flag}: {key}= is empty: give a value or drop it")
            own[key] = value
        else:
            engine.append((key, value))
    engine_pairs = backend_pairs(tuple(engine), flag, backend)
    base = dict(parse_pairs(backend_args.get(backend, ""), f"--{backend}-args"))
    merged = tuple((base | dict(engine_pairs)).items())
    if "python" in own:
        check_name(own["python"], "python= name")
    size = parse_batch_size(own["batch_size"]) if "batch_size" in own else batch_size
    return CellSpec(backend, dtype, size, shards=shards, label=name, args=merged, env=tuple(env),
                    model=own.get("model", ""), python=own.get("python", ""))


def check_pair(a: str, b: str, names: list[str]) -> None:
    """A ``--compare A:B`` pair (its form parsed by ``stats.options.parse_compare``) names two cells of the
    run, B compared against A (A is B's reference in that row): one line otherwise."""
    if a == b:
        raise EvalParityError(f"--compare {a}:{b}: a cell compared with itself says nothing: name two cells")
    for x in (a, b):
        if x not in names:
            raise EvalParityError(f"--compare {a}:{b}: {x} is not a cell of this run: use one of {', '.join(names)}")


def parse_pythons(items: list[str]) -> tuple[tuple[str, str], ...]:
    """``--python NAME=/path/to/python`` (repeatable) as (name, absolute path) pairs, checked from the
    arguments alone: the form, a safe name given once, and a path (or a name on PATH) that is an executable
    file. The path keeps its symlinks (a venv's ``bin/python`` links to its base interpreter: resolved, it
    would leave the venv). Whether it is a Python that can run a cell is asked of it later
    (``cells.InterpreterProbes``)."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, path = (x.strip() for x in item.partition("="))
        if not eq or not name or not path:
            raise EvalParityError(f"bad --python {item!r}: write NAME=/path/to/python, e.g. "
                                  "--python new=/opt/venv-new/bin/python")
        check_name(name, "--python name")
        if name in out:
            raise EvalParityError(f"--python {name} is given twice: give each interpreter one name")
        found = shutil.which(path) if os.sep not in path else None  # a bare name (python3.12): looked up on PATH
        full = os.path.abspath(os.path.expanduser(found or path))
        if not os.path.isfile(full) or not os.access(full, os.X_OK):
            what = "does not exist" if not os.path.exists(full) else "is not an executable file"
            raise EvalParityError(f"--python {name}={path}: {full} {what}: give the path of a Python "
                                  "interpreter, e.g. /opt/venv-new/bin/python")
        out[name] = full
    return tuple(out.items())


def check_interpreter_names(cells: tuple[CellSpec, ...], pythons: tuple[tuple[str, str], ...]) -> None:
    """Every ``python=NAME`` of a cell is an interpreter ``--python`` names: one line for the first that is not."""
    named = dict(pythons)
    for cell in cells:
        if cell.python and cell.python not in named:
            given = f" (given: {', '.join(named)})" if named else ""
            raise EvalParityError(f"cell {cell.name} runs under python={cell.python}, which no --python names"
                                  f"{given}: add --python {cell.python}=/path/to/python")


# ------------------------------------------------------------------ how two cells differ, in words
def described(cell: CellSpec) -> dict:
    """A spec's cell as the fields of its cell.json record that ``settings_of`` reads."""
    return {"backend": cell.backend, "dtype": cell.dtype, "tf32": cell.tf32, "variant": cell.variant()}


def settings_of(meta: dict) -> dict[str, str]:
    """A cell's settings that make it what it is, flat (``backend``, ``dtype``, its variant's keys), from its
    cell.json record (``cells.cell_meta``) or a spec's cell entry."""
    dtype = str(meta.get("dtype"))
    out = {"backend": str(meta.get("backend")), "dtype": SHORT_DTYPE.get(dtype, dtype)}
    if meta.get("tf32"):
        out["tf32"] = "on"
    variant = meta.get("variant") or {}
    out |= {k: str(v) for k, v in (variant.get("args") or {}).items()}
    out |= {f"{ENV_PREFIX}{k}": str(v) for k, v in (variant.get("env") or {}).items()}
    for key in ("model", "python"):
        if variant.get(key):
            out[key] = str(variant[key])
    if variant.get("model_digest"):  # the weights at model= (the path alone may hold others by now)
        out["weights"] = str(variant["model_digest"])[:12]
    return out


def difference(reference: dict, cell: dict) -> str:
    """What ``cell`` changes against ``reference`` (both cell.json records), in one short line: the backend
    and dtype when they differ, then each setting the cell has that the reference has not (``key=value``),
    has otherwise (``key=value (ref: other)``) or lacks (``key unset (ref: value)``). "" when none differs."""
    a, b = settings_of(reference), settings_of(cell)
    out = []
    for key in ("backend", "dtype"):
        if a[key] != b[key]:
            out.append(b[key])
    keys = [k for k in b if k not in ("backend", "dtype")]
    for key in keys + [k for k in a if k not in b and k not in ("backend", "dtype")]:
        if key not in a:
            out.append(f"{key}={b[key]}")
        elif key not in b:
            out.append(f"{key} unset (ref: {a[key]})")
        elif a[key] != b[key]:
            out.append(f"{key}={b[key]} (ref: {a[key]})")
    return ", ".join(out)


# ------------------------------------------------------------------ the run's cells: the matrix and the variants
def reference_cell(reference: str, batch_size: int | str, shards: int) -> CellSpec | None:
    """The cell a ``backend-dtype`` reference name stands for (``hf-fp32``), or None when it is not one."""
    backend, sep, dtype = reference.partition("-")
    if not sep:
        return None
    try:
        return CellSpec(parse_backend(backend), parse_dtype(dtype), batch_size, shards=shards)
    except EvalParityError:
        return None


def is_named_repeat(text: str) -> bool:
    """``--repeat NAME:N`` or ``NAME:dpN`` (a repeat of a named cell), as against the matrix's
    ``backend:dtype:N``."""
    return text.count(":") == 1


def repeat_of(cells: list[CellSpec], text: str) -> CellSpec:
    """``--repeat NAME:N`` (another batch size) or ``NAME:dpN`` (split over N shards): the named cell again,
    with every setting of its variant, so that its own noise floor (what batch composition alone changes for
    it: fp8 kernels were batch-dependent where bf16 was not, on an H200) is measured beside what it changes."""
    name, _, how = (x.strip() for x in text.partition(":"))
    base = next((c for c in cells if c.name == name and not c.tag), None)
    if base is None:
        raise EvalParityError(f"bad --repeat {text!r}: {name} is not a cell of this run: write "
                              "backend:dtype:batch_size (e.g. hf:fp32:4), or NAME:batch_size for one of "
                              f"{', '.join(c.name for c in cells if not c.tag)}")
    low = how.lower()
    if low.startswith("dp") and low[2:].isdigit() and int(low[2:]) >= 1:
        n = int(low[2:])
        if n == base.shards:
            raise EvalParityError(f"--repeat {text} uses {name}'s {n} shard(s): a sharding repeat needs another count")
        return replace(base, tag=f"dp{n}", shards=n)
    if not how.isdigit() or int(how) < 1:
        raise EvalParityError(f"bad --repeat {text!r}: write NAME:batch_size or NAME:dpN, e.g. {name}:1")
    if int(how) == base.batch_size:
        raise EvalParityError(f"--repeat {text} uses {name}'s own batch size {how}: a repeat needs another one to "
                              "measure the noise floor")
    return replace(base, tag=f"bs{int(how)}", batch_size=int(how))


def run_cells(matrix: tuple[CellSpec, ...], typed: list[str], batch_size: int | str, shards: int,
              backend_args: dict[str, str], repeats: list[str] = ()) -> tuple[CellSpec, ...]:
    """The run's cells: the matrix's (each with its backend's ``--hf-args``/``--vllm-args``), the ``--cell``
    variants in the order given, then the repeats of named cells (``NAME:N``); a name given twice is
    refused in one line."""
    pairs = {b: backend_pairs(parse_pairs(text, f"--{b}-args"), f"--{b}-args", b) for b, text in backend_args.items()}
    out = [c if not pairs.get(c.backend) else replace(c, args=pairs[c.backend]) for c in matrix]
    out += [parse_cell(t, batch_size, shards, backend_args) for t in typed]
    out += [repeat_of(out, r) for r in repeats]
    names = [c.name for c in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise EvalParityError(f"cell {dup} is listed twice: give each --cell its own name, and none a name of "
                              "the matrix's (backend-dtype) cells")
    return tuple(out)
