"""Expand a spec into cells, decide what is done, run the rest one process per cell, show progress.

Resume is by files: a cell whose ``cells/<name>/cell.json`` says ``ok`` (and whose table exists) is
skipped unless ``force``; everything else runs. A run directory belongs to one spec: a rerun with other
tasks, limits or settings into the same directory is refused rather than mixed in.

A reference reused from an earlier run (``--reference-from``: ``reference_from`` checks it, ``rundir.reuse``)
is published before the cells start, from the source's rows (per round, by ``stager``, in a staged run), and
never becomes a job.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console
from rich.markup import escape  # task names and errors in the table: text, never markup
from rich.table import Table

from evalparity import backends, cells, memplan, progress, rundir, samples, shards, stager, variants
from evalparity import placement as pl
from evalparity.cellenv import cell_environment
from evalparity.config import (
    ATTEMPTS,
    CELLS,
    PORT_BASE_ENV,
    STAGES,
    job_port_base,
    unit_location,
)
from evalparity.errors import EvalParityError
from evalparity.files import write_json
from evalparity.placement import Job, Placement, local_ray_wanted
from evalparity.printable import visible
from evalparity.rundir import layout, records, reuse, units
from evalparity.rundir.records import STATUS_FAILED
from evalparity.runlog import RunLog
from evalparity.spec import CellSpec, RunSpec, own_gpus
from evalparity.staging import StagingPlan

logger = logging.getLogger(__name__)


@dataclass
class CellOutcome:
    name: str
    status: str  # ok | failed | skipped
    wall_s: float
    meta: dict


def _check_cell_settings(run_dir: Path, old: RunSpec, new: RunSpec, force: bool) -> None:
    """A finished cell keeps the settings it ran with: a rerun that asks for another batch size (or shard
    count) for it is refused unless ``force`` reruns it, so spec.json never disagrees with a cell."""
    before = {c.name: c for c in old.cells}
    for c in new.cells:
        was = before.get(c.name)
        if was is None or force or not units.is_done(run_dir, c.name, identity=new.identity()):
            continue
        for what, a, b in (("--batch-size", was.batch_size, c.batch_size), ("--shards", was.shards, c.shards)):
            if str(a) != str(b):
                raise EvalParityError(f"cell {c.name} finished with {what} {a}, this run asks for {b}: rerun with "
                                      f"{what} {a} to resume, --force to rerun it with {b}, or use another --out")
        if (was.backend, was.dtype, was.tf32, was.variant()) != (c.backend, c.dtype, c.tf32, c.variant()):
            change = variants.difference(variants.described(c), variants.described(was))
            raise EvalParityError(f"cell {c.name} finished with other settings ({change or 'another backend or dtype'}"
                                  f" than this run asks for): rerun with the same ones to resume, --force to rerun "
                                  "it with these, or use another --out")
    if not force:  # --force sets the parts aside with the cells (``set_aside_forced``): they are scored again
        for c in new.cells:
            _check_scored_parts(run_dir, c, new.identity())


# a unit of a cell's that is not the cell: a staged round's part (<cell>.r<r>), a replica's share of one
# (<cell>.r<r>.<k>of<n>) or an unstaged replica's share (<cell>.<k>of<n>), in stages/ or shards/
def _parts_of(run_dir: Path, cell: str) -> list[Path]:
    pattern = re.compile(rf"{re.escape(cell)}\.(?:r\d+(?:\.\d+of\d+)?|\d+of\d+)")
    return [p for folder in (layout.stages_dir(run_dir), layout.shards_dir(run_dir)) if folder.is_dir()
            for p in sorted(folder.iterdir()) if pattern.fullmatch(p.name)]


def _check_scored_parts(run_dir: Path, c, identity: str) -> None:
    """A resumed staged (or sharded) run scores the rounds (or shares) its cells lack and merges them with the
    ones scored before: every part must have been scored with the settings this run gives the cell, or the
    merged cell would hold two variants (session 32's review: a killed run resumed with another --cell
    setting, or --batch-size, mixed them, and could then sign off PASS). One line, before any cell starts."""
    for part in _parts_of(run_dir, c.name):
        rec = records.read_cell(part) if records.is_done(part, identity) else None
        differs = records.role_difference(rec, c, c.name) if rec is not None else None
        if differs is None:
            continue
        if differs[0] == "batch_size":
            raise EvalParityError(f"cell {c.name} has parts scored with batch size {rec.batch_size} ({part.name}), "
                                  f"this run asks for {c.batch_size}: rerun with --batch-size {rec.batch_size} to "
                                  "resume, or use another --out")
        raise EvalParityError(f"cell {c.name} has parts scored with other settings ({part.name}: its {differs[0]} is "
                              f"{json.dumps(differs[1], sort_keys=True, default=str)[:200]}) than this run asks for: "
                              "rerun with the same ones to resume, or use another --out")


def set_aside_forced(run_dir: Path, spec: RunSpec) -> list[str]:
    """``--force``: move the finished folders of the cells (and shards) it reruns to
    ``attempts/<cells|shards>/<unit>/superseded-<time>``, before any of them starts. Until a forced cell
    finishes again it is missing, so a forced run that is killed midway signs off INCOMPLETE instead of on
    the results that ``--force`` was asked to replace. Nothing is deleted."""
    moved = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for cell in spec.cells:
        units = [unit_location(cell.name)] + [unit_location(cell.name, k, cell.shards) for k in range(cell.shards)
                                              if cell.shards > 1]
        for folder, unit in units:
            src = layout.unit_dir(run_dir, unit, folder)
            if not src.exists() and not src.is_symlink():
                continue
            dest = rundir.attempts_dir(run_dir, unit, folder) / f"superseded-{stamp}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            src.replace(dest)
            moved.append(f"{folder}/{unit}")
    stages = layout.stages_dir(run_dir)
    if spec.staging and stages.is_dir() and not stages.is_symlink() and any(stages.iterdir()):
        # a staged run's cells are merged from their rounds' parts: set aside with its round records, the run
        # starts again at round 1 and scores every part anew (it re-merged the old parts: --force rescored
        # nothing, session 32)
        dest = rundir.attempts_dir(run_dir, "rounds", STAGES) / f"superseded-{stamp}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        stages.replace(dest)
        moved.append(f"{STAGES}/")
    if moved:
        logger.info(f"--force: {len(moved)} finished folder(s) moved to {ATTEMPTS}/ until rerun: {', '.join(moved)}")
    return moved


def prepare_run_dir(run_dir: Path, spec: RunSpec, force: bool = False) -> None:
    """Create the run directory and its spec.json, or check that an existing one is the same spec."""
    path = layout.spec_file(run_dir)
    if path.exists():
        old = records.check_spec(path)  # one line naming the file when it is corrupt or of another shape
        old_spec = RunSpec.from_json(old)
        if old_spec.identity() != spec.identity():
            a, b = old_spec.to_json(), spec.to_json()
            diff = next((k for k in a if k != "cells" and a[k] != b.get(k)), "settings")
            if diff == "model_fingerprint":
                change = rundir.fingerprint_change(a.get(diff), b.get(diff))
                raise EvalParityError(f"{run_dir} holds cells of another model ({change}): use another --out, or "
                                      "remove that directory")
            raise EvalParityError(
                f"{run_dir} holds a run of a different spec ({diff}: {a.get(diff)!r} there, {b.get(diff)!r} now): "
                "use another --out, or remove that directory")
        _check_cell_settings(run_dir, old_spec, spec, force)
        rundir.recover_outputs(run_dir)  # what a killed run left: moved-aside folders, a half-published report
        if force:
            set_aside_forced(run_dir, spec)
        # Keep the union of cells, so that adding a cell to a run keeps the earlier ones in the spec, in the
        # order they had (a resume naming them in another order, or some of them, reordered the report's rows)
        merged = spec.to_json()
        now = {c["name"]: c for c in merged["cells"]}
        merged["cells"] = [now.pop(c["name"], c) for c in old["cells"]] + list(now.values())
        write_json(path, merged)
        return
    if rundir.contents(run_dir):
        raise EvalParityError(f"{run_dir} exists and is not an evalparity run directory: use another --out")
    layout.cells_dir(run_dir).mkdir(parents=True, exist_ok=True)
    write_json(path, spec.to_json())


def reference_from(text: str | None, spec: RunSpec, reference: str,
                   run_dir: Path) -> tuple[RunSpec, reuse.Source | None]:
    """``--reference-from RUN_DIR[:CELL]``: the source cell verified and matched against this run's spec
    (``rundir.reuse.open_source``: one line naming what differs), and the spec with the reference at the
    batch size it was scored at (``reuse.adopt``); (spec, None) without the option. The documents are
    checked too, before anything starts: every document an unstaged run scores, or a staged run's first
    round (each later round's are checked as the run asks for them)."""
    if not text:
        return spec, None
    gpu = cells.device_name(spec.device) if spec.device != "cpu" else None  # the GPU model this run will use
    source = reuse.open_source(text, spec, reference, run_dir, gpu)
    spec = reuse.adopt(spec, source)
    if spec.staging:
        plan = StagingPlan.from_json(spec.staging)
        source.rows(stager.first_request(plan, spec.identity()).docs, "in round 1")
    else:
        source.rows(scored_docs(spec))
    return spec, source


def scored_docs(spec: RunSpec) -> dict[str, list[int]]:
    """The documents of each leaf task an unstaged cell scores (``--limit``, ``--task-limit``, or all)."""
    return spec.shard_samples(0, 1)


def _reuse_cell(run_dir: Path, spec: RunSpec, source: reuse.Source) -> None:
    """An unstaged run's reused reference, published into ``cells/`` before the cells start (then found done,
    like a finished cell); on a resume, checked to hold these rows (``Source.check_published``)."""
    if units.is_done(run_dir, source.target, identity=spec.identity()):
        source.check_published(layout.cell_dir(run_dir, source.target))
        return
    stager.publish_reused(run_dir, spec, source, scored_docs(spec), source.target)


def _check_reused_prompts(run_dir: Path, source: reuse.Source, outcomes: dict[str, CellOutcome]) -> None:
    """The reused reference's prompts against those the run's finished cells scored (``Source.check_prompts``)."""
    import pandas as pd  # heavy: pandas (loaded with cells already)

    cols = samples.KEY + samples.HASHES
    tables = {name: pd.read_parquet(layout.table(layout.cell_dir(run_dir, name)), columns=cols)
              for name, o in outcomes.items() if o.status != "failed"
              and units.is_done(run_dir, name)}
    source.check_prompts(run_dir, tables)


def narrowest(spec: RunSpec) -> int:
    """GPUs of the run's narrowest replica (``spec.cell_gpus``): whether two jobs fit side by side."""
    return min((spec.cell_gpus(c) for c in spec.cells), default=spec.tensor_parallel)


def job_gpus(spec: RunSpec, cell: CellSpec, cells_per_gpu: int) -> float:
    """GPUs a job of ``cell`` holds: none on CPU; its replica's GPUs whole when they are more than one (a
    tensor-parallel engine is never packed), else its share of one GPU (``memplan.gpu_share``)."""
    return memplan.gpu_share(spec.cell_gpus(cell), cells_per_gpu) if spec.device != "cpu" else 0.0


def check_room(spec: RunSpec, executor, names: set[str]) -> None:
    """Every replica of the cells ``names`` (those that run) fits one host of the executor (this one, or the
    Ray cluster's largest), before any of them starts: a Ray task asking more GPUs than any host has would wait
    for ever, and a local engine would fail at its load ("World size (2) is larger than the number of available
    GPUs (1)"). The memory plan checks this host's GPUs too, but not a Ray cluster's. One line, naming the cell
    and its option; the executor is stopped."""
    if spec.device == "cpu" or not names:
        return
    cells = [c for c in spec.cells if c.name in names]
    try:
        memplan.check_gpu_count({c.name: spec.cell_gpus(c) for c in cells}, set(own_gpus(cells, spec.tensor_parallel)),
                                spec.tensor_parallel, executor.most_gpus())
    except EvalParityError:
        executor.stop()
        raise


def shares_gpus(spec: RunSpec, placement: Placement, n_jobs: int) -> bool:
    """Whether ``n_jobs`` jobs of this run would hold one GPU at the same time: packed by the memory plan
    (``cells_per_gpu`` > 1), and run side by side on this host (its own Ray, as ``choose_executor`` picks it;
    not one at a time, and not on a cluster's hosts). What an MPS server is for (``mps``)."""
    if spec.device == "cpu" or placement.cells_per_gpu <= 1 or n_jobs <= 1:
        return False
    if placement.ray and placement.ray != "local":
        return False
    return ray_here(placement) and local_ray_wanted(spec.device, narrowest(spec), placement, n_jobs, pl.gpu_count())


def ray_here(placement: Placement) -> bool:
    """Whether a Ray instance of this run's own can start here: asked for (``--ray local``), or Ray installed."""
    return placement.ray == "local" or importlib.util.find_spec("ray") is not None


def room_for(placement: Placement, gpus: int) -> str:
    """What the host had room for, in the warning of a run that goes one cell at a time without Ray."""
    packed = f", {placement.cells_per_gpu} cells to a GPU by the memory plan" if placement.cells_per_gpu > 1 else ""
    return f"{gpus} GPU{'s' if gpus != 1 else ''} visible{packed} had room for more"


def choose_executor(spec: RunSpec, placement: Placement, n_jobs: int, run_dir: Path, model_path: str,
                    head=None):
    """Ray when asked, or when this host has room for more than one job at a time; else one at a time.
    ``head``: a local Ray instance already started for this run (``placement.early_ray_head``), used instead of
    starting one here."""
    if placement.ray and placement.ray != "local":
        return pl.RayExecutor(str(run_dir.resolve()), model_path, placement.ray)
    gpus = pl.gpu_count()
    if local_ray_wanted(spec.device, narrowest(spec), placement, n_jobs, gpus):
        if not ray_here(placement):  # not imported: see RayExecutor
            logger.warning(f"Ray is not installed: running one cell at a time, where {room_for(placement, gpus)} "
                           "(pip install 'ray>=2.40', the [ray] extra, to run them side by side)")
            return pl.LocalExecutor(str(run_dir), model_path)
        return pl.RayExecutor(str(run_dir.resolve()), model_path, "local", head=head)
    return pl.LocalExecutor(str(run_dir), model_path)


def plan_jobs(spec: RunSpec, run_dir: Path, force: bool, cells_per_gpu: int = 1, offline: bool = False,
              extra_env: dict[str, str] | None = None):
    """What is done already (outcomes), what to run (jobs) and which sharded cells only need merging.
    ``extra_env``: for every job's process on top of its cell's (``Placement.cell_env``)."""
    done: dict[str, CellOutcome] = {}
    jobs: list = []
    merge_only: list = []
    for cell in spec.cells:
        if units.is_done(run_dir, cell.name, identity=spec.identity()) and not force:
            meta = units.read_cell_json(layout.cell_dir(run_dir, cell.name)) or {}
            done[cell.name] = CellOutcome(cell.name, "skipped", 0.0, meta)
            continue
        env = cell_environment(backends.get(cell.backend).environment(spec, cell), offline, cell) \
            | dict(extra_env or {})
        todo = shards.pending_shards(run_dir, cell, force, spec.identity()) if cell.shards > 1 else [0]
        if cell.shards > 1 and not todo:
            merge_only.append(cell)
        for k in todo:  # each job its own port range: engines starting side by side must not race for one
            jobs.append(Job(cell.name, k, cell.shards, gpus=job_gpus(spec, cell, cells_per_gpu), cpus=1.0,
                            env=env | {PORT_BASE_ENV: str(job_port_base(str(run_dir.resolve()), len(jobs)))}))
    return done, jobs, merge_only


def run_matrix(spec: RunSpec, run_dir: Path, model_path: str, *, force: bool = False, offline: bool = False,
               console: Console | None = None, placement: Placement | None = None,
               log: RunLog | None = None, ray_head=None, opts=None,
               reused: reuse.Source | None = None) -> list[CellOutcome]:
    """Run every cell (or shard) not yet done; return one outcome per cell of the spec. ``log`` gets the
    time spent starting the executor, running the cells and stopping it. ``ray_head``: see
    ``placement.early_ray_head``. ``console`` shows the progress (``progress``: live bars on a terminal, timestamped
    lines in a log); messages go to this module's logger. ``reused``: the reference taken from an earlier
    run (``reference_from``), published here instead of run."""
    console = console or Console(stderr=True)
    placement = placement or Placement()
    log = log or RunLog()
    progress.interval()  # a bad EVALPARITY_PROGRESS_S is refused before any cell starts, not after the first
    prepare_run_dir(run_dir, spec, force)
    log.run_dir = run_dir
    if spec.staging:
        return _run_staged(spec, run_dir, model_path, offline, console, placement, log, ray_head, opts, reused)
    if reused is not None:
        _reuse_cell(run_dir, spec, reused)
    outcomes, jobs, merge_only = plan_jobs(spec, run_dir, force, placement.cells_per_gpu, offline,
                                           dict(placement.cell_env))
    if reused is not None:
        outcomes[reused.target].status = "reused"
    skipped = [n for n, o in outcomes.items() if o.status == "skipped"]
    if skipped:
        logger.info(f"{len(skipped)} cell(s) already done, skipped: {', '.join(skipped)} (--force reruns them)")
    by_name = {c.name: c for c in spec.cells}
    for cell in merge_only:
        outcomes[cell.name] = _merge(run_dir, spec, cell, 0.0)
    with log.stage("executor_start"):
        executor = choose_executor(spec, placement, len(jobs), run_dir, model_path, ray_head) \
            if jobs else None
    log.facts.update(executor=executor.name if executor else None, jobs=len(jobs))
    if executor is not None:
        check_room(spec, executor, {j.cell for j in jobs})
    if ray_head is not None:
        if getattr(executor, "head", None) is ray_head:  # its start, from before the setup
            log.facts.update(ray_head_ready_s=round(ray_head.ready_s, 3), ray_head_waited_s=round(ray_head.waited_s, 3))
        else:  # started on a guess that proved wrong (or every cell was done already)
            ray_head.close()
    _start_block(console, spec, run_dir, executor, outcomes)
    if executor is None:
        if reused is not None:
            _check_reused_prompts(run_dir, reused, outcomes)
        return [outcomes[c.name] for c in spec.cells]
    if executor.name == "ray":
        res = executor.resources()
        logger.info(f"Ray: {res.get('GPU', 0):g} GPU(s), {res.get('CPU', 0):g} CPU(s) in the cluster; "
                    f"{len(jobs)} job(s) submitted")
    with progress.display(console, [j.unit for j in jobs], "cells", len(spec.cells), len(outcomes)) as shown:
        unrecorded: dict[str, dict] = {}  # unit -> the failure a full disk kept out of its cell.json
        started: dict[str, float] = {}
        left = {c: sum(j.cell == c for j in jobs) for c in {j.cell for j in jobs}}  # jobs still out, per cell
        executor.submit(jobs)
        cells_t0 = time.perf_counter()
        try:
            while executor.busy():
                for end in executor.poll():
                    job = end.job
                    wall = time.perf_counter() - started.get(job.unit, time.perf_counter())
                    status = _settle(run_dir, by_name[job.cell], end, wall, unrecorded)
                    left[job.cell] -= 1
                    if left[job.cell] == 0:
                        outcomes[job.cell] = _cell_outcome(run_dir, spec, by_name[job.cell], wall, unrecorded)
                        shown.overall(advance=1)
                    shown.finished(job.unit, status)
                for job in executor.running():
                    file = layout.progress_file(units.tmp_dir(run_dir, job.unit, job.location[0]))
                    if shown.watch(job.unit, file):
                        started.setdefault(job.unit, time.perf_counter())
                time.sleep(0.5)
        except BaseException:  # Ctrl-C, or a cell's shards refused at their merge (one line): the others stop
            executor.stop()
            raise
        finally:
            log.mark("cells", cells_t0)
        if executor.name == "ray":
            with log.stage("executor_stop"):
                executor.stop()
    if reused is not None:
        _check_reused_prompts(run_dir, reused, outcomes)
    return [outcomes[c.name] for c in spec.cells]


def _run_staged(spec: RunSpec, run_dir: Path, model_path: str, offline: bool, console: Console, placement: Placement,
                log: RunLog, ray_head, opts, reused: reuse.Source | None = None) -> list[CellOutcome]:
    """A staged spec: its rounds (``stager``), each cell one job, or one per replica (``--shards``), but a reused
    reference, on the executor the cells would get."""
    gpus = {c.name: job_gpus(spec, c, placement.cells_per_gpu) for c in spec.cells}
    envs = {c.name: cell_environment(backends.get(c.backend).environment(spec, c), offline, c)
            | dict(placement.cell_env) for c in spec.cells}
    replicas = [(c.name, k) for c in spec.cells for k in range(c.shards)]  # each its own port range
    ports = {rep: job_port_base(str(run_dir.resolve()), i) for i, rep in enumerate(replicas)}
    shards_of = {c.name: c.shards for c in spec.cells}

    def make_job(name: str, mode: str, k: int = 0) -> Job:
        return Job(name, k, shards_of[name], gpus=gpus[name], cpus=1.0,
                   env=envs[name] | {PORT_BASE_ENV: str(ports[name, k])}, staged=mode)

    n_jobs = sum(c.shards for c in spec.cells if reused is None or c.name != reused.target)
    with log.stage("executor_start"):
        executor = choose_executor(spec, placement, n_jobs, run_dir, model_path, ray_head)
    log.facts.update(executor=executor.name, jobs=n_jobs, staged=True)
    check_room(spec, executor, {c.name for c in spec.cells} - ({reused.target} if reused is not None else set()))
    if ray_head is not None and getattr(executor, "head", None) is not ray_head:
        ray_head.close()
    _start_block(console, spec, run_dir, executor, {})
    cells_t0 = time.perf_counter()
    try:
        got = stager.run(spec, run_dir, opts, executor, make_job, console, placement.cells_per_gpu, reused)
    finally:
        log.mark("cells", cells_t0)
        if executor.name == "ray":
            with log.stage("executor_stop"):
                executor.stop()
    return [CellOutcome(c.name, got[c.name]["status"], got[c.name]["wall_s"], got[c.name]["meta"]) for c in spec.cells]


def _settle(run_dir: Path, cell, end, wall: float, unrecorded: dict[str, dict]) -> str:
    """A job has ended: if its process died before publishing, record that (or, when the record cannot be
    written, keep it in ``unrecorded``); return its status."""
    folder, unit = end.job.location
    if units.tmp_dir(run_dir, unit, folder).exists():
        meta = _record_crash(run_dir, cell, end, wall)
        if meta is not None:
            unrecorded[unit] = meta
            return meta["status"]
    return _final_meta(run_dir, unit, folder).get("status", "failed")


def _cell_outcome(run_dir: Path, spec: RunSpec, cell, wall: float,
                  unrecorded: dict[str, dict] | None = None) -> CellOutcome:
    """A cell whose jobs have all ended: its own outcome, or, for a sharded cell, the merge of its shards."""
    unrecorded = unrecorded or {}
    if cell.shards == 1:
        meta = unrecorded.get(cell.name) or _final_meta(run_dir, cell.name, CELLS)
        return CellOutcome(cell.name, meta.get("status", "failed"), wall, meta)
    bad = shards.pending_shards(run_dir, cell, False, spec.identity())
    if bad:
        why = "; ".join(f"shard {unit}: {m['error']}" for unit, m in unrecorded.items()
                        if unit.startswith(f"{cell.name}.") and m.get("error"))
        return CellOutcome(cell.name, "failed", wall, {
            "status": "failed", "error": f"shard(s) {bad} of {cell.shards} failed: "
                                         + (why or f"see shards/{cell.name}.<k>of{cell.shards}/cell.log")})
    return _merge(run_dir, spec, cell, wall)


def _merge(run_dir: Path, spec: RunSpec, cell, wall: float) -> CellOutcome:
    try:
        meta = shards.merge(run_dir, spec, cell)
    except (OSError, ValueError) as err:
        return CellOutcome(cell.name, "failed", wall, {"status": "failed", "error": f"merging shards: {err}"})
    return CellOutcome(cell.name, "ok", meta.get("wall_s", wall), meta)


def _final_meta(run_dir: Path, unit: str, folder: str) -> dict:
    """The newest outcome of a unit: its published folder, or the ``.failed`` one beside a finished cell."""
    meta = units.read_cell_json(layout.unit_dir(run_dir, unit, folder)) or {}
    failed_meta = units.read_cell_json(layout.failed_dir(run_dir, unit, folder))
    if failed_meta and failed_meta.get("finished", "") > meta.get("finished", ""):
        meta = failed_meta
    return meta


def _start_block(console: Console, spec: RunSpec, run_dir: Path, executor, done: dict) -> None:
    """The lines a run starts with (``progress.run_block``), once its executor is known."""
    if executor is None:
        how = "none: every cell is done already (--force reruns them)"
    elif executor.name == "local":
        how = "local, one cell at a time"
    else:
        how = f"{executor.name}, cells side by side as its resources allow"
    progress.run_block(console, model=spec.model, device=spec.device, cells=[c.name for c in spec.cells],
                       done=done, out=run_dir, executor=how)


def _record_crash(run_dir: Path, cell, end, wall: float) -> dict | None:
    """The job's process died before publishing (killed, out of memory, its host lost, or a full disk kept
    it from writing its record): record that, with the reason it sent (``placement.job_reason``). If the
    record cannot be written either, return it, to be kept in memory and printed; the job's folder (and
    its log, if any) stays where it is until the cell is rerun."""
    folder, unit = end.job.location
    tmp = units.tmp_dir(run_dir, unit, folder)
    code = end.returncode
    why = end.error or f"the cell process exited with code {code} without saying why"
    if code is not None and code < 0:
        why = f"the cell process was killed by signal {-code}" + (" (out of memory?)" if -code == 9 else "") \
            + (f"; it had said: {end.error}" if end.error else "")
    meta = cells.failed_meta(cell, why, wall_s=wall, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             placement=end.placement)
    try:
        records.write_cell(tmp, meta)
        layout.progress_file(tmp).unlink(missing_ok=True)
        units.publish(run_dir, unit, STATUS_FAILED, folder)
        return None
    except OSError as err:
        log = layout.log_file(tmp)
        meta["error"] = (f"{why}; this failure could not be recorded in {run_dir} either ({err.strerror or err})"
                         + (f"; its log so far: {log}" if log.is_file() and log.stat().st_size else ""))
        meta["unrecorded"] = True
        return meta


def summary_table(outcomes: list[CellOutcome]) -> Table:
    """One line per cell: status, where (on GPUs or Ray), load/eval/wall seconds, peak RSS. The scores are
    ``scores_table``'s: in one table the aggregate column took 4 lines per cell and cut values at 80
    columns, the width of a CI log (issue 27)."""
    t = Table(title="cells")
    # "where" (host and GPUs) only says something when cells ran on GPUs or through Ray
    places = [p for o in outcomes for p in _places(o.meta)]
    show_where = any(p.get("gpu_ids") or p.get("executor") == "ray" for p in places)
    for col in ("cell", "status", "where", "load s", "eval s", "wall s", "peak RSS GiB"):
        if col != "where" or show_where:
            t.add_column(col, overflow="fold" if col in ("status", "where") else "ellipsis",
                         justify="right" if col.endswith(("s", "GiB")) and col != "status" else "left")
    for o in outcomes:
        m = o.meta
        status = o.status if o.status != "failed" else f"[red]failed[/red]: {escape(visible(m.get('error', '')[:60]))}"
        row = [o.name, status, where(m), _num(m.get("load_s")), _num(m.get("eval_s")), _num(m.get("wall_s")),
               _num(m.get("peak_rss_gib"), 2)]
        t.add_row(*(row if show_where else row[:2] + row[3:]))
    return t


SCORED = ("acc", "acc_norm", "exact_match")  # the headline metrics shown per cell


def scores_table(outcomes: list[CellOutcome]) -> Table | None:
    """lm-eval's headline scores (acc, acc_norm, exact_match per filter) as rows, a column per cell, three
    decimals: six cells fit in 80 columns, and a value is never cut. None when no cell has one."""
    scores: dict[tuple[str, str], dict[str, float]] = {}
    for o in outcomes:
        for task, vals in (o.meta.get("aggregate") or {}).items():
            for k, v in vals.items():
                metric, _, filt = k.partition(",")
                if metric in SCORED and isinstance(v, float):
                    label = metric + ("" if filt in ("", "none") else f" ({filt})")
                    scores.setdefault((task, label), {})[o.name] = v
    if not scores:
        return None
    names = [o.name for o in outcomes if any(o.name in row for row in scores.values())]
    # no vertical rules, one label column, cell names broken at their first dash ("vllm" over "fp32")
    t = Table(title="scores", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    t.add_column("task metric", overflow="fold")
    for name in names:
        t.add_column(escape(visible(name)).replace("-", "\n", 1), justify="right", overflow="fold")
    for (task, label), row in scores.items():
        t.add_row(escape(visible(f"{task} {label}")), *(f"{row[n]:.3f}" if n in row else "-" for n in names))
    return t


def _num(x, digits: int = 1) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "-"


def _places(meta: dict) -> list[dict]:
    """A cell's recorded placement as a list: one entry, or one per shard of a sharded cell."""
    p = meta.get("placement")
    return [x for x in (p if isinstance(p, list) else [p]) if isinstance(x, dict)]


def where(meta: dict) -> str:
    """'host:gpu0' (or one line per shard) from a cell's recorded placement."""
    out = []
    for p in _places(meta):
        gpus = ",".join(p.get("gpu_ids") or [])
        out.append(f"{p.get('host', '?')}{':gpu' + gpus if gpus else ''}")
    return "\n".join(out) or "-"
