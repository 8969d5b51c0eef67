"""One side of a drift in its own process: ``python -m evalparity.drift.worker DRIFT_DIR CELL``.

The reference goes first (``CELL`` the drift spec's reference): it probes every prompt once, batched, and
keeps its hidden states chunk by chunk in ``reference/`` (float32 safetensors) with its logprobs and
generations. Each cell then loads those chunks straight onto its own device, probes the same prompts in the
same chunks and reduces the differences there (``measure``): only the reductions leave the GPU, unless ``--dump``.

Each side runs in a process of its own, with its own environment variables (set by the parent before the
engine is imported) and its own precision mode, and loads its model through its backend's ``create_lm``
with the engine arguments the drift spec gives it: a run's cell is probed as the run configured it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from evalparity import backends, hostenv, slim
from evalparity.backends import precision
from evalparity.backends.probes import HiddenBatch
from evalparity.drift.measure import DriftAccumulator
from evalparity.errors import EvalParityError, worker_main
from evalparity.files import atomic_target, read_json, write_json
from evalparity.hostuse import cpu_usage, usage_since
from evalparity.progress_file import ProgressFile
from evalparity.rundir import layout, records

# The hidden states of one chunk of prompts, per side, at most about this much. The reference brings each
# chunk to the host as soon as it is probed (``on_host``) and hands it to one of WRITERS threads, holding up
# to WRITERS + 1 chunks in host memory and one on its device; a cell holds two on its device (``prefetched``).
# Measured on an H200 host: the reference's probe waited for its one writer (``drift28v2``: the GPU 0-9 %
# busy for most of the 6.6 s), and three threads wrote 6 GiB of chunks in 1.19 s where one took 0.8-1.1 s
# for 2 GiB (results/drift-h200, session 29).
CHUNK_BYTES = 1 << 30
WRITERS = 3


def resolve_entries(layers: list[int] | None, n_entries: int) -> list[int]:
    """``--layers`` (None: all) as hidden-state entries 0..n_entries-1; negative counts from the end (-1: the
    final norm's output)."""
    if layers is None:
        return list(range(n_entries))
    out = sorted({e + n_entries if e < 0 else e for e in layers})
    bad = [e for e in layers if not -n_entries <= e < n_entries]
    if bad:
        raise EvalParityError(f"--layers {','.join(map(str, bad))} is outside this model's hidden-state entries "
                              f"0..{n_entries - 1} (or -{n_entries}..-1): 0 is the embeddings, "
                              f"{n_entries - 1} the final norm's output")
    return out


def load_side(spec: dict, name: str):
    """The probe of one side (reference or cell), loaded as the drift spec's launch of it says."""
    launch = spec["launch"][name]
    if launch["dtype"] == "float32":
        precision.apply(not launch["tf32"])
    if shares_gpu(spec, name) and launch.get("gpu_budget_gib") and \
            getattr(backends.get(launch["backend"]), "drift_memory_capped", False):
        cap_gpu_memory(float(launch["gpu_budget_gib"]), launch["model_args"].get("device"))
    shell = dict(os.environ)  # before the engine's import sets some of its own (as a cell records it)
    backend = backends.get(launch["backend"])
    lm = backend.create_lm(dict(launch["model_args"]))
    probe = backend.drift_probe(lm)
    # what the engine ran with, for the record: compared with the run's cell (``drift.engine_warnings``)
    engine = {"settings": backend.loaded_settings(lm), "variables": hostenv.steering_variables(shell)}
    try:
        probe.engine = engine
    except AttributeError:  # a probe that takes no attributes: no engine record (the warning then says nothing)
        pass
    return probe


def shares_gpu(spec: dict, name: str) -> bool:
    """Whether side ``name`` is probed beside others on its GPU: every side, where they all start at once
    (``reference_too``); else a cell among several probed together (``together``), never the reference,
    which then runs alone."""
    if spec.get("reference_too"):
        return True
    return bool(spec.get("together")) and name != spec.get("reference") and len(spec.get("cells") or []) > 1


def cap_gpu_memory(gib: float, device: str | None = None) -> None:
    """This process's CUDA caching allocator held to ``gib`` (``torch.cuda.set_per_process_memory_fraction``):
    at the cap it gives its cached blocks back and retries before it fails. Why: sides probed together share
    a GPU on the strength of the run's memory plan, and with five sides peaking at once an HF probe held 25.5
    GiB where the plan gave its cell 22.6, and a vLLM cell ran out of memory; with the cap (and the wait for
    the reference's end) the GPU's peak fell from up to 139.8 to 114.5 GiB (results/drift-h200, session 21).
    Only for backends whose probe holds nothing outside the allocator (``drift_memory_capped``). ``device``:
    the side's (its model arguments' ``cuda:N``), else the current one."""
    if not torch.cuda.is_available():
        return
    d = torch.device(device or "cuda")
    index = d.index if d.type == "cuda" and d.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * 2**30 / total), index)


def peak_gpu_gib(device) -> float | None:
    """The most GPU memory this process's torch allocator held on the probe's ``device`` (a vLLM engine's KV
    cache included: it runs in this process), for the drift record: what sides probed together really took
    beside the plan's shares."""
    d = torch.device(device)
    return round(torch.cuda.max_memory_reserved(d) / 2**30, 2) if d.type == "cuda" else None


def encode(probe, texts: list[str], keep: int) -> list[list[int]]:
    return [list(ids)[:keep] for ids in probe.encode(texts)]


def chunk_prompts(ids: list[list[int] | None], n_entries: int, hidden: int) -> list[list[int]]:
    """The probed prompts (not None) sorted by length, cut into chunks of at most ``CHUNK_BYTES`` of hidden
    states at float32 (or one prompt, where one is more)."""
    per_token = max(1, n_entries * hidden * 4)
    order = sorted((i for i, x in enumerate(ids) if x is not None), key=lambda i: len(ids[i]))
    budget = CHUNK_BYTES // per_token
    chunks: list[list[int]] = []
    tokens = 0
    for i in order:
        if not chunks or (chunks[-1] and tokens + len(ids[i]) > budget):
            chunks.append([])
            tokens = 0
        chunks[-1].append(i)
        tokens += len(ids[i])
    return chunks


def check_room(out: Path, ids: list[list[int] | None], n_entries: int, hidden: int, pooling: str, *, cells: int,
               dump: bool) -> None:
    """Refuse, before the first chunk is written, a reference that would not fit on the drift folder's disk:
    float32 hidden states of every probed token (or prompt, with ``--positions last``) at every chosen entry;
    with ``--dump``, each cell's too. A 14B-shaped model's 49 entries take 1 MB a token."""
    rows = sum(len(x) if pooling == "all" else 1 for x in ids if x is not None)
    need = rows * n_entries * hidden * 4 * (1 + (cells if dump else 0))
    free = shutil.disk_usage(out).free
    if need > 0.9 * free:
        raise EvalParityError(f"the reference's hidden states need about {need / 2**30:.1f} GiB in {out} and "
                              f"{free / 2**30:.1f} GiB is free: use --positions last, fewer --layers or fewer "
                              "prompts" + (", or drop --dump" if dump else ""))


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied into host memory whose pages are touched first (``zero_`` touches them on every core).
    Measured on an H200 host (results/drift-h200, session 29): ``.cpu()`` of a 1 GiB chunk took 0.89 s and
    three at once in three threads 2.66 s (they queue), where an empty tensor zeroed and copied into took
    0.21 s and three at once 0.54 s; the copy itself, into touched pages, 0.09 s. A non-blocking copy into
    pinned memory was no way out: allocating 2 GiB of it blocked the caller 2.25-2.60 s."""
    if t.device.type == "cpu":
        return t
    out = torch.empty(t.shape, dtype=t.dtype)
    out.zero_()
    out.copy_(t)
    return out


def on_host(batch: HiddenBatch) -> HiddenBatch:
    """The batch with its hidden states in host memory (``host_copy``), copied by the caller's thread on its
    own stream, so that a writer thread holds no device memory and needs no ordering with the device."""
    return HiddenBatch({e: host_copy(h.contiguous()) for e, h in batch.hidden.items()}, batch.lengths,
                       batch.logprobs, batch.pooling)


def save_chunk(path: Path, batch: HiddenBatch) -> None:
    """One chunk as float32 safetensors (a tensor still on a device is brought to the host here)."""
    from safetensors.torch import save_file  # heavy: safetensors (with torch)

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_target(path) as tmp:
        save_file({**{f"entry.{e}": host_copy(h.contiguous()) for e, h in batch.hidden.items()},
                   "logprobs": batch.logprobs.contiguous(),
                   "lengths": torch.as_tensor(batch.lengths, dtype=torch.int64)}, str(tmp))


def load_chunk(path: Path, device: torch.device, pooling: str) -> HiddenBatch:
    from safetensors.torch import load_file  # heavy: safetensors (with torch)

    t = load_file(str(path), device=str(device))
    hidden = {int(k.split(".", 1)[1]): v for k, v in t.items() if k.startswith("entry.")}
    return HiddenBatch(hidden, t["lengths"].tolist(), t["logprobs"].cpu(), pooling)


def prefetched(out: Path, chunks: list[list[int]], matched: set[int], device: torch.device, pooling: str):
    """(k, chunk, the reference's batch of chunk k on ``device``, the seconds the caller waited for it) for
    each chunk, the next one read from disk in a thread while the caller probes this one: reading a chunk (up
    to ``CHUNK_BYTES`` of float32) onto the GPU took about as long as probing it, so overlapping the two keeps
    the GPU working. A chunk none of whose prompts are matched is not read (None). At most two chunks are
    held at once."""
    from concurrent.futures import ThreadPoolExecutor

    def read(k: int) -> HiddenBatch | None:
        if not any(i in matched for i in chunks[k]):
            return None
        return load_chunk(layout.drift_chunk(layout.drift_reference(out), k), device, pooling)

    with ThreadPoolExecutor(max_workers=1) as pool:
        nxt = pool.submit(read, 0) if chunks else None
        for k, chunk in enumerate(chunks):
            t = time.perf_counter()
            loaded = nxt.result()
            waited = time.perf_counter() - t
            nxt = pool.submit(read, k + 1) if k + 1 < len(chunks) else None
            yield k, chunk, loaded, waited
            del loaded


def subset(batch: HiddenBatch, chunk: list[int], keep: list[int]) -> HiddenBatch:
    """The rows of the prompts ``keep`` (a subsequence of ``chunk``, the batch's prompts)."""
    if keep == chunk:
        return batch
    at = {i: k for k, i in enumerate(chunk)}
    rows = batch.lengths if batch.pooling == "all" else [1] * len(chunk)
    starts = [0]
    for n in rows:
        starts.append(starts[-1] + n)
    lp_starts = [0]
    for n in batch.lengths:
        lp_starts.append(lp_starts[-1] + n - 1)
    idx = torch.cat([torch.arange(starts[at[i]], starts[at[i] + 1]) for i in keep])
    lp = torch.cat([torch.arange(lp_starts[at[i]], lp_starts[at[i] + 1]) for i in keep])
    return HiddenBatch({e: h[idx.to(h.device)] for e, h in batch.hidden.items()},
                       [batch.lengths[at[i]] for i in keep], batch.logprobs[lp], batch.pooling)


def probe_reference(out: Path, spec: dict, prompts: list[str], progress: ProgressFile) -> None:
    t0 = time.perf_counter()
    probe = load_side(spec, spec["reference"])
    load_s = time.perf_counter() - t0
    entries = resolve_entries(spec.get("layers"), probe.n_entries)
    keep = spec["max_len"] - spec["gen_tokens"]
    ids: list[list[int] | None] = encode(probe, prompts, keep)
    first: dict[tuple, int] = {}
    for i, x in enumerate(ids):
        if len(x) < 2 or first.setdefault(tuple(x), i) != i:  # too short to score, or probed already
            ids[i] = None
    chunks = chunk_prompts(ids, len(entries), probe.hidden_size)
    folder = layout.drift_reference(out)
    check_room(out, ids, len(entries), probe.hidden_size, spec["pooling"], cells=len(spec["launch"]) - 1,
               dump=bool(spec.get("dump")))
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    # the host's use over the probe and the generation (hostuse), beside their wall time: the first drift on a
    # fresh H200 (drift24a, drift25a, drift28v2, drift30, drift31a) had its HF cells probe in about twice the
    # time of the later ones, with more CPU; these records pointed at it, and session 31 found the cause
    # (cuDNN's attention compiling its kernels: backends.probes.SDPA_KERNELS, results/drift-h200)
    t1, w1, u1 = time.perf_counter(), time.time(), cpu_usage()
    done, write_wait = 0, 0.0
    steps: list[list[float]] = []  # per chunk: its start in the probe window, seconds in the forward, to the host
    writes: deque = deque()
    with ThreadPoolExecutor(max_workers=WRITERS) as pool:
        for k, chunk in enumerate(chunks):
            t = time.perf_counter()
            batch = probe.forward([ids[i] for i in chunk], entries, spec["pooling"])
            t_fwd = time.perf_counter()
            batch = on_host(batch)
            steps.append([round(t - t1, 3), round(t_fwd - t, 3), round(time.perf_counter() - t_fwd, 3)])
            while len(writes) >= WRITERS:  # at most WRITERS chunks on their way to the disk (held on the host)
                write_wait += _drain(writes.popleft())
            writes.append(pool.submit(save_chunk, layout.drift_chunk(folder, k), batch))
            del batch
            done += len(chunk)
            progress.update(phase="reference", n=done, total=sum(map(len, chunks)))
        probe_s, probe_usage = time.perf_counter() - t1, usage_since(u1)
        t2, w2, u2 = time.perf_counter(), time.time(), cpu_usage()
        gens = None
        for w in writes:  # a write that failed already: raise it now, not after the generation
            if w.done():
                w.result()
        if spec["gen_tokens"]:  # while the last chunks are written
            order = [i for c in chunks for i in c]
            gens = dict(zip(map(str, order), probe.generate([ids[i] for i in order], spec["gen_tokens"])))
        generate_s, w3, generate_usage = time.perf_counter() - t2, time.time(), usage_since(u2)
        while writes:
            write_wait += _drain(writes.popleft())
    records.write_drift_reference(out, records.DriftReference(
        spec["reference"], ids, chunks, entries, probe.n_entries, spec["pooling"], gens,
        {"load_s": load_s, "probe_s": probe_s, "generate_s": generate_s, "write_wait_s": write_wait,
         "peak_gpu_gib": peak_gpu_gib(probe.device),
         "chunks": {"columns": ["at_s", "forward_s", "to_host_s"], "rows": steps},
         "probe_host": probe_usage, "generate_host": generate_usage,
         "windows": {"probe": [w1, w2], "generate": [w2, w3]}}, getattr(probe, "engine", None),
        getattr(probe, "attention", None)))


def _drain(write) -> float:
    """Seconds spent waiting for one chunk's write (it raises what the write raised)."""
    t = time.perf_counter()
    write.result()
    return time.perf_counter() - t


WAIT_POLL_S = 0.1


def wait_to_probe(out: Path, spec: dict, cell: str, progress: ProgressFile) -> float:
    """In a drift whose sides all start at once (``reference_too``), the seconds this loaded cell waited: until
    the reference's process has ended, having written its record, and every other cell has loaded or ended
    (``layout.drift_sync``), so that the cells probe side by side, none of them beside another's engine start,
    and none beside the reference's memory. A reference that ended without its record is an EvalParityError."""
    if not spec.get("reference_too"):
        return 0.0
    t0 = time.perf_counter()
    write_json(layout.drift_sync(out, cell, "loaded"), {"pid": os.getpid()})
    progress.update(phase="waiting for the reference", force=True)
    ref, others = spec["reference"], [c for c in spec["cells"] if c != cell]
    while True:
        ended = read_json(layout.drift_sync(out, ref, "ended"))
        if ended is not None and (ended.get("returncode") != 0
                                  or not (layout.drift_reference(out) / "reference.json").exists()):
            raise EvalParityError(f"the reference {ref} failed, so this cell has nothing to compare with: see "
                                  f"{layout.drift_log(out, ref).name}")
        if ended is not None and all(layout.drift_sync(out, c, "loaded").exists()
                                     or layout.drift_sync(out, c, "ended").exists() for c in others):
            return time.perf_counter() - t0
        time.sleep(WAIT_POLL_S)


def probe_cell(out: Path, spec: dict, cell: str, prompts: list[str], progress: ProgressFile) -> dict:
    t0 = time.perf_counter()
    probe = load_side(spec, cell)
    load_s = time.perf_counter() - t0
    wait_s = wait_to_probe(out, spec, cell, progress)
    ref = records.read_drift_reference(out)
    if probe.n_entries != ref.n_entries:
        raise EvalParityError(f"{cell} has {probe.n_entries} hidden-state entries and the reference "
                              f"{ref.n_entries}: they are not the same model")
    keep = spec["max_len"] - spec["gen_tokens"]
    mine = encode(probe, prompts, keep)
    acc = DriftAccumulator()
    matched: set[int] = set()
    for i, (a, b) in enumerate(zip(ref.ids, mine)):
        if a is None:
            continue
        if a != b:
            pos = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            acc.tokenization_mismatches.append({"prompt": i, "first_difference": pos, "reference_len": len(a),
                                                "cell_len": len(b), "text": prompts[i][:200]})
        else:
            matched.add(i)
    decode = probe.tokenizer.decode
    dump = layout.drift_dump(out, cell) if spec.get("dump") else None
    t1, w1, u1 = time.perf_counter(), time.time(), cpu_usage()
    done, read_wait = 0, 0.0
    steps: list[list[float]] = []  # per chunk probed: its start in the probe window, read wait, forward, compare
    for k, chunk, loaded, waited in prefetched(out, ref.chunks, matched, probe.device, ref.pooling):
        read_wait += waited
        keep_idx = [i for i in chunk if i in matched]
        if keep_idx:
            t = time.perf_counter()  # after the chunk's read: its wait is its own column
            a = subset(loaded, chunk, keep_idx)
            b = probe.forward([ref.ids[i] for i in keep_idx], ref.entries, ref.pooling)
            t_fwd = time.perf_counter()
            acc.add_batch(keep_idx, [ref.ids[i] for i in keep_idx], a, b, decode)
            steps.append([round(t - t1 - waited, 3), round(waited, 3), round(t_fwd - t, 3),
                          round(time.perf_counter() - t_fwd, 3)])
            if dump is not None:
                save_chunk(layout.drift_chunk(dump, k), b)
            del a, b
        done += len(chunk)
        progress.update(phase="probe", n=done, total=sum(map(len, ref.chunks)))
    probe_s, probe_usage = time.perf_counter() - t1, usage_since(u1)
    t2, w2, u2 = time.perf_counter(), time.time(), cpu_usage()
    if ref.generations is not None:
        order = [i for c in ref.chunks for i in c if i in matched]
        theirs = probe.generate([ref.ids[i] for i in order], spec["gen_tokens"])
        for i, b in zip(order, theirs):
            acc.add_generation(len(ref.ids[i]), ref.generations[str(i)], b)
    generate_s, generate_usage = time.perf_counter() - t2, usage_since(u2)
    # wall-clock windows (epoch seconds) of the probing and the generation, so that a GPU's utilisation
    # sampled beside the command can be read over the work itself (scripts/gpu/issue28_run.sh)
    timing = {"load_s": load_s, "wait_s": wait_s, "probe_s": probe_s, "generate_s": generate_s,
              "read_wait_s": read_wait,  # of probe_s: waiting for the reference's chunks to be read
              "peak_gpu_gib": peak_gpu_gib(probe.device),
              "windows": {"probe": [w1, w2], "generate": [w2, time.time()]}}
    # where a side's probe went (the record's timing only): per chunk, and the host's share of each phase
    where = {"chunks": {"columns": ["at_s", "read_wait_s", "forward_s", "compare_s"], "rows": steps},
             "probe_host": probe_usage, "generate_host": generate_usage}
    return acc.summary(spec["threshold"]) | {
        "cell": cell, "reference": spec["reference"], **timing, "timing": timing | where,
        "reference_timing": ref.timing, "reference_engine": ref.engine, "reference_attention": ref.attention,
        "pooling": ref.pooling,
        "prompts_probed": len(matched),
        "prompts_skipped": sum(x is None for x in ref.ids),  # shorter than two tokens, or a repeat
        "launch": {k: v for k, v in spec["launch"][cell].items() if k != "env"},
        "engine": getattr(probe, "engine", None),
        "attention": getattr(probe, "attention", None),  # an HF probe's attention kernels (backends.probes)
    }


def main(argv: list[str]) -> int:
    slim.apply()  # before the model libraries: transformers without scikit-learn and SciPy (evalparity/slim.py)
    out, cell = Path(argv[0]), argv[1]
    spec = json.loads(layout.drift_spec(out).read_text())
    prompts = json.loads(layout.drift_prompts(out).read_text())["prompts"]
    progress = ProgressFile(layout.drift_progress(out, cell))
    if cell == spec["reference"]:  # into a reference folder that run_drift cleared before any side started
        probe_reference(out, spec, prompts, progress)
    else:
        summary = probe_cell(out, spec, cell, prompts, progress)
        records.write_drift_summary(out, records.DriftRecord.from_json(summary))
    layout.drift_progress(out, cell).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(main, sys.argv[1:]))
