"""``evalparity hidden``: chosen layers' hidden states of every prompt of a prompt file, batched, into a folder.

The parent (``run_hidden``, called by ``cli/hidden.py``) plans the side exactly as ``evalparity drift`` plans a
cell (``drift.launch_plan``: the backend's lm-eval model arguments and the process environment), and starts
one worker process for it (``python -m evalparity.hidden STAGE main``) with that environment, which loads the
model through the backend's ``create_lm`` and its ``drift_probe`` (``drift.worker.load_side``), encodes the
prompts, probes each distinct token sequence once (pooled to its last token or its mean on the device) and
writes ``hidden.safetensors`` (``layer.<entry>``: ``[n_prompts, H]`` float32, ``prompt_index``: int64) and
``prompts.parquet`` (index, id, text, n_tokens, truncated). With ``--check N`` a second worker loads the
*other* backend at the same dtype, probes the first N prompts on the main side's token ids and records the
relative error and cosine per entry. The parent then publishes the files and writes ``hidden.json`` last:
a folder with ``hidden.json`` is a finished output.

Entries are drift's (``probes``): 0 the embeddings, i the residual stream after decoder layer i-1, L the final
norm's output; negative numbers count from the end (-1: L).

Everything is written inside the output folder: the workers into ``DIR/.hidden-stage/`` (removed at the end),
their engine logs into ``DIR/<backend>.log``, the published files by a rename each.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console

from evalparity import backends, procs, progress, slim
from evalparity.devices import check_cuda
from evalparity.drift import prompt_lines, prompts_from_file
from evalparity.errors import EXIT_CELL_FAILED, EXIT_USAGE, EvalParityError, worker_main
from evalparity.files import atomic_target, read_json, sha256, write_json
from evalparity.progress_file import ProgressFile
from evalparity.spec import SHORT_DTYPE

SCHEMA = "evalparity.hidden/1"
RECORD, TENSORS, TABLE = "hidden.json", "hidden.safetensors", "prompts.parquet"
STAGE = ".hidden-stage"
POOLINGS = ("last", "mean")
CHUNK_TOKENS = 1 << 16  # tokens handed to one probe call: a progress step, and the pooled rows' peak on the device


# ---------------------------------------------------------------- the parent's side
def read_prompts(path: Path) -> tuple[list[str], list]:
    """The prompts of a prompt file (``drift.prompts_from_file``: .txt one a line, .jsonl with ``prompt``)
    and their ids: a .jsonl row's ``id`` where it has one, else the prompt's 0-based line number in the file.
    Ids are kept as integers where all are and fit a signed 64-bit column, else as text (an unsigned 64-bit
    hash id, say, is written as its digits); a repeated id is refused."""
    texts = prompts_from_file(path)
    lines = prompt_lines(path)
    ids: list = []
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        row = json.loads(line) if path.suffix == ".jsonl" else {}
        ids.append(row.get("id", n) if isinstance(row, dict) else n)
    if len(ids) != len(texts):  # prompts_from_file reads the same lines: a mismatch is a bug here
        raise AssertionError(f"{len(ids)} ids for {len(texts)} prompts")
    if not all(isinstance(x, int) and not isinstance(x, bool) and -(1 << 63) <= x < (1 << 63) for x in ids):
        ids = [x if isinstance(x, str) else json.dumps(x) for x in ids]
    seen: dict = {}
    for k, x in enumerate(ids):
        if x in seen:
            raise EvalParityError(f"{path}: prompt id {x!r} is given twice (prompts {seen[x] + 1} and {k + 1}): "
                                  "give every prompt its own id, or drop the 'id' fields")
        seen[x] = k
    if not texts:
        raise EvalParityError(f"prompt file {path} holds no prompts")
    return texts, ids


def other_backend(backend: str) -> str:
    """The backend the check compares with: HF for any backend but HF, vLLM for HF."""
    return "vllm" if backend == "hf" else "hf"


def request_of(*, model_path: str, backend: str, dtype: str, layers: list[int] | None, pooling: str,
               max_len: int, check: int, device: str, prompts: Path) -> dict:
    """What makes two runs of ``hidden`` the same: a finished folder of the same request is not redone."""
    return {"model": model_path, "backend": backend, "dtype": dtype, "layers": layers, "pooling": pooling,
            "max_length": max_len, "check": check, "device": device, "prompts_sha256": sha256(prompts)}


def leftovers(folder: Path) -> bool:
    """Whether ``folder`` holds only what an unfinished ``hidden`` left there (its logs and staging folder)."""
    from evalparity.rundir import contents

    logs = {f"{b}.log" for b in backends.names()}
    return all(p.name in logs or p.name == STAGE for p in contents(folder))


def finished(folder: Path, request: dict) -> dict | None:
    """``folder``'s record when it is a finished output of ``request``; None when it holds nothing or only
    leftovers (it is then written over); a one-line error for anything else."""
    from evalparity.rundir import contents

    if not contents(folder) or leftovers(folder):
        return None
    record = read_json(folder / RECORD)
    if record is None or record.get("schema") != SCHEMA:
        raise EvalParityError(f"--out {folder} is not empty and not an output of `evalparity hidden`: give an empty "
                              "or new folder")
    old = record.get("request") or {}
    differ = sorted(k for k in set(old) | set(request) if old.get(k) != request.get(k))
    if differ:
        raise EvalParityError(f"--out {folder} holds the hidden states of another request (it differs in "
                              f"{', '.join(differ)}): give another --out, or remove that folder first")
    if not all((folder / f).is_file() for f in (TENSORS, TABLE)):
        raise EvalParityError(f"--out {folder} has {RECORD} but not {TENSORS} and {TABLE}: remove the folder and "
                              "run again")
    seals = record.get("seals")
    for name in (TENSORS, TABLE):  # emptied or edited, it was "already done: nothing to do" (session 32's review)
        seal = seals.get(name) if isinstance(seals, dict) else None
        path = folder / name
        if not isinstance(seal, dict) or path.is_symlink() or path.stat().st_size != seal.get("bytes") \
                or sha256(path) != seal.get("sha256"):
            raise EvalParityError(f"--out {folder}: {name} is not the file {RECORD} records (edited, truncated, or "
                                  "written by an older evalparity): remove the folder and run again")
    return record


def cell_name(backend: str, dtype: str) -> str:
    return f"{backend}-{SHORT_DTYPE[dtype]}"


def run_hidden(request: dict, launch: dict[str, dict], texts: list[str], ids: list, out: Path, *,
               model_id: str, console: Console | None = None) -> dict:
    """The main side's worker, then the check's (when ``request['check']``), into ``out``; the record
    written to ``out/hidden.json`` and returned. ``launch``: ``drift.launch_plan`` of the main side's cell
    (first) and, with a check, the other backend's."""
    console = console or Console(stderr=True)
    names = list(launch)
    main = names[0]
    check = names[1] if request["check"] and len(names) > 1 else None
    stage = out / STAGE
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    write_json(stage / "request.json", {"request": request, "launch": launch, "main": main, "check": check,
                                        "texts": texts, "ids": ids})
    t0 = time.perf_counter()
    before = procs.process_age()  # this command's own start: imports, the prompts read, the checks
    units = [main] + ([f"check {check}"] if check else [])
    try:
        with progress.display(console, units, f"hidden states of {len(texts):,} prompts", total=len(units)) as shown:
            _worker(stage, "main", main, launch[main]["env"], out, shown, main)
            if check:
                _worker(stage, "check", check, launch[check]["env"], out, shown, units[1])
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)  # the logs stay: a rerun takes the folder over
        raise
    side = json.loads((stage / "main.json").read_text())
    checked = json.loads((stage / "check.json").read_text()) if check else None
    seals = {name: {"sha256": sha256(stage / name), "bytes": (stage / name).stat().st_size}
             for name in (TENSORS, TABLE)}
    for name in (TENSORS, TABLE):
        os.replace(stage / name, out / name)
    record = {
        "schema": SCHEMA, "request": request, "model": model_id, "model_path": request["model"],
        "backend": request["backend"], "dtype": request["dtype"], "device": side["device"],
        "layers": request["layers"] if request["layers"] is not None else "all",
        "entries": side["entries"], "entry_of_layer": side["entry_of_layer"], "n_entries": side["n_entries"],
        "hidden_size": side["hidden_size"], "pooling": request["pooling"], "max_length": request["max_length"],
        "n_prompts": len(texts), "n_unique": side["n_unique"], "n_truncated": side["n_truncated"],
        "timings": side["timings"] | {"total_s": time.perf_counter() - t0, "command_start_s": before},
        "prompts_per_s": side["prompts_per_s"],
        "check": checked if check else {"off": True},
        "files": {"tensors": TENSORS, "prompts": TABLE, "log": f"{request['backend']}.log"},
        "seals": seals,  # what ``finished`` checks before it calls the folder done
        "launch": {n: {k: v for k, v in launch[n].items() if k != "env"} for n in names},
        # what the engine ran with (its backend's loaded settings, e.g. vLLM's model runner and kernel
        # warm-up, and the variables that steer it), as a run's cell and a drift's side record it
        "engine": side.get("engine"),
        "attention": side.get("attention"),  # an HF probe's allowed attention kernels (backends.probes)
    }
    write_json(out / RECORD, record)
    shutil.rmtree(stage, ignore_errors=True)
    return record


def _worker(stage: Path, side: str, name: str, env: dict[str, str], out: Path, shown: progress.Display,
            unit: str) -> None:
    """One side's worker process, its progress shown on ``shown``; a one-line error when it fails (exit 2 for
    what the worker found wrong with the input, 5 for a crash), naming its log."""
    log_path = out / f"{name.split('-')[0]}.log"
    prog = stage / f".{side}.progress.json"
    t0 = time.perf_counter()
    code, said, last = procs.run_logged([sys.executable, "-m", "evalparity.hidden", str(stage), side], env,
                                        log_path, lambda: shown.watch(unit, prog))
    if code != 0:
        shown.finished(unit, "failed")
        raise EvalParityError(f"{unit} failed: {(said or last)[:300]} (log: {log_path})",
                              EXIT_USAGE if said else EXIT_CELL_FAILED)
    shown.overall(advance=1)
    shown.finished(unit, f"done in {time.perf_counter() - t0:.1f} s")


# ---------------------------------------------------------------- the worker's side
def distinct(ids: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct token sequences, in first-seen order, and each prompt's row among them."""
    rows: dict[tuple, int] = {}
    index = [rows.setdefault(tuple(x), len(rows)) for x in ids]
    return [list(k) for k in rows], index


def probe_pooled(probe, prompts: list[list[int]], entries: list[int], pooling: str, report=None) -> dict:
    """entry -> ``[len(prompts), H]`` float32 on the CPU: each prompt's pooled hidden state. Prompts go to the
    probe sorted by length, in calls of about ``CHUNK_TOKENS`` tokens (each call batched by the probe)."""
    import torch  # heavy: torch (the worker only)

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out = {e: torch.empty(len(prompts), probe.hidden_size, dtype=torch.float32) for e in entries}
    done, at = 0, 0
    while at < len(order):
        chunk, tokens = [], 0
        while at < len(order) and (not chunk or tokens + len(prompts[order[at]]) <= CHUNK_TOKENS):
            chunk.append(order[at])
            tokens += len(prompts[order[at]])
            at += 1
        got = probe.forward([prompts[i] for i in chunk], entries, pooling, logprobs=False)
        rows = torch.as_tensor(chunk)
        for e in entries:
            out[e][rows] = got.hidden[e].to("cpu", torch.float32)
        done += len(chunk)
        if report:
            report(done)
    return out


def _encode(probe, texts: list[str], keep: int) -> tuple[list[list[int]], list[int]]:
    encoded = probe.encode(texts) if texts else []  # once: the full lengths say what --max-length cut
    full = [len(x) for x in encoded]
    ids = [list(x)[:keep] for x in encoded]
    empty = [i for i, x in enumerate(ids) if not x]
    if empty:
        raise EvalParityError(f"prompt {empty[0] + 1} encodes to no tokens: drop it from the prompt file")
    return ids, full


def work_main(stage: Path, req: dict, prog: ProgressFile) -> dict:
    import pyarrow as pa  # heavy: pyarrow (pandas' import, a second on a fresh machine, is not needed here)
    import pyarrow.parquet as pq  # heavy: pyarrow
    import torch  # heavy: torch
    from safetensors.torch import save_file  # heavy: safetensors (with torch)

    from evalparity.drift.worker import load_side, resolve_entries

    r = req["request"]
    texts, ids = req["texts"], req["ids"]
    check_cuda(r["device"])
    prog.update(phase="loading", force=True)
    started = procs.process_age()  # the worker's own start, imports included, before its load
    t0 = time.perf_counter()
    probe = load_side({"launch": req["launch"]}, req["main"])
    load_s = time.perf_counter() - t0
    entries = resolve_entries(r["layers"], probe.n_entries)
    asked = r["layers"] if r["layers"] is not None else entries
    prog.update(phase="encoding", force=True)
    t1 = time.perf_counter()
    tokens, full = _encode(probe, texts, r["max_length"])
    uniq, index = distinct(tokens)
    encode_s = time.perf_counter() - t1
    prog.update(phase="probing", n=0, total=len(uniq), force=True)
    t2 = time.perf_counter()
    pooled = probe_pooled(probe, uniq, entries, r["pooling"], lambda n: prog.update(n=n))
    forward_s = time.perf_counter() - t2
    prog.update(phase="writing", force=True)
    t3 = time.perf_counter()
    rows = torch.as_tensor(index)
    with atomic_target(stage / TENSORS) as tmp:
        save_file({**{f"layer.{e}": pooled[e][rows].contiguous() for e in entries},
                   "prompt_index": torch.arange(len(texts), dtype=torch.int64)}, str(tmp),
                  metadata={"schema": SCHEMA, "pooling": r["pooling"], "entries": ",".join(map(str, entries))})
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # safetensors writes 0600; the folder's other files follow the umask
    truncated = [n > len(x) for n, x in zip(full, tokens)]
    table = pa.table({"index": pa.array(range(len(texts)), pa.int64()), "id": ids, "text": pa.array(texts, pa.string()),
                      "n_tokens": pa.array([len(x) for x in tokens], pa.int64()), "truncated": pa.array(truncated)})
    with atomic_target(stage / TABLE) as tmp:
        pq.write_table(table, tmp)
    write_s = time.perf_counter() - t3
    n_check = min(r["check"], len(texts))
    return {"entries": entries, "entry_of_layer": {str(a): a + probe.n_entries if a < 0 else a for a in asked},
            "n_entries": probe.n_entries, "hidden_size": probe.hidden_size, "device": str(probe.device),
            "n_unique": len(uniq), "n_truncated": sum(truncated),
            "timings": {"worker_start_s": started, "load_s": load_s, "encode_s": encode_s, "forward_s": forward_s,
                        "write_s": write_s},
            "prompts_per_s": len(texts) / forward_s if forward_s > 0 else None,
            "check_ids": tokens[:n_check], "engine": getattr(probe, "engine", None),
            "attention": getattr(probe, "attention", None)}


def work_check(stage: Path, req: dict, prog: ProgressFile) -> dict:
    """The other backend on the main side's token ids of the first N prompts, against the main side's rows."""
    import torch  # heavy: torch
    from safetensors.torch import load_file  # heavy: safetensors (with torch)

    from evalparity.drift.worker import load_side

    r = req["request"]
    check_cuda(r["device"])
    main = json.loads((stage / "main.json").read_text())
    ids = main["check_ids"]
    prog.update(phase="loading", force=True)
    t0 = time.perf_counter()
    probe = load_side({"launch": req["launch"]}, req["check"])
    load_s = time.perf_counter() - t0
    if probe.n_entries != main["n_entries"] or probe.hidden_size != main["hidden_size"]:
        raise EvalParityError(f"the check's {req['check']} has {probe.n_entries} hidden-state entries of "
                              f"{probe.hidden_size} and {req['main']} {main['n_entries']} of {main['hidden_size']}: "
                              "they did not load the same model")
    mine, _ = _encode(probe, req["texts"][:len(ids)], r["max_length"])
    mismatches = sum(a != b for a, b in zip(ids, mine))
    uniq, index = distinct(ids)
    prog.update(phase="probing", n=0, total=len(uniq), force=True)
    t1 = time.perf_counter()
    pooled = probe_pooled(probe, uniq, main["entries"], r["pooling"], lambda n: prog.update(n=n))
    forward_s = time.perf_counter() - t1
    theirs = load_file(str(stage / TENSORS))
    rows = torch.as_tensor(index)
    out = []
    for e in main["entries"]:
        a = theirs[f"layer.{e}"][:len(ids)].double()
        b = pooled[e][rows].double()
        if a.shape != b.shape:
            raise EvalParityError(f"entry {e}: {req['main']} gave {tuple(a.shape)} and the check's {req['check']} "
                                  f"{tuple(b.shape)}")
        cos = torch.nn.functional.cosine_similarity(a, b, dim=1)
        out.append({"entry": e, "rel_error": float((b - a).norm() / a.norm().clamp_min(1e-30)),
                    "cosine": float(cos.mean()), "cosine_min": float(cos.min()),
                    "max_abs": float((b - a).abs().max())})
    return {"backend": req["check"].split("-")[0], "dtype": r["dtype"], "n_prompts": len(ids), "entries": out,
            "tokenization_mismatches": mismatches, "device": str(probe.device),
            "timings": {"load_s": load_s, "forward_s": forward_s}, "engine": getattr(probe, "engine", None),
            "attention": getattr(probe, "attention", None)}


def main(argv: list[str]) -> int:
    slim.apply()  # before the model libraries: transformers without scikit-learn and SciPy (evalparity/slim.py)
    stage, side = Path(argv[0]), argv[1]
    req = json.loads((stage / "request.json").read_text())
    prog = ProgressFile(stage / f".{side}.progress.json")
    result = work_main(stage, req, prog) if side == "main" else work_check(stage, req, prog)
    write_json(stage / f"{side}.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(main, sys.argv[1:]))
