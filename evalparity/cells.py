"""Run one cell (backend x dtype) in its own process, write it to a temp dir, publish it by rename.

``python -m evalparity.cells RUN_DIR CELL_NAME`` is what ``matrix`` starts for every cell. The process:
1. sends its stdout/stderr (vLLM's and HF's own logs included) to ``cell.log``, never the terminal;
2. loads the model once for all tasks and calls ``lm_eval.simple_evaluate(..., log_samples=True)``;
3. writes lm-eval's own output (``lm_eval/``: results and samples, exactly as ``lm_eval --log_samples``
   writes them), the per-sample table ``samples.parquet`` and ``cell.json`` (settings, versions, device,
   timings, peak memory, status);
4. publishes the folder as ``cells/<name>`` with one rename, so a killed run never leaves a half cell that
   looks finished.

While it runs it keeps ``progress.json`` up to date (phase, and the lm-eval progress bar's n/total), which
the parent shows as the within-cell bar.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import functools
import importlib
import importlib.metadata as md
import json
import logging
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from evalparity import __version__, backends, hostenv, lmeval_patches, procs, samples, shards, slim, staging, tasks
from evalparity.backends import precision, registry
from evalparity.config import (
    PLACEMENT_ENV,
    REASON_FD_ENV,
    STAGES,
    score_ahead,
    unit_location,
)
from evalparity.data import mirrors
from evalparity.errors import EvalParityError
from evalparity.files import write_json
from evalparity.hostuse import cpu_usage, usage_since
from evalparity.models import resolve_model
from evalparity.phases import PhaseClock, profiled
from evalparity.progress_file import ProgressFile, log_phase
from evalparity.rundir import layout, records, rounds, units
from evalparity.rundir.records import STATUS_FAILED, STATUS_OK
from evalparity.spec import CellSpec, RunSpec

logger = logging.getLogger(__name__)

def check_readable(run_dir: Path) -> records.VerifiedRun:
    """The run folder verified (``records.verify_run``: its spec, every cell's record, identity and table
    seal), and every finished cell's table readable as a per-sample table, before any statistics: a
    traceback midway through would leave a half-written report, and an unverified input a false verdict."""
    run = records.verify_run(run_dir)
    if run.kind == "compare" and run.incomplete:  # an interrupted `compare`: its rerun redoes it all
        raise records.incomplete_error(run, "rerun the same `evalparity compare` to redo it")
    for name in run.cells:
        samples.check_table(layout.table(layout.cell_dir(run_dir, name)))
    return run


def failed_meta(cell: CellSpec, error: str, **extra) -> dict:
    """The cell.json of an attempt that did not finish: what the cell is, why it failed."""
    return {"cell": cell.name, "backend": cell.backend, "dtype": cell.dtype, "batch_size": cell.batch_size,
            "tag": cell.tag, "base_cell": cell.base_name, "status": STATUS_FAILED, "error": error} | extra


def placement_meta(spec: RunSpec, cell: CellSpec) -> dict:
    """Where this process runs, as its executor said (``EVALPARITY_PLACEMENT``) plus what it sees itself; its
    ``tensor_parallel`` is the cell's own GPUs (``RunSpec.cell_gpus``: a ``tensor_parallel_size=2`` cell beside
    tp1 cells)."""
    try:
        out = json.loads(os.environ.get(PLACEMENT_ENV, "") or "{}")
    except json.JSONDecodeError:
        out = {}
    out.setdefault("executor", "direct")
    out.setdefault("host", platform.node())
    out["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    out["tensor_parallel"] = spec.cell_gpus(cell)
    # CPU threads differ by executor: a Ray task that asks for n CPUs gets OMP_NUM_THREADS=n (a GPU job asks
    # for its GPUs' share of the host, a CPU job for 1), a local child inherits this shell's setting (unset:
    # torch uses every core). Recorded to explain timings.
    out["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    out["cpus_visible"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out["mps"] = bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))  # through an MPS server (the run's: ``mps``)
    return out


# ---------------------------------------------------------------- progress
# ---------------------------------------------------------------- generated token ids
def trim_generated_ids(ids: list[int], tokenizer, until: list[str], eos_ids: set[int]) -> list[int]:
    """The generated ids up to the stop, the same way on both backends.

    vLLM stops at a stop string by itself; HF generates a batch until every row has stopped, so its rows
    run on past their stop. Both are cut at the first EOS (excluded) and at the shortest prefix whose
    decoded text contains a stop string (that token included), which does not depend on how either
    detokeniser renders an incomplete UTF-8 byte at the end.
    """
    cut = len(ids)
    for i, t in enumerate(ids):
        if t in eos_ids:
            cut = i
            break
    ids = list(ids[:cut])
    stops = [u for u in until if u]
    if not stops or not ids:
        return ids

    def has_stop(k: int) -> bool:
        text = tokenizer.decode(ids[:k], skip_special_tokens=False)
        return any(u in text for u in stops)

    if not has_stop(len(ids)):
        return ids
    lo, hi = 1, len(ids)
    while lo < hi:  # shortest prefix that contains a stop string (monotone in k)
        mid = (lo + hi) // 2
        if has_stop(mid):
            hi = mid
        else:
            lo = mid + 1
    return ids[:lo]


def _generation_ids(results: dict, lm) -> dict[str, list[int]]:
    recorded: dict[str, list[int]] = getattr(lm, "generated_ids", {})
    if not recorded:
        return {}
    tok = lm.tokenizer
    eos = {i for i in (getattr(tok, "eos_token_id", None), getattr(lm, "eot_token_id", None)) if i is not None}
    out: dict[str, list[int]] = {}
    for task_samples in results.get("samples", {}).values():
        for s in task_samples:
            args = s.get("arguments") or []
            if not args or len(args[0]) < 2 or not isinstance(args[0][1], dict):
                continue
            context, gen_kwargs = args[0][0], args[0][1]
            if context in out or context not in recorded:
                continue
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            out[context] = trim_generated_ids(recorded[context], tok, until, eos)
    return out


# ---------------------------------------------------------------- metadata
def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "evalparity": __version__}
    for dist in ("torch", "transformers", "lm_eval", "datasets", "numpy"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    for name in backends.names():  # every backend's, so that any two cells' software can be compared
        out |= backends.get(name).versions()
    return out


# ---------------------------------------------------------------- other interpreters (--python NAME=PATH)
PROBE_FLAG = "--probe"           # ``python -m evalparity.cells --probe hf,vllm``: can this interpreter run a cell?
# An interpreter that has not answered in this long hangs (its imports take 10-60 s, vLLM's on a cold machine the
# most): refused in one line instead of a silent wait (an adversarial review waited 200 s on one at 600).
PROBE_TIMEOUT_S = 180.0
PROBE_MARK = "evalparity-probe: "  # the probe's answer: this, then one JSON object, on its own line of stdout


def probe(backend_names: list[str]) -> dict:
    """What a cell process under this interpreter would run with, asked of the interpreter itself: which it
    is, evalparity's version and where it is imported from, every version a cell records (``versions``),
    and each problem that would make a cell fail at its start (torch, lm-eval or a backend that does not
    import)."""
    problems = []
    for module in ("torch", "lm_eval"):
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - any failure to import is the answer
            problems.append(f"cannot import {module} ({_reason(err)})")
    for name in backend_names:
        try:
            ok, info = backends.get(name).installed()
        except Exception as err:  # noqa: BLE001
            ok, info = False, _reason(err)
        if not ok:
            problems.append(f"backend {name} does not load ({info})")
    return interpreter() | {"evalparity": __version__, "evalparity_path": str(Path(__file__).resolve().parent),
                            "versions": versions(), "problems": problems}


def _probe_main(argv: list[str]) -> int:
    """``--probe BACKEND,...``: the probe's answer on stdout (``PROBE_MARK`` and JSON), the engines' own
    output on stderr."""
    answer = probe([b for b in (argv[0] if argv else "").split(",") if b])
    print(PROBE_MARK + json.dumps(answer), flush=True)
    return 0


class InterpreterProbes:
    """The ``--python`` interpreters the run's cells name, each asked at once in a process of its own (its
    imports take seconds: torch, lm-eval, the engines) while the run sets up, whether it can run those cells
    (``probe``); ``wait`` collects the answers before any cell starts and refuses, in one line, an
    interpreter that is not a Python, that cannot import evalparity, or whose evalparity is another version
    (the cell would write records this one does not read), lm-eval, torch or a backend its cells use."""

    def __init__(self, pythons: dict[str, str], needs: dict[str, set[str]]):
        """``pythons``: name -> path; ``needs``: name -> the backends of the cells that run under it."""
        self.started: dict[str, tuple[str, subprocess.Popen | OSError, object]] = {}
        env = dict(os.environ) | registry.plugin_environment() | {"PYTHONUNBUFFERED": "1"}
        for name, path in pythons.items():
            if name not in needs:
                continue
            out = tempfile.TemporaryFile()
            try:
                proc = procs.popen([path, "-m", "evalparity.cells", PROBE_FLAG, ",".join(sorted(needs[name]))],
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
            except OSError as err:  # not executable as a program at all (exec format, permission)
                proc = err
            self.started[name] = (path, proc, out)

    def wait(self, timeout: float = PROBE_TIMEOUT_S) -> dict[str, dict]:
        """Each interpreter's answer (``probe``), by name; the first one that cannot run its cells refused."""
        return {name: self.answer(name, timeout) for name in self.started}

    def answer(self, name: str, timeout: float = PROBE_TIMEOUT_S) -> dict:
        """One interpreter's answer; a one-line error when it cannot run its cells (see the class)."""
        path, proc, out = self.started[name]
        where = f"--python {name}={path}"
        if isinstance(proc, OSError):
            raise EvalParityError(f"{where} is not an executable Python ({proc.strerror or proc}): give the path "
                                  "of a Python interpreter, e.g. /opt/venv-new/bin/python")
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            procs.stop(proc)
            raise EvalParityError(f"{where} did not answer in {timeout:.0f} s (importing torch, lm-eval and the "
                                  "backends): check it with `evalparity doctor --python ...`") from None
        procs.ended(proc)
        out.seek(0)
        text = out.read().decode("utf-8", errors="replace")
        out.close()
        line = next((x for x in reversed(text.splitlines()) if x.startswith(PROBE_MARK)), None)
        try:
            answer = json.loads(line[len(PROBE_MARK):]) if line is not None else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            said = [x.strip() for x in text.splitlines() if x.strip()]
            why = said[-1][:200] if said else f"exit {proc.returncode}, no output"
            if "No module named 'evalparity'" in text:
                raise EvalParityError(f"{where} cannot import evalparity ({why}): install this evalparity "
                                      f"there (pip install -e {Path(__file__).resolve().parents[1]}) or give "
                                      "another interpreter")
            raise EvalParityError(f"{where} cannot run a cell ({why}): give a Python interpreter with "
                                  "evalparity, lm-eval, torch and the cells' backends installed")
        if answer.get("evalparity") != __version__:
            raise EvalParityError(f"{where} runs evalparity {answer.get('evalparity')} (from "
                                  f"{answer.get('evalparity_path')}), this is {__version__}: install this one there "
                                  f"(pip install -e {Path(__file__).resolve().parents[1]})")
        if answer.get("problems"):
            raise EvalParityError(f"{where} cannot run its cells: {'; '.join(answer['problems'])}: install what "
                                  "is missing there, or give another interpreter")
        return answer


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch  # heavy: torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cuda (not available)"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()}"


def peak_memory() -> dict[str, float]:
    out = {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    try:
        import torch  # heavy: torch

        if torch.cuda.is_available():
            out["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    except Exception:  # noqa: BLE001
        pass
    return out


def _bos_added(lm) -> bool | None:
    """Whether this backend's request encoding starts with BOS, read back from the LM itself: the one
    number that shows the BOS policy really is the same on both sides."""
    try:
        bos = getattr(lm.tokenizer, "bos_token_id", None)
        ids = lm.tok_encode("Hello")
        return bool(bos is not None and len(ids) > 0 and ids[0] == bos)
    except Exception:  # noqa: BLE001 - best effort, recorded as unknown
        return None


# ---------------------------------------------------------------- the cell itself
def cell_meta(spec: RunSpec, cell: CellSpec, model_path: str, backend, args: dict) -> dict:
    """What a cell's record says of it before it evaluates anything: the cell, the spec it runs under, the
    model it scores (its own ``model=`` checkpoint, or the run's) and the path it loaded, the interpreter it
    runs on, where and with which settings."""
    meta: dict = {"cell": cell.name, "backend": cell.backend, "dtype": cell.dtype, "batch_size": cell.batch_size,
                  "tag": cell.tag, "tf32": cell.tf32, "base_cell": cell.base_name, "variant": cell.variant(),
                  "model": cell.model or spec.model, "interpreter": interpreter(),
                  "model_path": model_path, "spec_identity": spec.identity(),
                  "run_cells": [c.name for c in spec.cells],  # records.verify_run: none taken out of the spec later
                  "model_fingerprint": spec.model_digest,
                  "device": spec.device, "device_name": device_name(spec.device), "versions": versions(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid(),
                  "host": platform.node(), "placement": placement_meta(spec, cell), "model_args": args}
    meta["settings"] = backend.settings(spec, cell, args) | {
        "request_cache": "off (lm-eval's request cache is not used, so no cell can read another's)",
        "seeds": {"random": spec.alignment.seed, "numpy": spec.alignment.seed, "torch": spec.alignment.seed,
                  "fewshot": spec.alignment.seed},
        "num_fewshot": spec.num_fewshot, "limit": spec.limit, "task_limits": dict(spec.task_limits),
        "tf32": cell.tf32, "chat": chat_arguments(spec) or "off (lm-eval's plain prompts)",
    }
    return meta


def load_model(spec: RunSpec, cell: CellSpec, backend, args: dict, meta: dict, progress: ProgressFile):
    """The cell's model, loaded once (``meta`` gets its load time, precision and what the backend decided),
    and lm-eval's task manager."""
    if cell.dtype == "float32":
        precision.apply(spec.alignment.true_fp32 and not cell.tf32)
    mirrors.activate(mirrors.mirror_roots(spec.datasets_dir))
    progress.update(force=True, phase=PHASE_INDEX)
    tm = tasks.task_manager(spec.include_paths)
    progress.update(force=True, phase=PHASE_LOADING)
    t0 = time.perf_counter()
    shell = dict(os.environ)  # the cell's variables before the engine's import sets some of its own (hostenv)
    lm = backend.create_lm(args)
    meta["load_s"] = time.perf_counter() - t0
    log_phase(f"model loaded in {meta['load_s']:.1f} s")
    meta["precision"] = precision.probe() | {"attention_backend": backend.attention_backend(lm)}
    meta["environment"] = hostenv.collect(shell)  # after the load: torch and CUDA are up
    meta["settings"]["bos_added"] = _bos_added(lm)
    meta["settings"] |= backend.loaded_settings(lm)
    meta["settings"]["template_cache"] = lmeval_patches.cache_templates()
    meta["settings"]["env_info_cache"] = lmeval_patches.cache_env_info()
    meta["settings"]["doc_picking"] = lmeval_patches.pick_docs()
    return lm, tm


def evaluate(lm, tm, spec: RunSpec, cell: CellSpec, backend, args: dict, meta: dict, progress: ProgressFile,
             out: Path, *, task_names: list[str], limit: int | None, samples_arg: dict | None,
             drop: set[tuple[str, int]] = frozenset(), groups: dict[str, list[str]] | None = None) -> None:
    """lm-eval on ``task_names`` (``limit`` or ``samples_arg``), its output in ``out`` (lm-eval's own files,
    the per-sample table, its seal), timings and aggregates into ``meta``. ``drop``: (task, doc) rows not
    to keep (a staged round's placeholders); ``groups``: the run's group map, for a round that names leaves."""
    import lm_eval  # heavy: lm_eval (already imported by the backend's create_lm, after its own set-up)
    from lm_eval.loggers import EvaluationTracker

    clock = PhaseClock(lm)
    progress.update(force=True, phase="evaluating", desc="", n=0, total=0)
    tracker = EvaluationTracker(output_path=str(layout.lm_eval_dir(out)))
    cpu1 = cpu_usage()
    seed = spec.alignment.seed
    clock.start()
    results = lm_eval.simple_evaluate(
        model=lm, model_args=args, tasks=list(task_names), num_fewshot=spec.num_fewshot,
        limit=limit, samples=lmeval_patches.fast_samples(samples_arg),
        log_samples=True, task_manager=tm, evaluation_tracker=tracker, cache_requests=False,
        bootstrap_iters=0, random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
        fewshot_random_seed=seed,
        gen_kwargs={"max_gen_toks": spec.alignment.max_gen_toks} if spec.alignment.max_gen_toks else None,
        **chat_arguments(spec),
    )
    clock.stop()
    meta["eval_s"] = clock.elapsed
    meta["eval_cpu"] = usage_since(cpu1)

    progress.update(force=True, phase="writing")
    t2 = time.perf_counter()
    gen_ids = _generation_ids(results, lm)
    task_samples = results.pop("samples")
    tracker.general_config_tracker.log_end_time()
    tracker.save_results_aggregated(results=results, samples=task_samples)
    for task_name in results["configs"]:
        tracker.save_results_samples(task_name=task_name, samples=task_samples[task_name])
    lm_results, written = _saved(layout.lm_eval_dir(out), task_samples)
    if groups:
        lm_results = dict(lm_results) | {"group_subtasks": groups}
    table = samples.samples_to_table(written, lm_results, gen_ids)
    if drop:
        keep = [(t, int(d)) not in drop for t, d in zip(table["task"], table["doc_id"])]
        table = table[keep].reset_index(drop=True)
    table.insert(0, "cell", cell.name)
    samples.write_table(table, layout.table(out))
    meta["table"] = records.seal_table(out, len(table)).to_json()
    write_json(layout.lm_eval_results(out), {k: lm_results.get(k) for k in
                                               ("results", "groups", "group_subtasks", "configs", "versions",
                                                "n-shot", "higher_is_better", "n-samples")})
    meta["write_s"] = time.perf_counter() - t2
    meta["phases"] = {"load_s": meta.get("load_s", 0.0)} | clock.phases() | {"write_s": meta["write_s"]}
    if getattr(lm, "memo_used", None) is not None:  # backends/pretokenize.py
        meta["settings"]["batched_tokenization"] = lm.memo_used
    meta["settings"] |= backend.loaded_settings(lm)  # again: what the engine decided while evaluating
    meta["aggregate"] = {t: {k: v for k, v in r.items() if isinstance(v, (int, float)) and "stderr" not in k}
                         for t, r in (lm_results.get("results") or {}).items()} if not drop and not groups \
        else shards.aggregate(table)
    meta["n_rows"] = int(len(table))
    meta |= peak_memory()


def chat_arguments(spec: RunSpec) -> dict:
    """lm-eval's chat-templating arguments from the spec, the same on every cell; lm-eval's own default for
    what the run did not set (so a run without them evaluates exactly as before)."""
    a = spec.alignment
    out: dict = {}
    if a.apply_chat_template:
        out["apply_chat_template"] = True
    if a.system_instruction is not None:
        out["system_instruction"] = a.system_instruction
    if a.fewshot_as_multiturn is not None:
        out["fewshot_as_multiturn"] = a.fewshot_as_multiturn
    return out


def interpreter() -> dict:
    """The interpreter this process runs on, for its record: which one (a venv's ``bin/python``, as started),
    its prefix (the venv) and version."""
    return {"executable": sys.executable, "prefix": sys.prefix, "python": platform.python_version()}


def cell_model_path(spec: RunSpec, cell: CellSpec, model_path: str) -> str:
    """The checkpoint this cell loads: its own ``model=`` (resolved as the run's model is: a local folder, or
    a hub id from the local cache the run filled), else the run's ``model_path``. And the check that this
    process runs under the interpreter the cell's ``python=`` names (``RunSpec.interpreter``): a cell that
    says it ran elsewhere than it did would be a false record."""
    wanted = spec.interpreter(cell)
    if wanted and os.path.abspath(sys.executable) != wanted:
        raise EvalParityError(f"cell {cell.name} asks for python={cell.python} ({wanted}) but runs under "
                              f"{sys.executable}: start it through `evalparity run`")
    if not cell.model:
        return model_path
    return str(resolve_model(cell.model, spec.alignment.max_length)[1])


def run_cell(run_dir: Path, spec: RunSpec, cell: CellSpec, model_path: str, progress: ProgressFile,
             shard: tuple[int, int] = (0, 1), out: Path | None = None) -> dict:
    model_path = cell_model_path(spec, cell, model_path)
    backend = backends.get(cell.backend)
    out = out or units.tmp_dir(run_dir, cell.name)
    args = backend.model_args(spec, cell, model_path)
    meta = cell_meta(spec, cell, model_path, backend, args)
    if shard[1] > 1:
        meta["shard"] = {"index": shard[0], "of": shard[1]}
    lm, tm = load_model(spec, cell, backend, args, meta, progress)
    sharded = shard[1] > 1
    evaluate(lm, tm, spec, cell, backend, args, meta, progress, out, task_names=list(spec.tasks),
             limit=None if spec.task_limits or sharded else spec.limit,
             samples_arg=spec.shard_samples(*shard) if sharded else spec.samples())
    return meta


# ---------------------------------------------------------------- a staged cell: one look after another
def run_staged(run_dir: Path, spec: RunSpec, cell: CellSpec, model_path: str, progress: ProgressFile,
               resident: bool, shard: tuple[int, int] = (0, 1)) -> int:
    """A cell of a staged run: the rounds the run asks for (``stages/round-<r>.json``), each scored on the
    model loaded once and published as ``stages/<cell>.r<r>/`` (``staging``'s parts); the parent merges the
    parts into ``cells/<cell>`` when the run has decided. ``resident``: keep the model and wait for the next
    round (the parent writes it after the statistics of this one); else score one round and exit (an
    executor that cannot hold every cell at once restarts it for the next). Rounds already published are
    never scored again, so a killed run resumes at its last finished round. Returns the rounds scored.

    A resident cell that waits may score its next rounds ahead (``Ahead``): while another cell of the run is
    still loading its model, the GPU has time to spare. A round scored ahead is published only when the
    run's record of that round asks for exactly the docs it scored (the same lm-eval call in the same
    process, so the same numbers); otherwise it is thrown away and the round is scored as asked.

    ``shard`` (k, n): this process is replica k of the cell's n (``--shards``): it scores its share of every
    round (``RoundRequest.replica_share``) and publishes it as ``stages/<cell>.r<r>.<k>of<n>``; the run merges
    the n shares into the cell's part (``stager.merge_replicas``)."""
    model_path = cell_model_path(spec, cell, model_path)
    backend = backends.get(cell.backend)
    args = backend.model_args(spec, cell, model_path)
    lm = tm = loaded = None
    scored, r = 0, 0
    ahead = Ahead(run_dir, spec, cell) if resident and shard == (0, 1) else None
    last: rounds.RoundRequest | None = None
    while True:
        unit = rounds.replica_part_name(cell.name, r, *shard)
        if any(units.is_done(run_dir, u, STAGES, identity=spec.identity())
               for u in {unit, rounds.part_name(cell.name, r)}):
            r += 1  # its share, or the cell's whole part (merged from the shares), is in
            continue
        if ahead is not None and lm is not None and last is not None:
            ahead.score(last, functools.partial(evaluate_round, lm, tm, spec, cell, backend, args), loaded, progress)
        progress.update(force=True, phase=f"waiting for round {r + 1}" if lm is not None else PHASE_STARTING)
        request = rounds.wait_for_round(run_dir, r, progress)
        if request is None:  # the run has decided: no round r
            if ahead is not None:
                ahead.discard()
            return scored
        request = request.replica_share(*shard)
        last = request
        if lm is None:
            loaded = cell_meta(spec, cell, model_path, backend, args)
            lm, tm = load_model(spec, cell, backend, args, loaded, progress)
            loaded["settings"]["score_ahead"] = ahead.mode if ahead is not None else "off (a process per round)"
        out = units.tmp_dir(run_dir, unit, STAGES)
        if out.exists():
            shutil.rmtree(out)
        meta = ahead.take(request, out) if ahead is not None else None
        if meta is None:
            # every round's record carries what the load found (precision, attention backend, environment, BOS)
            meta = round_meta(loaded, r, first=not scored, shard=shard)
            out.mkdir(parents=True)
            progress.update(force=True, phase=f"round {r + 1}")
            evaluate_round(lm, tm, spec, cell, backend, args, meta, progress, out, request)
        if ahead is not None and ahead.discarded:  # rounds scored ahead and thrown away since the last part
            meta["ahead_discarded"], ahead.discarded = ahead.discarded, []
        records.write_cell(out, meta)
        units.publish(run_dir, unit, STATUS_OK, STAGES)
        scored += 1
        r += 1
        if not resident:
            return scored


def round_meta(loaded: dict, r: int, *, first: bool, shard: tuple[int, int] = (0, 1)) -> dict:
    """A round's record before its scoring: what the load found, the round, when it started, and the load's
    time on the process's first round scored (``first``), none on the others."""
    meta = copy.deepcopy(loaded) | {"round": r, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                    "load_s": loaded["load_s"] if first else 0.0}
    if shard[1] > 1:
        meta["shard"] = {"index": shard[0], "of": shard[1]}
    return meta


def evaluate_round(lm, tm, spec: RunSpec, cell: CellSpec, backend, args: dict, meta: dict, progress: ProgressFile,
                   out: Path, request: rounds.RoundRequest) -> None:
    """Score one round's docs into ``out`` (``evaluate``), its status and timings into ``meta``."""
    t0 = time.perf_counter()
    evaluate(lm, tm, spec, cell, backend, args, meta, progress, out, task_names=list(request.tasks),
             limit=None, samples_arg=request.samples(), drop=request.placeholders(), groups=request.groups)
    meta |= {"status": STATUS_OK, "wall_s": time.perf_counter() - t0,
             "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


#: A cell's phases before its model is loaded (``load_model``): another cell in one of them leaves the GPU
#: time to spare, which a waiting cell may use to score ahead.
PHASE_STARTING, PHASE_INDEX, PHASE_LOADING = "starting", "reading the task index", "loading model"
LOADING_PHASES = frozenset({PHASE_STARTING, PHASE_INDEX, PHASE_LOADING})
AHEAD_PHASE = "ahead of the run's decision"  # in the phase of a cell scoring a round ahead (``scoring_ahead``)
AHEAD_ROUNDS = 3  # rounds a cell scores ahead of the run's records, at most (each started only while allowed)


class Ahead:
    """A resident staged cell's rounds scored before the run asks for them (``run_staged``).

    Why: on a fresh GPU machine the HF cells finish round 1 about 25 s before the vLLM cells have even loaded
    (their engine's cold start), and the GPU is mostly idle meanwhile (results/staged-h200, session 26).
    Scoring the next rounds in that time moves their work off the rounds that follow, which the GPU paces.

    The guess is that every task of the last round goes on to its next look (``staging.predicted``). A round is
    started ahead only while another cell is loading (``others_loading``: after that the GPU is what the
    rounds wait for, and work the run may not need would slow the work it needs), at most ``AHEAD_ROUNDS``,
    and never once the run has written its own record of that round or ended. A guess the run's record does
    not match is thrown away whole, with every guess after it. The cost where the run stops earlier than
    guessed: the GPU time of the rounds thrown away, and the end of the run waits for the one in progress
    (the cell reads the run's decision between rounds). ``$EVALPARITY_SCORE_AHEAD`` (``config.score_ahead``):
    off, auto, or always (tests)."""

    def __init__(self, run_dir: Path, spec: RunSpec, cell: CellSpec):
        self.run_dir, self.spec, self.cell = run_dir, spec, cell
        self.mode = score_ahead()
        self.plan = staging.StagingPlan.from_json(spec.staging) if spec.staging else None
        self.done: list[tuple[rounds.RoundRequest, Path, dict]] = []  # in round order
        self.discarded: list[dict] = []  # rounds scored ahead and thrown away, for the next part's record
        for leftover in rounds.ahead_dirs(run_dir, cell.name):  # a killed process's: never trusted
            shutil.rmtree(leftover, ignore_errors=True)

    def folder(self, r: int) -> Path:
        return rounds.ahead_dir(self.run_dir, self.cell.name, r)

    def others_loading(self) -> bool:
        """Whether another cell of the run has not published its first round and is (by its progress file)
        still starting, reading the task index or loading its model, or has not started."""
        identity = self.spec.identity()
        for other in self.spec.cells:
            if other.name == self.cell.name or units.is_done(self.run_dir, rounds.part_name(other.name, 0), STAGES,
                                                                identity=identity):
                continue
            for k in range(other.shards):
                home = units.tmp_dir(self.run_dir, rounds.replica_name(other.name, k, other.shards), STAGES)
                try:
                    phase = json.loads(layout.progress_file(home).read_text()).get("phase")
                except (OSError, ValueError, AttributeError):
                    return True  # not started (or between two writes of its progress)
                if phase in LOADING_PHASES:
                    return True
        return False

    def allowed(self) -> bool:
        return self.mode == "always" or (self.mode == "auto" and self.others_loading())

    def score(self, last: rounds.RoundRequest, scoring, loaded: dict, progress: ProgressFile) -> None:
        """Score the rounds after ``last`` (or after the last one scored ahead) while ``allowed``, each with
        ``scoring(meta, progress, folder, request)`` (``evaluate_round`` on the loaded model), until the run
        writes its own record of the next one or decides."""
        if self.plan is None or self.mode == "off":
            return
        while len(self.done) < AHEAD_ROUNDS:
            base = self.done[-1][0] if self.done else last
            guess = staging.predicted(self.plan, base)
            if guess is None or rounds.read_round(self.run_dir, guess.round, self.spec.identity()) is not None \
                    or rounds.finished_at(self.run_dir) is not None or not self.allowed():
                return
            out = self.folder(guess.round)
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
            meta = round_meta(loaded, guess.round, first=False) | {"scored_ahead": True}
            progress.update(force=True, phase=f"round {guess.round + 1}, {AHEAD_PHASE}")
            try:
                scoring(meta, progress, out, guess)
            except Exception as err:  # noqa: BLE001 - a guess is worth no failed run: the round is scored as asked
                log_phase(f"round {guess.round + 1} scored ahead failed ({_reason(err)}): no more scoring ahead")
                shutil.rmtree(out, ignore_errors=True)
                self.discard()
                self.mode = "off"
                return
            self.done.append((guess, out, meta))

    def take(self, request: rounds.RoundRequest, out: Path) -> dict | None:
        """The record of ``request``'s round scored ahead, moved to ``out``, where the guess asked for exactly
        its docs; else None, every guess from this round on thrown away."""
        if self.done and self.done[0][0].round < request.round:  # a round the run asked for otherwise
            self.discard()
        if not self.done or self.done[0][0].round != request.round:
            return None
        guess, folder, meta = self.done[0]
        if not staging.same_request(guess, request):
            self.discard()
            return None
        self.done.pop(0)
        folder.rename(out)
        return meta

    def discard(self) -> None:
        for guess, folder, meta in self.done:
            shutil.rmtree(folder, ignore_errors=True)
            self.discarded.append({"round": guess.round, "eval_s": meta.get("eval_s")})
        self.done.clear()


def scoring_ahead(run_dir: Path, unit: str) -> bool:
    """Whether the staged cell process of ``unit`` (a cell, or a replica's name) says it is scoring a round
    ahead (its progress file): at the run's end, what it does is not needed (``stager``)."""
    try:
        phase = json.loads(layout.progress_file(units.tmp_dir(run_dir, unit, STAGES)).read_text()).get("phase")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(phase, str) and phase.endswith(AHEAD_PHASE)


def tell_parent(reason: str) -> None:
    """Send the reason this job failed to the process that started it (``placement.job_reason``), through
    the pipe it gave: the one channel that needs no disk space, for when ``cell.json`` cannot be written."""
    fd = os.environ.get(REASON_FD_ENV)
    if not fd:
        return
    with contextlib.suppress(OSError, ValueError):
        os.write(int(fd), reason.encode("utf-8", errors="replace")[:4000])
        os.close(int(fd))
    os.environ.pop(REASON_FD_ENV, None)


def _reason(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}"[:500]


def _saved(folder: Path, task_samples: dict[str, list]) -> tuple[dict, dict]:
    """lm-eval's output as saved in ``folder``, checked against what it evaluated: lm-eval logs a failure
    to save (a full disk) and goes on, which would leave a cell with fewer samples or none. A short save is
    an error here, naming the free space when the disk is full."""
    try:
        results, written = samples.read_lm_eval_dir(folder)
        short = next(((t, len(written.get(t, [])), len(v)) for t, v in task_samples.items()
                      if len(written.get(t, [])) != len(v)), None)
        problem = f"{short[1]} of the {short[2]} samples of task {short[0]} were saved" if short else None
    except EvalParityError as err:
        results, written, problem = {}, {}, str(err).split(": ")[0]
    if problem is None:
        return results, written
    free = shutil.disk_usage(folder if folder.exists() else folder.parent).free
    if free < 1 << 20:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: lm-eval could not save its output in {folder} "
                                    f"({problem}; {free} bytes free)")
    raise RuntimeError(f"lm-eval did not save all of its output in {folder} ({problem}); it logs such errors "
                       "without failing: see its warnings in cell.log")


def main(argv: list[str] | None = None) -> int:
    """``RUN_DIR CELL MODEL_PATH [--shard K/N]``: run one cell, or shard K of N of it (published to
    ``shards/<cell>.<K>of<N>`` for the parent to merge). A failure is recorded in the cell's ``cell.json``
    and published; when even that cannot be written (a full disk), its reason goes to the parent instead.
    ``--probe BACKEND,...``: whether this interpreter can run such a cell (``probe``)."""
    argv = sys.argv[1:] if argv is None else argv
    slim.apply()  # before any model library: transformers without scikit-learn and SciPy (evalparity/slim.py)
    if argv[:1] == [PROBE_FLAG]:
        return _probe_main(argv[1:])
    if os.environ.get(REASON_FD_ENV, "").isdigit():  # ours alone: not inherited by the engines' own processes
        with contextlib.suppress(OSError):
            os.set_inheritable(int(os.environ[REASON_FD_ENV]), False)
    try:
        return _main(argv)
    except BaseException as err:  # noqa: BLE001 - before or while its record was written
        tell_parent(f"{_reason(err)} (the cell could not record this in its folder)")
        raise


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir, name, model_path = Path(argv[0]), argv[1], argv[2]
    flags = dict(zip(argv[3::2], argv[4::2]))  # --shard K/N, --staged resident|round (placement.Job.argv)
    shard = (0, 1)
    if "--shard" in flags:
        k, n = flags["--shard"].split("/")
        shard = (int(k), int(n))
    spec = records.read_spec(run_dir)
    cell = next(c for c in spec.cells if c.name == name)
    if "--staged" in flags:
        return _main_staged(run_dir, spec, cell, model_path, flags["--staged"] == "resident", shard)
    folder, unit = unit_location(name, *shard)
    out = units.tmp_dir(run_dir, unit, folder)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    log = open(layout.log_file(out), "a", buffering=1)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    progress = ProgressFile(layout.progress_file(out))
    progress.hook_tqdm()
    t0 = time.perf_counter()
    try:
        meta = profiled(run_cell, out, run_dir, spec, cell, model_path, progress, shard, out)
        meta["status"] = STATUS_OK
    except BaseException as err:  # noqa: BLE001 - recorded for this cell; the others go on
        with contextlib.suppress(OSError):  # the log itself may be what a full disk refuses
            traceback.print_exc()
        meta = failed_meta(cell, _reason(err), placement=placement_meta(spec, cell))
        meta |= peak_memory()
    meta["wall_s"] = time.perf_counter() - t0
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    try:
        records.write_cell(out, meta)
    except OSError as err:  # not published: the parent records the failure, with this reason
        why = meta.get("error") or "it finished, but its results could not be kept"
        tell_parent(f"{why}; its cell.json could not be written ({err.strerror or err})")
        return 1
    layout.progress_file(out).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        log.flush()
    if meta["status"] != STATUS_OK:
        tell_parent(meta["error"])
    units.publish(run_dir, unit, meta["status"], folder)
    return 0 if meta["status"] == STATUS_OK else 1


def _main_staged(run_dir: Path, spec: RunSpec, cell: CellSpec, model_path: str, resident: bool,
                 shard: tuple[int, int] = (0, 1)) -> int:
    """A staged cell's process (``run_staged``), or one replica's of it: its log and progress in
    ``stages/.tmp-<cell>/`` (``.tmp-<cell>.<k>of<n>/``), kept across its rounds and restarts (appended to); a
    failure goes to the parent, which records it for the cell."""
    home = units.tmp_dir(run_dir, rounds.replica_name(cell.name, *shard), STAGES)
    home.mkdir(parents=True, exist_ok=True)
    log = open(layout.log_file(home), "a", buffering=1)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    replica = f", replica {shard[0] + 1} of {shard[1]}" if shard[1] > 1 else ""
    log_phase(f"pid {os.getpid()}: staged cell {cell.name}{replica}, {'resident' if resident else 'one round'}")
    progress = ProgressFile(layout.progress_file(home))
    progress.hook_tqdm()
    try:
        profiled(run_staged, home, run_dir, spec, cell, model_path, progress, resident, shard)
    except BaseException as err:  # noqa: BLE001 - the parent records it for this cell
        with contextlib.suppress(OSError):
            traceback.print_exc()
        tell_parent(_reason(err))
        return 1
    layout.progress_file(home).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
