"""A staged run's cells, round by round: score a look, decide, score the next look of what is open.

``matrix.run_matrix`` hands a staged spec (``RunSpec.staging``) here. The loop:

1. round 0 is every staged task's first look (``staging``); its record is ``stages/round-0.json``;
2. every cell scores the round and publishes its part (``cells.run_staged``);
3. once every cell has, the statistics replay the looks so far (``stats.compare.look``): tasks whose gating
   comparisons are all settled stop, the others get their next look in the next round's record;
4. when no task is open, ``stages/finish.json`` ends the cells' processes and each cell's parts are merged
   into ``cells/<cell>`` (one table, one sealed record), which the statistics stage reads like any cell.

Cells stay loaded across rounds when the executor can run all of them at once (Ray with room for every
cell: packed on one GPU, or one per GPU); otherwise (one cell at a time) each cell's process scores one
round and exits, and is started again for the next: a reload per round, the price of not holding them all.

A killed run resumes at its last finished round: parts already published are never scored again, and a
round record already written is checked against the decisions that led to it.

A reference reused from an earlier run (``--reference-from``, ``rundir.reuse``) is no job: each round, its part
is published from the source's rows of that round's docs (``publish_reused``) before the other cells score
theirs, and its prompts are checked against theirs before the round is decided on.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import pandas as pd
from rich.console import Console

from evalparity import cells, memplan, progress, samples, staging
from evalparity.config import CELLS, STAGES
from evalparity.errors import EvalParityError
from evalparity.rundir import layout, records, rounds, units
from evalparity.rundir.records import STATUS_FAILED, STATUS_OK
from evalparity.rundir.reuse import Source
from evalparity.shards import aggregate, check_one_cell, stage_merged, verify_finished
from evalparity.spec import CellSpec, RunSpec
from evalparity.staging import StagingPlan

logger = logging.getLogger(__name__)


def first_request(plan: StagingPlan, identity: str) -> rounds.RoundRequest:
    return staging.request_for(plan, identity, 0, [u.name for u in plan.units])


def next_request(plan: StagingPlan, identity: str, r: int, trace) -> rounds.RoundRequest | None:
    """Round r's record from the decisions on rounds 0..r−1: the next look of every task still open."""
    units_ = trace.next_units()
    return staging.request_for(plan, identity, r, units_) if units_ else None


def read_parts(run_dir: Path, spec: RunSpec, upto: int) -> tuple[dict[str, pd.DataFrame], dict[str, dict]]:
    """Every cell's parts of rounds 0..upto, concatenated, and the newest part's record: what the decision
    after round ``upto`` reads. A part is verified (record, identity, seal) like a cell."""
    tables, metas = {}, {}
    identity = spec.identity()
    for cell in spec.cells:
        parts, seen = [], []
        for r in range(upto + 1):
            folder = rounds.part_dir(run_dir, cell.name, r)
            rec = records.verify_part(folder, identity, cell, spec.model_digest, {"round": r, "shard": None})
            if rec is None:
                break
            parts.append(samples.read_table(layout.table(folder)))
            metas[cell.name] = rec.to_json()
            seen.append((folder, metas[cell.name]))
        check_one_cell(run_dir, cell.name, seen, "rounds")  # decided on as one cell's: they must be one
        if len(parts) == upto + 1:
            tables[cell.name] = pd.concat(parts, ignore_index=True)
        else:
            metas.pop(cell.name, None)
    return tables, metas


def has_part(run_dir: Path, spec: RunSpec, cell: str, r: int) -> bool:
    return units.is_done(run_dir, rounds.part_name(cell, r), STAGES, identity=spec.identity())


def has_share(run_dir: Path, spec: RunSpec, cell: CellSpec, r: int, k: int) -> bool:
    """Whether replica k's share of the cell's round r is in (or the part merged from the shares)."""
    return has_part(run_dir, spec, cell.name, r) or units.is_done(
        run_dir, rounds.replica_part_name(cell.name, r, k, cell.shards), STAGES, identity=spec.identity())




def merge_replicas(run_dir: Path, spec: RunSpec, cell: CellSpec, r: int, side_by_side: bool = True) -> bool:
    """The cell's part of round r from its replicas' shares (``cells.run_staged`` with a shard), once every
    share is in: each verified as a part is (of this cell, round, spec and model, its table the one it
    sealed, the replica it says) and to hold exactly its share of the round's docs
    (``RoundRequest.replica_share``); the replicas must agree on what makes a cell's numbers
    (``shards.check_one_cell``: device, versions, precision, interpreter, provenance). Merged into one
    table, recorded like an unsharded part (timings: the slowest replica's when they ran ``side_by_side``,
    else their sum) and published with one rename. Whether the cell's part is in (a cell with one replica
    publishes it itself)."""
    if has_part(run_dir, spec, cell.name, r):
        return True
    n = cell.shards
    if n == 1 or not all(has_share(run_dir, spec, cell, r, k) for k in range(n)):
        return False
    request = rounds.read_round(run_dir, r, spec.identity())
    if request is None:
        return False
    dirs = [rounds.replica_part_dir(run_dir, cell.name, r, k, n) for k in range(n)]
    metas = []
    for k, folder in enumerate(dirs):
        fix = f"remove {folder} and rerun the same command to score that share again"
        place = {"round": r, "shard": {"index": k, "of": n}}
        if records.verify_part(folder, spec.identity(), cell, spec.model_digest, place) is None:
            return False
        metas.append(units.read_cell_json(folder) or {})
        rows = samples.read_table(layout.table(folder))
        have = set(zip(rows["task"], rows["doc_id"].astype(int)))
        want = {(leaf, d) for leaf, ids in request.replica_share(k, n).docs.items() for d in ids}
        if have != want:
            raise EvalParityError(f"{folder}: it holds {len(have - want)} doc(s) outside replica {k + 1} of {n}'s "
                                  f"share of round {r + 1} and lacks {len(want - have)} of it: {fix}")
    name = rounds.part_name(cell.name, r)
    out, table, seal, _ = stage_merged(run_dir, name, dirs, "replicas", STAGES)  # shares disjoint: checked
    meta = {k: v for k, v in metas[0].items() if k not in ("shard", "placement", "pid", "aggregate", "n_rows")}
    timing = max if side_by_side else sum
    meta |= {key: timing(m.get(key) or 0.0 for m in metas) for key in ("load_s", "eval_s", "write_s", "wall_s")}
    meta |= {
        "status": STATUS_OK, "table": seal.to_json(), "n_rows": int(len(table)), "aggregate": aggregate(table),
        "replicas": [{"index": k, "n_rows": m.get("n_rows"), "load_s": m.get("load_s"), "eval_s": m.get("eval_s"),
                      "wall_s": m.get("wall_s"), "pid": m.get("pid"), "host": m.get("host"),
                      "placement": m.get("placement")} for k, m in enumerate(metas)],
        "replicas_side_by_side": side_by_side,
        "placement": [m.get("placement") for m in metas], "pid": [m.get("pid") for m in metas],
        "peak_rss_gib": max(m.get("peak_rss_gib") or 0.0 for m in metas),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    gpu = [m["peak_gpu_gib"] for m in metas if m.get("peak_gpu_gib") is not None]
    if gpu:
        meta["peak_gpu_gib"] = max(gpu)
    records.write_cell(out, meta)
    units.publish(run_dir, name, STATUS_OK, STAGES)
    return True


def check_replica_counts(run_dir: Path, spec: RunSpec, reused: Source | None) -> None:
    """A staged run keeps its cells' replica counts from its first part to its last: a resume with another
    ``--shards`` would split later rounds otherwise (with few-shot tasks, into other prompts, which the
    alignment check would refuse at the end, after the GPU time). Refused in one line, before any cell
    starts, naming the count the run's parts were scored with."""
    for cell in spec.cells:
        if reused is not None and cell.name == reused.target:
            continue
        r = 0
        while True:
            folder = rounds.part_dir(run_dir, cell.name, r)
            rec = records.read_cell(folder) if folder.is_dir() and not folder.is_symlink() else None
            if rec is None or not rec.ok:
                break
            n = len(rec.extra.get("replicas") or []) or 1
            if n != cell.shards:
                raise EvalParityError(f"{folder} was scored by {n} replica(s) per cell and this run asks for "
                                      f"{cell.shards}: rerun with --shards {n}, or remove the run's stages/ and "
                                      "cells/ folders to score it again")
            r += 1
        for share in sorted((run_dir / STAGES).glob(f"{cell.name}.r*.*of*")):
            if share.name.endswith(f"of{cell.shards}") or not share.is_dir():
                continue
            raise EvalParityError(f"{share} is a share of another number of replicas than this run's "
                                  f"{cell.shards}: rerun with the --shards it was scored with, or remove it")


def merge_parts(run_dir: Path, spec: RunSpec, cell, n_rounds: int, wall: float) -> dict:
    """Write and publish ``cells/<cell>`` from its parts of rounds 0..n_rounds−1: one table sorted like an
    unstaged cell's, a record whose timings are the parts' (load once, evaluation summed). Each part verified
    again as it is merged (a resume merges parts that an earlier process published)."""
    dirs = [rounds.part_dir(run_dir, cell.name, r) for r in range(n_rounds)]
    verify_finished(spec, cell, [(d, {"round": r, "shard": None}) for r, d in enumerate(dirs)])
    out, table, seal, metas = stage_merged(run_dir, cell.name, dirs, "rounds")
    homes = [layout.log_file(units.tmp_dir(run_dir, rounds.replica_name(cell.name, k, cell.shards), STAGES))
             for k in range(cell.shards)]
    if cell.shards == 1 and homes[0].exists():
        shutil.copyfile(homes[0], layout.log_file(out))
    elif any(h.exists() for h in homes):  # one log per replica's process, named (as shards.merge does)
        layout.log_file(out).write_text("".join(f"replica {k + 1}: {h.relative_to(run_dir)}\n"
                                                for k, h in enumerate(homes) if h.exists()))
    first = metas[0]
    keep = ("cell", "backend", "dtype", "batch_size", "tag", "tf32", "base_cell", "variant", "model", "model_path",
            "spec_identity", "run_cells", "model_fingerprint", "device", "device_name", "versions", "settings",
            "precision",
            "environment", "model_args", "placement", "reused_from", "interpreter")
    meta = {k: first.get(k) for k in keep if k in first}
    meta |= {"status": STATUS_OK, "table": seal.to_json(), "n_rows": int(len(table)),
             "load_s": sum(m.get("load_s") or 0.0 for m in metas),
             "eval_s": sum(m.get("eval_s") or 0.0 for m in metas),
             "write_s": sum(m.get("write_s") or 0.0 for m in metas),
             "wall_s": wall or sum(m.get("wall_s") or 0.0 for m in metas),
             "rounds": [{"round": r, "rows": int(m.get("n_rows", 0)), "load_s": m.get("load_s"),
                         "eval_s": m.get("eval_s"), "pid": m.get("pid"), "placement": m.get("placement"),
                         "scored_ahead": bool(m.get("scored_ahead")),  # before the run asked (cells.Ahead)
                         "ahead_discarded": m.get("ahead_discarded") or []}  # and thrown away before it
                        for r, m in enumerate(metas)],
             "aggregate": aggregate(table), "peak_rss_gib": max(m.get("peak_rss_gib") or 0 for m in metas),
             "started": first.get("started"), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    gpu = [m["peak_gpu_gib"] for m in metas if m.get("peak_gpu_gib") is not None]
    if gpu:
        meta["peak_gpu_gib"] = max(gpu)
    if first.get("reused_from"):  # rows of an earlier run (rundir.reuse): nothing was loaded or timed here
        for key in ("load_s", "eval_s", "write_s", "wall_s", "peak_rss_gib"):
            meta.pop(key)
    records.write_cell(out, meta)
    units.publish(run_dir, cell.name, STATUS_OK, CELLS)
    return meta


def publish_reused(run_dir: Path, spec: RunSpec, source: Source, docs: dict[str, list[int]], unit: str,
                   folder: str = CELLS, where: str = "", **extra) -> dict:
    """Publish the reused reference's rows of ``docs`` as the unit ``folder/unit`` of this run (its cell, or a
    round's part with ``round=r`` in ``extra``), as a cell publishes its own: the table written and sealed
    here, its record (``Source.published_record``: made under this run's identity, naming the source), one rename."""
    rows = source.rows(docs, where)
    out = units.tmp_dir(run_dir, unit, folder)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    samples.write_table(rows, layout.table(out))
    meta = source.published_record(spec, records.seal_table(out, len(rows)), len(rows), aggregate(rows), **extra)
    records.write_cell(out, meta)
    units.publish(run_dir, unit, STATUS_OK, folder)
    return meta


def reuse_round(run_dir: Path, spec: RunSpec, source: Source, request: rounds.RoundRequest) -> None:
    """The reused reference's part of round ``request.round``: published from the source's rows of the
    round's docs (not its padding: a scored part drops that too), or, on a resume, checked to be that."""
    r = request.round
    folder = rounds.part_dir(run_dir, source.target, r)
    if has_part(run_dir, spec, source.target, r):
        source.check_published(folder)
        return
    publish_reused(run_dir, spec, source, request.docs, rounds.part_name(source.target, r), STAGES,
                   where=f"in round {r + 1}", round=r)


def record_failure(run_dir: Path, cell, why: str, wall: float, placement: dict | None = None,
                   home: str | None = None) -> dict:
    """A staged cell whose process (``home``: the replica's, when it has several) failed: its record in
    ``cells/`` (kept beside a finished one), with that process's log, so that the run's summary and
    ``attempts/`` show it like any failed cell."""
    tmp = units.tmp_dir(run_dir, cell.name)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    home_log = layout.log_file(units.tmp_dir(run_dir, home or cell.name, STAGES))
    if home_log.exists():
        shutil.copyfile(home_log, layout.log_file(tmp))
    meta = cells.failed_meta(cell, why, wall_s=wall, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             placement=placement or {})
    records.write_cell(tmp, meta)
    units.publish(run_dir, cell.name, STATUS_FAILED, CELLS)
    return meta


def round_line(r: int, request: rounds.RoundRequest, trace, plan: StagingPlan) -> str:
    """One line per round for the log: what it scored and what the statistics decided."""
    parts = []
    for name in request.tasks:
        t = trace.units[name]
        n = t.looks[min(t.reached, len(t.looks) - 1)]
        if t.open:
            settled = sum(1 for res in t.results.values() if res.settled) + len(t.direct)
            parts.append(f"{name} {n:,} docs, open ({settled} settled): next look {t.looks[t.reached + 1]:,}")
        else:
            parts.append(f"{name} stops at {n:,} of {t.looks[-1]:,} docs ({t.why})")
    return f"round {r + 1}: " + "; ".join(parts)


def can_hold_all(executor, spec: RunSpec, cells_per_gpu: int, scored: list[CellSpec]) -> bool:
    """Whether the executor runs every cell of ``scored`` at once (then cells stay loaded across rounds): the
    one-at-a-time executor only when there is one (a candidate signed off against ``--reference-from``: a cell
    restarted every round reloaded its model each time, 137 s on an H200 against 82 s for the same candidate
    beside a scored reference on Ray); on Ray, when its GPUs (or, on CPU, its CPUs) have room for all of them:
    each tensor-parallel replica's GPUs whole, the others ``cells_per_gpu`` to a GPU (``memplan.gpus_to_hold``)."""
    n_jobs = sum(c.shards for c in scored)
    if executor.name != "ray":
        return n_jobs == 1
    res = executor.resources()
    if spec.device == "cpu":
        return res.get("CPU", 0) >= n_jobs
    sizes = [spec.cell_gpus(c) for c in scored for _ in range(c.shards)]  # every replica's
    need = memplan.gpus_to_hold(sizes, cells_per_gpu)
    # a replica's GPUs are one host's: with a replica over several GPUs, the cluster's total can hold them all
    # while the cells Ray spread over its hosts leave no host with room for it, and the loaded cells would
    # wait for it for ever; then only the largest host counts
    room = executor.most_gpus() if max(sizes, default=1) > 1 else res.get("GPU", 0)
    return need <= room


def run(spec: RunSpec, run_dir: Path, opts, executor, make_job, console: Console, cells_per_gpu: int = 1,
        reused: Source | None = None) -> dict:
    """Every round the decisions ask for, then the merge: outcomes (``matrix.CellOutcome`` fields as dicts) by
    cell. ``make_job(cell, mode)`` builds a cell's job; ``opts`` are the statistics options that decide;
    ``console`` shows the rounds and the cells' progress (``progress``: live bars, or lines in a log);
    ``reused``: the reference taken from an earlier run, each round's part published from it, never scored."""
    from evalparity.stats.compare import look  # heavy: scipy (the decisions between rounds)

    plan = StagingPlan.from_json(spec.staging)
    identity = spec.identity()
    by_name = {c.name: c for c in spec.cells}
    first = first_request(plan, identity)
    have = rounds.read_round(run_dir, 0, identity)
    if have is None:
        rounds.write_round(run_dir, first)
    elif not staging.same_request(have, first):  # every field: tasks, docs, padding, groups (review F9)
        raise EvalParityError(f"{layout.round_file(run_dir, 0)} asks for other docs than the run's staging plan: "
                              "remove the run's stages/ and cells/ folders and rerun")
    scored = [c for c in spec.cells if reused is None or c.name != reused.target]
    check_replica_counts(run_dir, spec, reused)
    rounds.clear_finish(run_dir)  # after the checks: a refused resume leaves the finished run as it was
    mode = "resident" if can_hold_all(executor, spec, cells_per_gpu, scored) else "round"
    if mode == "round" and any(c.shards > 1 for c in scored):
        logger.warning("staged: the executor runs one process at a time, so a cell's replicas (--shards) run one "
                       "after another and each loads the model every round: --shards 1 is faster here")
    logger.info(f"staged: {len(plan.units)} task(s), up to {plan.rounds} round(s); cells "
                + ("stay loaded across rounds" if mode == "resident" else "are started once per round (the "
                   "executor runs one at a time)"))
    live: dict[str, object] = {}  # the jobs running, by unit (a cell, or one of its replicas)
    t0 = {c.name: time.perf_counter() for c in spec.cells}
    failed: dict[str, dict] = {}
    r = 0
    with progress.display(console, _rows(spec, reused), "round 1") as shown:
        try:
            while True:
                request = rounds.read_round(run_dir, r, identity)
                shown.overall(description=f"round {r + 1}: {request.n_docs():,} docs per cell "
                                          f"({', '.join(request.tasks)})")
                if reused is not None:
                    reuse_round(run_dir, spec, reused, request)
                    shown.finished(reused.target, f"round {r + 1} reused", count=r + 1)
                failed = _score_round(run_dir, spec, r, executor, make_job, mode, live, shown, by_name, t0)
                if failed:
                    break
                tables, metas = read_parts(run_dir, spec, r)
                if reused is not None:
                    reused.check_prompts(run_dir, tables)
                trace = look(tables, metas, opts, plan)
                shown.line(round_line(r, request, trace, plan))
                want = next_request(plan, identity, r + 1, trace)
                have = rounds.read_round(run_dir, r + 1, identity)
                if have is not None and (want is None or not staging.same_request(have, want)):
                    raise EvalParityError(f"{layout.round_file(run_dir, r + 1)} asks for other docs than these "
                                          f"statistics options decide on rounds 1..{r + 1} (the run decided its "
                                          "rounds with others: a margin, alpha, --compare or --reference): rerun with "
                                          "the options the run was made with to resume it, or with these into a new "
                                          "--out")
                if want is None:
                    rounds.write_finish(run_dir, r + 1, identity)
                    break
                if have is None:
                    rounds.write_round(run_dir, want)
                r += 1
        except BaseException:
            executor.stop()
            raise
        _wait_residents(executor, live, run_dir)
        for leftover in rounds.ahead_dirs(run_dir):  # rounds scored ahead that the run did not ask for
            shutil.rmtree(leftover, ignore_errors=True)
    if failed:
        return failed
    n_rounds = r + 1
    out = {}
    for cell in spec.cells:
        folder = layout.cell_dir(run_dir, cell.name)
        rec = records.read_cell(folder)
        is_reused = reused is not None and cell.name == reused.target
        wall = 0.0 if is_reused else time.perf_counter() - t0[cell.name]
        merged = rec is not None and rec.ok and rec.spec_identity == identity
        if merged and len(rec.extra.get("rounds", [])) == n_rounds:
            if is_reused:
                reused.check_published(folder)
            out[cell.name] = {"status": "reused" if is_reused else "skipped", "wall_s": 0.0, "meta": rec.to_json()}
            continue
        out[cell.name] = {"status": "reused" if is_reused else "ok", "wall_s": wall,
                          "meta": merge_parts(run_dir, spec, cell, n_rounds, wall)}
    return out


def _rows(spec: RunSpec, reused: Source | None) -> list[str]:
    """The progress display's rows: a cell's (a reused reference's: no process), or one per replica of a
    cell with several."""
    rows = []
    for c in spec.cells:
        n = 1 if reused is not None and c.name == reused.target else c.shards
        rows += [rounds.replica_name(c.name, k, n) for k in range(n)]
    return rows


def _score_round(run_dir, spec, r, executor, make_job, mode, live, shown: progress.Display, by_name, t0) -> dict:
    """Every cell's part of round r: start the cells (or their replicas) that lack it and are not running,
    wait for all parts (a cell's replicas' shares merged into its part as soon as all are in). A cell that
    fails stops the round (and the run): its failure is recorded, the others are stopped, and the outcomes
    of all cells are returned; {} when every part is in."""
    side = mode == "resident"  # replicas ran side by side (their part's timings: the slowest's, not the sum)
    lacking = [c.name for c in spec.cells if not merge_replicas(run_dir, spec, c, r, side)]
    jobs = [make_job(name, mode, k) for name in lacking for k in range(by_name[name].shards)
            if rounds.replica_name(name, k, by_name[name].shards) not in live
            and not has_share(run_dir, spec, by_name[name], r, k)]
    for job in jobs:
        live[job.unit] = job
    if jobs:
        executor.submit(jobs)
    reported: set[str] = set()
    while True:
        missing = [n for n in lacking if not merge_replicas(run_dir, spec, by_name[n], r, side)]
        for name in lacking:  # each unit's round as soon as its share is in (one at a time: long before the last)
            cell = by_name[name]
            for k in range(cell.shards):
                row = rounds.replica_name(name, k, cell.shards)
                if row not in reported and has_share(run_dir, spec, cell, r, k):
                    shown.finished(row, f"round {r + 1} done", count=r + 1)
                    reported.add(row)
        for end in executor.poll():
            name = end.job.cell
            live.pop(end.job.unit, None)
            if end.returncode != 0 or (name in missing and not has_share(run_dir, spec, by_name[name], r,
                                                                         end.job.shard)):
                why = end.error or (f"the cell process exited with code {end.returncode}" if end.returncode
                                    else f"its process ended without scoring round {r + 1}")
                executor.stop()
                live.clear()
                wall = time.perf_counter() - t0[name]
                replica = f" (replica {end.job.shard + 1} of {end.job.shards})" if end.job.shards > 1 else ""
                meta = record_failure(run_dir, by_name[name], f"round {r + 1}{replica}: {why}", wall, end.placement,
                                      home=end.job.unit)
                shown.finished(end.job.unit, f"failed in round {r + 1}")
                out = {name: {"status": "failed", "wall_s": wall, "meta": meta}}
                for other in spec.cells:
                    if other.name != name:
                        out[other.name] = {"status": "failed", "wall_s": 0.0, "meta": {
                            "status": "failed", "error": f"stopped in round {r + 1}, when {name} failed: rerun the "
                                                          "same command to resume at that round"}}
                return out
        for unit, job in live.items():
            if job.cell in missing and not has_share(run_dir, spec, by_name[job.cell], r, job.shard):
                # not once its share is in: what it does next belongs to the next round
                shown.watch(unit, layout.progress_file(units.tmp_dir(run_dir, unit, STAGES)))
        if not missing:
            if mode == "round":  # each process ends after its round: collect them before the next round
                _drain(executor, live)
            return {}
        time.sleep(0.3)


def _drain(executor, live: dict, timeout: float = 120.0) -> None:
    """Wait for the one-round processes of a round that is complete to exit (their parts are published)."""
    end = time.monotonic() + timeout
    while executor.busy() and time.monotonic() < end:
        for e in executor.poll():
            live.pop(e.job.unit, None)
        time.sleep(0.1)
    if executor.busy():
        executor.stop()
    live.clear()


def _wait_residents(executor, live: dict, run_dir: Path, timeout: float = 60.0) -> None:
    """Resident cells see ``finish.json`` and exit; wait for them (a stuck one is stopped). Those that are
    scoring a round ahead (``cells.scoring_ahead``) read it only once that round is done: every part the run
    needs is published, so they are stopped at once instead of waited for."""
    end = time.monotonic() + timeout
    while executor.busy() and time.monotonic() < end:
        for ended in executor.poll():
            live.pop(ended.job.unit, None)
        if live and all(cells.scoring_ahead(run_dir, unit) for unit in live):
            break
        time.sleep(0.2)
    if executor.busy():
        executor.stop()
    live.clear()


