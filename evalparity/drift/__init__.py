"""Where the drift comes from: per-token prompt logprobs, layer-by-layer hidden states, generation divergence.

``evalparity drift`` (or ``evalparity run --drift N``) takes prompts from a run's tasks (or a file) and
compares every cell with the reference (HF at fp32 by default) on identical token ids: the reference is
probed once, batched, into ``reference/``; then each cell, batched, against it on its own device, one
process per side (``python -m evalparity.drift.worker``), writing ``drift/<cell>.json``. Only running
summaries leave the device (see ``measure``), so it stays usable on large models. A run's cells are probed
as the run configured them (``launch_plan``).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console

from evalparity import backends, mps, procs, progress
from evalparity.cellenv import cell_environment
from evalparity.errors import EvalParityError
from evalparity.files import read_json, write_json
from evalparity.models import resolve_model
from evalparity.printable import visible
from evalparity.rundir import layout, records
from evalparity.spec import Alignment, CellSpec, RunSpec, parse_backend, parse_dtype


def prompts_from_run(run_dir: Path, n: int, seed: int = 0) -> list[str]:
    """Up to ``n`` distinct scored sequences (prompt + first continuation) from the run's reference cell."""
    import pandas as pd  # heavy: pandas (the package itself stays light: ``evalparity hidden`` plans with it)

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


def prompt_lines(path: Path) -> list[str]:
    """A prompt file's lines, read as UTF-8 text: one line naming the file where it is not a readable file
    of text (a folder, binary bytes), never a traceback."""
    if not path.exists():
        raise EvalParityError(f"prompt file {path} does not exist: give a .txt (one prompt a line) or .jsonl file")
    if not path.is_file():
        raise EvalParityError(f"prompt file {path} is not a file: give a .txt (one prompt a line) or .jsonl file")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise EvalParityError(f"prompt file {path} is not UTF-8 text (byte {err.start}): save it as UTF-8") from None
    except OSError as err:
        raise EvalParityError(f"prompt file {path} cannot be read ({err.strerror or err})") from None


def prompts_from_file(path: Path) -> list[str]:
    """The prompts of a .txt (one a line) or .jsonl (a ``prompt`` string per row) file; blank lines skipped."""
    lines = prompt_lines(path)
    if path.suffix == ".jsonl":
        out = []
        for i, line in enumerate(lines, 1):
            if line.strip():
                try:
                    prompt = json.loads(line)["prompt"]
                except (json.JSONDecodeError, KeyError, TypeError, RecursionError):
                    raise EvalParityError(f"{path}:{i} is not a JSON object with a 'prompt' field") from None
                if not isinstance(prompt, str):
                    raise EvalParityError(f"{path}:{i}: its 'prompt' is {type(prompt).__name__}, not text")
                out.append(prompt)
        return out
    return [x for x in lines if x.strip()]


def parse_cell(name: str) -> tuple[str, str, bool]:
    """'vllm-bf16' -> ('vllm', 'bfloat16', False); 'vllm-fp32-tf32' -> ('vllm', 'float32', True)."""
    backend, _, rest = name.partition("-")
    dtype, _, tag = rest.partition("-")
    if tag not in ("", "tf32") or (tag == "tf32" and parse_dtype(dtype) != "float32"):
        raise EvalParityError(f"cell {name!r} is not backend-dtype[-tf32]: write e.g. vllm-bf16 or vllm-fp32-tf32")
    return parse_backend(backend), parse_dtype(dtype or "?"), tag == "tf32"


def launch_plan(model_path: str, cells: list[str], reference: str, *, device: str, max_len: int,
                run_spec: RunSpec | None = None) -> dict[str, dict]:
    """How each side is loaded: backend, dtype, TF32, the lm-eval model arguments its backend gives it and
    the environment its process starts with. With ``run_spec`` (drift on a run), a cell of the run gets what
    the run gave it (its engine arguments, ``--vllm-args`` included, and its environment); a name that is not
    one of the run's cells is refused, except the reference, which is then made under the run's alignment."""
    names = [reference, *[c for c in cells if c != reference]]
    found = {c.name: c for c in run_spec.cells} if run_spec is not None else {}
    wanted = []
    for name in names:
        if name in found:
            wanted.append(found[name])
            continue
        if run_spec is not None and name != reference:
            raise EvalParityError(f"cell {name} is not one of the run's cells ({', '.join(sorted(found))}): drift "
                                  "probes what the run ran; drop it, or probe it with --model and --prompts")
        b, d, tf32 = parse_cell(name)
        # a reference the run did not have: made with what the run gave its backend's plain cells (--vllm-args)
        same = next((c.args for c in found.values() if c.backend == b and not c.label), ())
        wanted.append(CellSpec(b, d, 1, tf32=tf32, args=same))
    # each cell's share of its GPU in the run's memory plan: where sides are probed together, a probe that
    # holds only torch-allocated memory is kept to it (``worker.cap_gpu_memory``)
    budgets = ((run_spec.memory_plan or {}).get("cells") or {}) if run_spec is not None else {}
    spec = run_spec or RunSpec(model=model_path, tasks=(), cells=tuple(wanted), device=device,
                               alignment=Alignment(max_length=max_len))
    plan = {}
    for name, cell in zip(names, wanted):
        backend = backends.get(cell.backend)
        why = cannot_probe(spec, cell)
        if why:
            raise EvalParityError(f"drift cannot probe cell {name}: {why}; or leave it out (--cells)")
        # a cell's own checkpoint (model=) and interpreter (python=), as the run loaded it
        own = str(resolve_model(cell.model, max_len)[1]) if cell.model else model_path
        args = backend.model_args(spec, cell, own)
        plan[name] = {"backend": cell.backend, "dtype": cell.dtype, "tf32": cell.tf32, "model_args": args,
                      "env": cell_environment(backend.environment(spec, cell), offline=True, cell=cell),
                      "python": spec.interpreter(cell) or sys.executable,
                      "gpu_budget_gib": budgets.get(name, {}).get("budget_gib")}
    return plan


#: The variables whose difference between a run's cell and its probe is worth a warning: those that steer
#: vLLM's and the kernels' numerics (hostenv records more: threads, caches, the MPS server's folders).
NUMERIC_PREFIXES = ("$VLLM_", "$TRITON_", "$NVIDIA_TF32_", "$CUBLAS_", "$CUBLASLT_", "$CUDNN_")


def engine_differences(scored: dict, probed: dict | None) -> list[str]:
    """How the engine a cell was probed with differs from the one the run scored it with: its model runner
    (``settings.model_runner``) and the numerics-steering variables (``NUMERIC_PREFIXES``) of the cell's
    ``environment`` against the probe's ``engine`` record (``drift.worker.load_side``). Empty where they agree
    or where the cell's record predates them (it says nothing to compare)."""
    if not isinstance(probed, dict) or not isinstance(scored, dict):
        return []
    out = []
    ran = (scored.get("settings") or {}).get("model_runner")
    now = (probed.get("settings") or {}).get("model_runner")
    if ran and now and ran != now:
        out.append(f"model runner {now}, where the run's was {ran}")
    env = scored.get("environment") or {}
    if any(k.startswith("$") for k in env):
        mine = probed.get("variables") or {}
        for name in sorted({k for k in (*env, *mine) if k.startswith(NUMERIC_PREFIXES)}):
            if env.get(name) != mine.get(name):
                out.append(f"{name[1:]}={mine.get(name, '(unset)')}, where the run's was {env.get(name, '(unset)')}")
    return out


def engine_warnings(run_dir: Path, results: dict[str, dict]) -> list[str]:
    """One line per probed side of ``run_dir`` (each cell, and the reference where it is one of the run's
    cells) whose engine differed from the run's (``engine_differences``): its drift may not be the drift the
    run's verdicts saw."""
    engines = {cell: result.get("engine") for cell, result in results.items()}
    for result in results.values():  # the reference's record, as each cell's summary carries it
        if isinstance(result.get("reference"), str) and result["reference"] not in engines:
            engines[result["reference"]] = result.get("reference_engine")
    lines = []
    for cell, engine in engines.items():
        rec = records.read_cell(layout.cell_dir(run_dir, cell))
        diffs = engine_differences(rec.to_json() if rec is not None else {}, engine)
        if diffs:
            lines.append(f"{cell} was probed with {'; '.join(diffs[:5])}{' …' if len(diffs) > 5 else ''}: its drift "
                         "may not be the run's; probe it from the same environment as the run")
    return lines


def cannot_probe(spec: RunSpec, cell: CellSpec) -> str:
    """Why drift cannot probe ``cell`` as the run loaded it, or "": its backend's optional ``cannot_probe``
    (vLLM: an engine over several GPUs, whose hooks run in worker processes), asked before anything loads, so
    that ``run --drift`` leaves such a cell out and ``evalparity drift`` refuses it in one line."""
    check = getattr(backends.get(cell.backend), "cannot_probe", None)
    return check(spec, cell) if check is not None else ""


def together_ok(run_spec: RunSpec | None, cells: list[str]) -> bool:
    """Whether a run's cells can be probed all at once: the run's memory plan packed them onto their GPUs
    together (each cell's engine arguments are its share of a GPU the others share), so they fit together
    again, with the probe's own chunks (two of ``worker.CHUNK_BYTES`` a cell, one the reference) beside
    each. Not without a run: each cell's default share assumes a GPU of its own."""
    plan = (run_spec.memory_plan or {}) if run_spec is not None else {}
    return run_spec is not None and run_spec.device != "cpu" and int(plan.get("cells_per_gpu") or 1) >= len(cells) \
        and all(c in (plan.get("cells") or {}) for c in cells)


def check_out(folder: Path) -> None:
    """``--out`` of a drift that writes a folder of its own: new, empty, or an earlier drift's output (its
    ``spec.json`` is drift's: written over). Anything else, a run folder above all (drift's spec has the run
    spec's name: it replaced the run's, session 32's review), is refused in one line before anything loads."""
    from evalparity.rundir import contents

    if not contents(folder):
        return
    spec = read_json(layout.drift_spec(folder))
    if not layout.drift_spec(folder).is_symlink() and isinstance(spec, dict) \
            and {"reference", "cells", "gen_tokens", "launch"} <= set(spec) and "tasks" not in spec:
        return
    raise EvalParityError(f"--out {folder} is not empty and not an output of `evalparity drift` (a run's folder "
                          "takes its drift with --run-dir alone, into its drift/): give an empty or new folder")


def run_drift(launch: dict[str, dict], prompts: list[str], out: Path, *, reference: str = "hf-fp32",
              max_len: int = 2048, gen_tokens: int = 32, threshold: float = 1e-3, layers: list[int] | None = None,
              pooling: str = "all", dump: bool = False, together: bool = False, console: Console | None = None,
              shown: Path | None = None, mps_choice: str = "auto", reference_too: bool = False) -> dict[str, dict]:
    """The reference, then every other side of ``launch`` (``launch_plan``) against it, one worker process
    each (``procs.popen``: it dies with this process, its engine subprocesses with it), into ``out``.
    ``together``: the cells all at once (``together_ok``), else one after another. ``reference_too``: the
    reference started with them (``together_ok`` of every side): the cells load while it probes, then wait
    until its process has ended and every cell is loaded, and probe together (``worker.wait_to_probe``).
    ``shown``: where ``out`` will be once published (``out`` a staging folder), for the paths that messages
    name. The reference's chunks are removed at the end unless ``dump``. ``mps_choice``: ``--mps``; cells
    probed together share their GPU through an MPS server of this command's own (``mps``), as a run's do."""
    console = console or Console(stderr=True)
    shown = shown or out
    if not prompts:
        raise EvalParityError("no prompts to probe: pass --prompts FILE or a run directory with samples")
    todo = [c for c in launch if c != reference]
    reference_too = reference_too and together and bool(todo)
    if together and len(todo) + reference_too > 1:  # on their GPUs together, as the run packed them
        sharing = mps.decide(mps_choice, "cuda", True, False)
    elif mps_choice == "on":
        raise EvalParityError("--mps on: no two cells are probed together here (one cell, or cells the run did not "
                              "pack on one GPU), so none shares a GPU: run with --mps auto or off")
    else:
        sharing = (False, "off: no two cells probed together")
    out.mkdir(parents=True, exist_ok=True)
    server, why = mps.serve(mps_choice, sharing)
    if sharing[0] and server is None:
        console.print(f"MPS: not used, {visible(why.removeprefix('off: '))} (the cells take turns on their GPU)",
                      highlight=False, markup=False)
    write_json(layout.drift_spec(out), {"reference": reference, "cells": todo, "max_len": max_len,
                                       "gen_tokens": gen_tokens, "threshold": threshold, "n_prompts": len(prompts),
                                       "dump": dump, "layers": layers, "pooling": pooling, "together": together,
                                       "mps": why, "reference_too": reference_too, "launch": launch})
    # an earlier drift's reference and markers in this folder are never read: cleared before any side starts
    shutil.rmtree(layout.drift_reference(out), ignore_errors=True)
    sync = layout.drift_sync(out, reference, "loaded").parent
    shutil.rmtree(sync, ignore_errors=True)
    sync.mkdir()
    try:
        return _probe_all(launch, prompts, out, reference, todo, dump, console, shown,
                          server.env() if server is not None else {}, together=together, reference_too=reference_too)
    finally:
        shutil.rmtree(sync, ignore_errors=True)  # the sides' markers, on every path out (a failed reference's too)
        if server is not None:
            server.close(log_to=out / "mps.log")


def _probe_all(launch: dict[str, dict], prompts: list[str], out: Path, reference: str, todo: list[str],
               dump: bool, console: Console, shown: Path, shared_env: dict[str, str], *, together: bool,
               reference_too: bool):
    """``run_drift``'s probing: the reference alone, then the cells (``together``: at once, through
    ``shared_env``'s MPS server when there is one; else one after another); or, ``reference_too``, every
    side at once."""
    write_json(layout.drift_prompts(out), {"prompts": prompts})
    results: dict[str, dict] = {}
    # live bars on a terminal, timestamped lines when piped (a CI log), as ``run`` and ``hidden`` show theirs
    units = {n: f"drift reference {n}" if n == reference else f"drift {n} vs {reference}" for n in [reference, *todo]}
    with progress.display(console, units.values(), f"drift of {len(prompts):,} prompts", total=len(units)) as bar:
        if reference_too:
            groups = [[c for c in _workers(out, [reference, *todo], launch, bar, units, console, shown, shared_env)
                       if c != reference]]
        elif not _workers(out, [reference], launch, bar, units, console, shown):
            return results
        else:
            groups = [_workers(out, group, launch, bar, units, console, shown, shared_env)
                      for group in ([todo] if together else [[c] for c in todo])]
        for c in (c for group in groups for c in group):
            results[c] = json.loads(layout.drift_summary(out, c).read_text())
    if not dump:
        shutil.rmtree(layout.drift_reference(out), ignore_errors=True)
    return results


def _workers(out: Path, names: list[str], launch: dict[str, dict], bar: progress.Display, units: dict[str, str],
             console: Console, shown: Path, extra_env: dict[str, str] | None = None) -> list[str]:
    """These sides' workers, at once, their progress on ``bar`` (``units``: each side's line); the names of
    those that finished (a line naming its log for each that failed). ``extra_env``: on top of each side's."""
    t0 = time.perf_counter()

    def tick() -> None:
        for n in names:
            bar.watch(units[n], layout.drift_progress(out, n))

    def mark_ended(k: int, code: int) -> None:  # for the sides that wait on it (worker.wait_to_probe)
        write_json(layout.drift_sync(out, names[k], "ended"), {"returncode": code})

    argv = {n: [launch[n].get("python") or sys.executable, "-m", "evalparity.drift.worker", str(out), n] for n in names}
    ended = procs.run_logged_all([(argv[n], launch[n]["env"] | (extra_env or {}), layout.drift_log(out, n))
                                  for n in names], tick, every=0.5, on_end=mark_ended)
    done = []
    for n, (code, said, last) in zip(names, ended):
        if code != 0:
            why = f"error: {said}" if said else last
            bar.finished(units[n], "failed")
            bar.line(f"drift {n} failed: {why[:300]} (log: {layout.drift_log(shown, n)})")
            continue
        bar.overall(advance=1)
        bar.finished(units[n], f"done in {time.perf_counter() - t0:.1f} s")
        done.append(n)
    return done
