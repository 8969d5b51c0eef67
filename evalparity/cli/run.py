"""``evalparity run``: the backend x dtype matrix on lm-eval tasks, then drift (if asked), the statistics and
the sign-off report.

``run`` itself only composes the steps below, in the order that matters: everything the arguments alone can
get wrong is refused before the run directory is locked; the lock comes before anything is started; the
run's own Ray instance starts before the slow setup so the two overlap; every task's data is checked before
any model loads; and the exit code says the worst of the cells and the sign-off.

Its options come in groups (``cli.options.verb``), each declared once below, beside the statistics and
outputs that ``report`` and ``compare`` take too; a step takes the groups it reads.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from evalparity import backends, config, failures, memplan, mps, procs, rundir, signoff, variants, warmup
from evalparity import tasks as tasks_mod
from evalparity.cli.finish import finish
from evalparity.cli.options import (
    OUTPUTS,
    DatasetsDir,
    Device,
    Outputs,
    Statistics,
    at_least,
    check_seed,
    verb,
)
from evalparity.cli.output import console, log, safe, timestamped_log
from evalparity.config import DRIFT
from evalparity.data import embedded, mirrors
from evalparity.devices import check_dtypes, resolve_device
from evalparity.errors import EXIT_CELL_FAILED, EvalParityError
from evalparity.models import check_cell_model, check_local_model, resolve_model
from evalparity.printable import visible
from evalparity.rundir import layout, records, reuse
from evalparity.runlog import RunLog
from evalparity.spec import (
    Alignment,
    RunSpec,
    build_cells,
    cell_gpus,
    check_limit,
    check_repeats_have_base,
    check_two_cells,
    fraction_limits,
    model_label,
    own_gpus,
    parse_batch_size,
    parse_task_limits,
    split_list,
)
from evalparity.stats.options import check_metric_names

EMBEDDED_LIMIT = 6
MODEL, CELLS, ALIGN, PLACE, STAGE = ("Model and tasks", "Cells", "Alignment (what would pass for drift)", "Placement",
                                     "Staging")  # help panels


# ------------------------------------------------------------------ the options, by what reads them
@dataclass(frozen=True)
class ModelAndTasks:
    """What is evaluated: the model, its tasks and how many of their documents."""

    model: Annotated[str | None, typer.Option(rich_help_panel=MODEL, help="Local path or hub id. Default: the embedded SmolLM2-135M-Instruct.")] = None
    tasks: Annotated[str | None, typer.Option(rich_help_panel=MODEL, help="lm-eval task/group names, comma-separated. Default: gpqa_diamond_zeroshot,gsm8k (embedded data).")] = None
    limit: Annotated[str | None, typer.Option(rich_help_panel=MODEL, help="Documents per task, or a fraction below 1 of each task's (as lm-eval's --limit 0.1). Default: all (6 for the embedded default run).")] = None
    num_fewshot: Annotated[int | None, typer.Option(rich_help_panel=MODEL, help="Few-shot examples (default: the task's own; 0 for the embedded default run).")] = None
    task_limit: Annotated[list[str] | None, typer.Option(rich_help_panel=MODEL, help="Per-task document limit TASK=N, overriding --limit for that task. Repeatable.")] = None
    include_path: Annotated[list[str] | None, typer.Option(rich_help_panel=MODEL, help="Folder of extra task YAMLs. Repeatable.")] = None
    datasets_dir: DatasetsDir = None


@dataclass(frozen=True)
class CellOptions:
    """The matrix: which cells, on which device, at which batch size, with which extra model arguments."""

    backends: Annotated[str | None, typer.Option(rich_help_panel=CELLS, help="Backends, comma-separated: vllm, hf. Default: vllm,hf; with --cell, only the reference's.")] = None
    dtypes: Annotated[str | None, typer.Option(rich_help_panel=CELLS, help="fp32/float32, bf16/bfloat16, fp16/float16, comma-separated. Default: all three; with --cell, only the reference's.")] = None
    device: Device = "auto"
    batch_size: Annotated[str | None, typer.Option(rich_help_panel=CELLS, help="Batch size of every main cell: a number or auto (default: 8 on CPU, auto on GPU).")] = None
    tf32: Annotated[str, typer.Option(rich_help_panel=CELLS, help="Backends that get an extra fp32 cell in TF32 (e.g. vllm,hf), to measure TF32 as its own cell.")] = ""
    repeat: Annotated[list[str] | None, typer.Option(rich_help_panel=CELLS, help="Repeat cell backend:dtype:batch_size (or a --cell's NAME:batch_size), to measure the noise floor. Repeatable.")] = None
    cell: Annotated[list[str] | None, typer.Option(rich_help_panel=CELLS, metavar="NAME=BACKEND:DTYPE[:K=V,...]", help="A named cell variant, e.g. vllm-fp8=vllm:bf16:quantization=fp8; keys: the backend's model/engine args, env.VAR=value, model=PATH (same tokenizer), python=NAME, batch_size=N. Repeatable.")] = None
    python: Annotated[list[str] | None, typer.Option(rich_help_panel=CELLS, metavar="NAME=PATH", help="An interpreter for cells with python=NAME (another venv: another vLLM, transformers or lm-eval), checked before any cell starts. Repeatable.")] = None
    hf_args: Annotated[str, typer.Option(rich_help_panel=CELLS, help="Extra lm-eval hf model args for every hf cell, k=v,k=v.")] = ""
    vllm_args: Annotated[str, typer.Option(rich_help_panel=CELLS, help="Extra lm-eval vllm model args for every vllm cell, k=v,k=v.")] = ""

    def matrix(self) -> tuple[list[str], list[str]]:
        """(backends, dtypes) of the matrix: as given; else vllm,hf x fp32,bf16,fp16 without --cell, and
        none with it (the run is then the reference and the named cells; ``named_cells`` gives one of the
        two given alone the reference's other)."""
        named = bool(self.cell)
        backends = split_list(self.backends) if self.backends is not None else ([] if named else ["vllm", "hf"])
        dtypes = split_list(self.dtypes) if self.dtypes is not None else ([] if named else ["fp32", "bf16", "fp16"])
        return backends, dtypes


@dataclass(frozen=True)
class AlignmentOptions:
    """What every cell does alike (``spec.Alignment``), so that a difference between them is not drift."""

    max_length: Annotated[int, typer.Option(rich_help_panel=ALIGN, help="Context length on both backends (capped at the model's).")] = 2048
    add_bos_token: Annotated[bool | None, typer.Option("--add-bos-token/--no-add-bos-token", rich_help_panel=ALIGN, help="BOS policy on both backends (default: the tokenizer's).")] = None
    align_softmax: Annotated[bool, typer.Option(rich_help_panel=ALIGN, help="HF log-softmax in fp32, as vLLM does.")] = True
    prefix_caching: Annotated[bool, typer.Option(rich_help_panel=ALIGN, help="vLLM prefix caching (off: it can return stale prompt logprobs).")] = False
    true_fp32: Annotated[bool, typer.Option(rich_help_panel=ALIGN, help="fp32 cells without TF32 (torch, cuDNN, Triton).")] = True
    seed: Annotated[int, typer.Option(rich_help_panel=ALIGN, help="Seed for lm-eval, numpy, torch and few-shot sampling.")] = 1234
    max_gen_toks: Annotated[int | None, typer.Option(rich_help_panel=MODEL, help="Cap on generated tokens, the same on both backends (default: each task's own; 64 for the embedded default run).")] = None
    apply_chat_template: Annotated[bool, typer.Option(rich_help_panel=MODEL, help="Wrap every request in the model's chat template (lm-eval's --apply_chat_template), on every cell alike; refused for a tokenizer without one.")] = False
    system_instruction: Annotated[str | None, typer.Option(rich_help_panel=MODEL, help="A system instruction before every request (lm-eval's --system_instruction), on every cell alike.")] = None
    fewshot_as_multiturn: Annotated[bool | None, typer.Option("--fewshot-as-multiturn/--no-fewshot-as-multiturn", rich_help_panel=MODEL, help="With a chat template: few-shot examples as conversation turns (default: lm-eval's).")] = None

    def alignment(self, max_length: int) -> Alignment:
        """The spec's record of these options, with the context length the model allows."""
        return Alignment(softmax_fp32=self.align_softmax, add_bos_token=self.add_bos_token, max_length=max_length,
                         prefix_caching=self.prefix_caching, seed=self.seed, true_fp32=self.true_fp32,
                         max_gen_toks=self.max_gen_toks, apply_chat_template=self.apply_chat_template,
                         system_instruction=self.system_instruction, fewshot_as_multiturn=self.fewshot_as_multiturn)


@dataclass(frozen=True)
class RunFolder:
    """Where the run goes and what it does with what is there already."""

    out: Annotated[Path | None, typer.Option(rich_help_panel=OUTPUTS, help="Run directory. Default: results/<model>-<timestamp>.")] = None
    force: Annotated[bool, typer.Option(rich_help_panel=OUTPUTS, help="Rerun cells that already finished.")] = False
    drift: Annotated[int, typer.Option(rich_help_panel=OUTPUTS, help="Also localise the drift on this many prompts from the run's tasks (0: off).")] = 0
    single_cell: Annotated[bool, typer.Option(rich_help_panel=OUTPUTS, help="Allow a run of one cell (nothing to compare it with): e.g. to add it to a run directory later.")] = False
    reference_from: Annotated[str | None, typer.Option(rich_help_panel=OUTPUTS, metavar="RUN_DIR[:CELL]", help="Reuse the reference (or CELL) of an earlier run instead of scoring it: verified, and only if the model, tasks, lm-eval and the reference's settings match (else one line naming what differs).")] = None


@dataclass(frozen=True)
class PlacementOptions:
    """Where the cells run: one at a time here, or on Ray, sharded, over several GPUs each."""

    ray: Annotated[str | None, typer.Option(rich_help_panel=PLACE, help="Run the cells as Ray tasks: a cluster ADDRESS, auto (RAY_ADDRESS or a running local cluster) or local (a new instance on this host). Default: Ray on this host when several GPUs are visible, else one cell at a time.")] = None
    shards: Annotated[int, typer.Option(rich_help_panel=PLACE, help="Split every cell's documents over this many replicas (processes, each with its own GPUs), merged into one table.")] = 1
    tensor_parallel: Annotated[int, typer.Option(rich_help_panel=PLACE, help="GPUs per replica: vLLM tensor parallelism; HF splits the layers over them.")] = 1
    cells_per_gpu: Annotated[int | None, typer.Option(rich_help_panel=PLACE, help="Cells that share one GPU at a time (each takes 1/N of its free memory). Default: as many as the memory plan and the CPU cores allow.")] = None
    mps: Annotated[str, typer.Option(rich_help_panel=PLACE, help="Cells that share a GPU run through a CUDA MPS server of the run's own, their kernels side by side instead of taking turns: auto (when cells share a GPU and nvidia-cuda-mps-control is found), on or off.")] = "auto"


@dataclass(frozen=True)
class StagingOptions:
    """How many documents: staged looks that stop when settled, or every one."""

    full: Annotated[bool, typer.Option("--full", rich_help_panel=STAGE, help="Score every document of every task. Default: staged, each task in looks of growing size (--first-look, doubling) in a fixed random order, stopping as soon as all its gating comparisons are settled.")] = False
    first_look: Annotated[int, typer.Option(rich_help_panel=STAGE, help="Documents per task at the first look of a staged run; each later look doubles, while at most half the task, and the last is all of it.")] = config.FIRST_LOOK
    spending: Annotated[str, typer.Option(rich_help_panel=STAGE, help="How a staged run spends α over its looks: obf (O'Brien-Fleming-like: early stops need overwhelming evidence, the last look keeps nearly all of α) or pocock (Pocock-like: earlier stops when the drift is small, more docs when it is near the margin).")] = "obf"


@dataclass(frozen=True)
class Checked:
    """What ``check_arguments`` parsed from the arguments alone."""

    task_list: list[str]
    limit: int | None
    fraction: float | None  # lm-eval's fractional --limit: each task's share, made per-task limits later
    task_limits: tuple[tuple[str, int], ...]
    batch_size: int | str | None  # None: the device's default
    pythons: tuple[tuple[str, str], ...] = ()  # --python NAME=PATH, the paths absolute


# ------------------------------------------------------------------ the verb
@verb
def run(*, what: ModelAndTasks, cells: CellOptions, folder: RunFolder, align: AlignmentOptions, stats: Statistics,
        outputs: Outputs, place: PlacementOptions, staged: StagingOptions) -> None:
    """Run the backend x dtype matrix on lm-eval tasks, then the statistics and the sign-off report."""
    from evalparity.placement import Placement

    timings = RunLog()
    opts = stats.options()
    what, align = embedded_default(what, align)
    args = check_arguments(what, align, cells, folder, place, opts.reference)
    run_dir = folder.out or default_out(what.model)
    outputs.check(run_dir)
    lock = rundir.acquire(run_dir)  # a directory this run created is removed again if it fails before writing
    head = warm = prep = None
    with timestamped_log():  # piped, every line of the run's log starts with the time
        try:
            check_resumed_spec(run_dir)
            # a first run's model preparation (~15-20 s on a fresh GPU machine) starts before everything
            # else of the setup (torch's import and CUDA's start in the device check, Ray, the task check)
            prep = prepare_embedded_model(what.model)
            head = start_ray_early(cells, place)
            timings.step("arguments_and_ray_start")
            dev = resolve_device(cells.device)
            cell_specs = plan_cells(run_dir, dev, cells, args.batch_size, place, folder.single_cell, opts.reference)
            variants.check_interpreter_names(cell_specs, args.pythons)
            timings.step("cells")  # the cells' own checks (a vLLM cell's argument names) included
            probes = probe_interpreters(args.pythons, cell_specs)  # their imports overlap the setup
            # per-machine caches the cells would each fill at once (vLLM's model info), while the setup goes on
            warm = warmup.start({c.backend for c in cell_specs}, dev,
                                Path(what.model).expanduser() if what.model else None)
            timings.step("warmup_start")
            offline = go_offline_without_hub()
            check_local_model(what.model)  # a wrong --model path in one line before the tasks' data is read
            task_list, task_aliases, plan = preflight(args, what)
            timings.step("tasks_and_data")
            model_id, model_path, max_len, fingerprint = identify_model(what.model, align.max_length, prep)
            prep = None  # waited for and reaped: nothing left to stop
            cell_specs = identify_cell_models(cell_specs, (model_path, fingerprint), max_len, run_dir, folder.force)
            check_chat_template(align.apply_chat_template, align.fewshot_as_multiturn, model_path)
            timings.step("model")
            memory_plan = plan_memory(dev, place.ray, model_path, cell_specs, max_len, place.tensor_parallel,
                                      place.cells_per_gpu)
            placement = Placement(ray=place.ray, cells_per_gpu=memory_plan.cells_per_gpu if memory_plan
                                  else place.cells_per_gpu or 1, mps=place.mps)
            timings.step("memory_plan")
            task_limits = args.task_limits if args.fraction is None else \
                fraction_limits(args.fraction, plan.leaves, args.task_limits)  # each task's share, recorded
            staging = plan_staging(staged, task_list, plan, args.limit, task_limits, cell_specs, opts, align.seed)
            check_interpreters(probes.wait(), dict(args.pythons), cell_specs, run_dir, folder.force)
            spec = build_spec(what, align, cells, place, model_id=model_id, fingerprint=fingerprint,
                              task_list=task_list, task_aliases=task_aliases, plan=plan, cell_specs=cell_specs,
                              limit=args.limit, task_limits=task_limits, dev=dev, max_len=max_len,
                              memory_plan=memory_plan, staging=staging, pythons=args.pythons)
            timings.step("staging_and_spec")
            report_documents(spec, plan, args.limit)
            opts = signoff.choose_reference(opts, [c.name for c in cell_specs],
                                            fallback=stats.reference == Statistics.reference)
            check_metric_names(opts, plan.metrics)  # a typo in --margin's metric names, before any model loads
            # --reference-from: the earlier run's reference verified and matched, before any cell starts
            from evalparity.matrix import reference_from  # heavy: pandas, scipy (matrix -> cells -> samples)

            spec, reused = reference_from(folder.reference_from, spec, opts.reference, run_dir)
            sharing = mps.decide(place.mps, dev, shares_a_gpu(spec, placement, reused, run_dir, folder.force),
                                 place.ray not in (None, "local"))
            timings.step("reference_and_checks")
            timings.mark("setup", timings.t0)  # arguments, model, task index, preflight of every task's data
            outcomes = run_cells(spec, run_dir, model_path, folder.force, offline, placement, timings, head, opts,
                                 reused, sharing)

            failed = report_outcomes(run_dir, outcomes)
            check_enough_cells(outcomes, opts, folder.single_cell)
            if folder.drift:
                localise_drift(run_dir, model_path, folder.drift, cell_specs, opts, dev, max_len, timings, place.mps)
            code = finish(run_dir, opts, outputs, timings)
            if head is not None:
                with timings.stage("ray_head_stop"):  # what is left of its stop, begun before the statistics
                    head.close()
            raise typer.Exit(signoff.exit_code(failed, code))
        finally:
            if warm is not None:
                warm.close()
            if prep is not None:  # the run ended before it needed the model: its preparation stops too
                embedded.stop_preparing(prep)
            timings.write()  # <run>/run.json, where this invocation's time went, once it owns a run directory
            if head is not None:
                head.close()  # its log goes into the run, if the run got as far as Ray (safe to call twice)
            lock.release()


# ------------------------------------------------------------------ before the lock: the arguments alone
def embedded_default(what: ModelAndTasks, align: AlignmentOptions) -> tuple[ModelAndTasks, AlignmentOptions]:
    """The options with the embedded default run's own where the user gave none. A first run (no --model,
    no --tasks) should finish in minutes on 2 CPU cores: few docs, zero-shot (the embedded mirror has no
    train split), and generations capped at 64 tokens; each of these is recorded in the spec, so the report
    says so."""
    if what.model is not None or what.tasks is not None:
        return what, align
    what = dataclasses.replace(what, limit=str(EMBEDDED_LIMIT) if what.limit is None else what.limit,
                               num_fewshot=0 if what.num_fewshot is None else what.num_fewshot)
    return what, dataclasses.replace(align, max_gen_toks=64 if align.max_gen_toks is None else align.max_gen_toks)


def check_arguments(what: ModelAndTasks, align: AlignmentOptions, cells: CellOptions, folder: RunFolder,
                    place: PlacementOptions, reference: str = "") -> Checked:
    """Every check that needs nothing but the arguments (and the ``EVALPARITY_*`` switches), in one place and
    before anything is locked or started, so that a typo costs nothing: one line, exit 2. Returns what the
    checks parsed. What needs more (the device, the run directory, the tasks' data) is checked by the step
    that has it."""
    task_list = split_list(what.tasks) if what.tasks is not None else list(embedded.DEFAULT_TASKS)
    if what.tasks is not None and not task_list:
        raise EvalParityError("--tasks is empty: give lm-eval task or group names, e.g. --tasks hellaswag")
    if align.max_gen_toks is not None and align.max_gen_toks < 1:
        raise EvalParityError(f"--max-gen-toks {align.max_gen_toks} must be at least 1")
    limit, fraction = check_limit(what.limit)
    if what.num_fewshot is not None and what.num_fewshot < 0:
        raise EvalParityError(f"--num-fewshot {what.num_fewshot} is negative: give 0 or more")
    if place.tensor_parallel < 1 or (place.cells_per_gpu is not None and place.cells_per_gpu < 1):
        raise EvalParityError("--tensor-parallel and --cells-per-gpu must be at least 1")
    at_least("--max-length", align.max_length, 1, "tokens of context")
    at_least("--drift", folder.drift, 0, "prompts; 0 is off")
    at_least("--shards", place.shards, 1)
    mps.check_choice(place.mps)
    check_seed("--seed", align.seed)
    if folder.reference_from is not None:
        reuse.check_folder(folder.reference_from)
    config.check_environment()
    bs = parse_batch_size(cells.batch_size) if cells.batch_size is not None else None
    named_cells(cells, bs if bs is not None else "auto", place, reference)  # their names, before any start
    return Checked(task_list, limit, fraction, parse_task_limits(what.task_limit or []), bs,
                   variants.parse_pythons(cells.python or []))


def default_out(model: str | None) -> Path:
    """results/<model>-<timestamp>: a new directory per run unless --out names one to resume."""

    label = model_label(model if model is not None else embedded.MODEL_NAME)
    return Path("results") / f"{label}-{time.strftime('%Y%m%d-%H%M%S')}"


# ------------------------------------------------------------------ holding the lock: the setup
def check_resumed_spec(run_dir: Path) -> None:
    """A run directory to resume must have a readable spec at all, before Ray or a model starts; whether it
    is the same spec is checked later, against the one this run builds (``matrix.prepare_run_dir``)."""
    if layout.spec_file(run_dir).exists():
        records.check_spec(layout.spec_file(run_dir))


def start_ray_early(cells: CellOptions, place: PlacementOptions):
    """The run's own Ray instance, if it will likely want one, started now in its own process so that its
    start overlaps the setup (torch's import, the task index, every task's data) instead of following it.
    Without --cells-per-gpu the memory plan decides the packing later; the guess here is that every job may
    share a GPU. A wrong guess costs nothing (``placement.early_ray_head``)."""
    from evalparity.placement import Placement, early_ray_head

    kinds, dtypes = cells.matrix()
    n_jobs = (len(kinds) * len(dtypes) + len(cells.cell or [])) * place.shards + len(cells.repeat or [])
    return early_ray_head(cells.device, place.tensor_parallel,
                          Placement(ray=place.ray, cells_per_gpu=place.cells_per_gpu or n_jobs), n_jobs)


def plan_cells(run_dir: Path, dev: str, cells: CellOptions, bs, place: PlacementOptions, single_cell: bool,
               reference: str = ""):
    """The cells, checked against the device: what it can run (tensor parallelism needs GPUs; vLLM's half
    precision on CPU needs AVX2/AVX-512), the default batch size (8 on CPU, auto on GPU), and at least two
    cells to compare, counting those the run directory holds already (``spec.check_two_cells``). With
    ``--cell`` and no matrix, the reference's cell (``hf-fp32`` by default) is run beside the named ones."""

    bs = bs if bs is not None else (8 if dev == "cpu" else "auto")
    if place.tensor_parallel > 1 and dev == "cpu":
        raise EvalParityError("--tensor-parallel needs GPUs: use --device cuda, or drop it on CPU")
    if place.mps == "on":
        mps.decide("on", dev, True, False)  # only what the device says (the CPU), before the model and the data
    cell_specs = named_cells(cells, bs, place, reference)
    check_dtypes(dev, sorted({c.dtype for c in cell_specs}), sorted({c.backend for c in cell_specs}))
    wide = next((c for c in cell_specs if cell_gpus(c, place.tensor_parallel) > 1), None)
    if wide is not None and dev == "cpu":  # as --tensor-parallel above: GPUs per replica need GPUs
        raise EvalParityError(f"cell {wide.name} asks for {cell_gpus(wide, place.tensor_parallel)} GPUs "
                              "(tensor_parallel_size) but the run is on the CPU: use --device cuda, or drop "
                              "tensor_parallel_size from the cell on CPU")
    for c in cell_specs:  # a backend's own checks of a cell (the server's URL), before the lock's first write
        check = getattr(backends.get(c.backend), "check_cell", None)
        if check is not None:
            check(c)
    others = other_cells(run_dir, cell_specs)
    check_repeats_have_base(cell_specs, others)
    check_two_cells(cell_specs, others, single_cell)
    return cell_specs


def named_cells(cells: CellOptions, bs, place: PlacementOptions, reference: str = ""):
    """The cells the options name, as specs: the matrix (``--backends`` x ``--dtypes``, ``--tf32``,
    ``--repeat``) and the ``--cell`` variants; an unknown backend or dtype, or a malformed cell or repeat, is
    refused here. Arguments alone: ``check_arguments`` calls it before anything starts (the embedded
    model's preparation included), ``plan_cells`` again with the device's batch size."""
    kinds, dtypes = cells.matrix()
    if cells.cell and bool(kinds) != bool(dtypes):  # one of the two given: the other is the reference's
        ref = variants.reference_cell(reference, bs, place.shards)
        if ref is None:
            raise EvalParityError(f"--cell with only one of --backends and --dtypes takes the other from the "
                                  f"reference cell, and the reference ({reference or 'none'}) is not a "
                                  "backend-dtype cell: give both --backends and --dtypes")
        kinds, dtypes = kinds or [ref.backend], dtypes or [ref.dtype]
    repeats = [r for r in cells.repeat or [] if not variants.is_named_repeat(r)]
    named_repeats = [r for r in cells.repeat or [] if variants.is_named_repeat(r)]
    if kinds or dtypes or not cells.cell:
        matrix = build_cells(kinds, dtypes, bs, repeats, split_list(cells.tf32), place.shards)
    else:
        ref = variants.reference_cell(reference, bs, place.shards)
        named = [t.partition("=")[0].strip() for t in cells.cell]
        matrix = (ref,) if ref is not None and reference not in named else ()
    return variants.run_cells(matrix, cells.cell or [], bs, place.shards,
                              {"hf": cells.hf_args, "vllm": cells.vllm_args}, named_repeats)


def other_cells(run_dir: Path, cell_specs) -> list[str]:
    """Cells an existing run directory's spec holds besides ``cell_specs`` (a run may add one cell to them)."""

    if not layout.spec_file(run_dir).exists():
        return []
    old = records.read_spec(run_dir)  # checked (check_resumed_spec has refused an unreadable one already)
    return [c.name for c in old.cells if c.name not in {x.name for x in cell_specs}]


def go_offline_without_hub() -> bool:
    """Whether the hub is unreachable; if so, HF_HUB_OFFLINE and HF_DATASETS_OFFLINE are set for this process
    and its cells, so that every library reads its caches and mirrors at once instead of timing out."""

    offline = not mirrors.hub_reachable()
    if offline:
        os.environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    return offline


def prepare_embedded_model(model: str | None):
    """The embedded model's first preparation, started in the background when the run uses it and it is not
    prepared yet (``embedded.prepare_in_background`` says why); None otherwise."""
    if model is not None:
        return None
    prep = embedded.prepare_in_background()
    if prep is not None:
        log(f"preparing the embedded model {embedded.MODEL_NAME} (once; about 15 s), while the run sets up ...")
    return prep


def identify_model(model: str | None, max_length: int, prep=None):
    """(model id for the report, path both backends load, context length capped at the model's, fingerprint):
    the fingerprint (the files' hashes) is what keeps a run directory to one model's cells. ``prep``: the
    embedded model's background preparation, waited for first (``model_path`` then finds its folder, or
    prepares it here and says why it could not)."""

    if prep is not None:
        prep.wait()
        procs.ended(prep)
    model_id, model_path, max_len = resolve_model(model, max_length)
    return model_id, model_path, max_len, rundir.model_fingerprint(model_path, model_id)


def identify_cell_models(cell_specs, run_model: tuple, max_len: int, run_dir: Path, force: bool):
    """The cells with ``model=``, each checkpoint resolved as the run's model is (``models.resolve_model``: a
    local path made absolute, or a hub id), fingerprinted, checked to tokenize as the run's model
    (``models.check_cell_model``), and its fingerprint kept in the cell (``CellSpec.model_fingerprint``);
    a finished cell whose checkpoint has changed since is refused unless ``force`` reruns it. One line,
    before any cell starts."""
    out = []
    for cell in cell_specs:
        if not cell.model:
            out.append(cell)
            continue
        try:
            source, path, own_max = resolve_model(cell.model, 1 << 30)
        except EvalParityError as err:
            raise EvalParityError(f"cell {cell.name}: {err}", err.exit_code) from None
        fp = rundir.model_fingerprint(path, source)
        check_cell_model(cell.name, cell.model, run_model, (path, fp), own_max, max_len)
        cell = dataclasses.replace(cell, model=source, model_fingerprint=fp)
        check_cell_model_unchanged(run_dir, cell, force)
        out.append(cell)
    return tuple(out)


def check_cell_model_unchanged(run_dir: Path, cell, force: bool) -> None:
    """A finished cell resumed with ``model=`` weights other than those it scored is refused, naming what
    changed (``rundir.fingerprint_change``): its table would otherwise pass for the new checkpoint's."""
    if force or not layout.spec_file(run_dir).exists():
        return
    was = next((c for c in records.read_spec(run_dir).cells if c.name == cell.name), None)
    rec = records.read_cell(layout.cell_dir(run_dir, cell.name))
    if was is None or rec is None or not rec.ok or was.model != cell.model:
        return  # not finished, or another model= altogether (matrix refuses that as other settings)
    change = rundir.fingerprint_change(was.model_fingerprint, cell.model_fingerprint)
    if change:
        raise EvalParityError(f"cell {cell.name} finished with other weights at model={cell.model} ({change}): "
                              "--force to rerun it with these, restore the checkpoint it scored, or use another --out")


def probe_interpreters(pythons: tuple[tuple[str, str], ...], cell_specs):
    """Start asking each ``--python`` interpreter that a cell names whether it can run those cells
    (``cells.InterpreterProbes``); the answers are collected by ``check_interpreters``."""
    from evalparity.cells import InterpreterProbes  # heavy: pandas (cells -> samples); matrix has loaded it

    needs: dict[str, set[str]] = {}
    for cell in cell_specs:
        if cell.python:
            needs.setdefault(cell.python, set()).add(cell.backend)
    return InterpreterProbes(dict(pythons), needs)


def check_interpreters(answers: dict[str, dict], pythons: dict[str, str], cell_specs, run_dir: Path,
                       force: bool) -> None:
    """Each interpreter's answer logged (its Python and the versions that differ from this one's), and a
    finished cell resumed under an interpreter whose software is not what the cell recorded refused in one
    line (the run's own interpreter is held by the spec's identity: ``RunSpec.software``)."""
    from evalparity.cells import versions  # heavy: pandas (cells -> samples); matrix has loaded it

    here = versions()
    for name, answer in answers.items():
        theirs = answer.get("versions") or {}
        differ = ", ".join(f"{k} {v}" for k, v in sorted(theirs.items()) if here.get(k) != v)
        log(f"python {safe(name)}: {safe(answer.get('executable'))} (Python {answer.get('python')}"
            f"{'; ' + safe(differ) if differ else '; the same versions as this one'})", highlight=False)
    if force:
        return
    for cell in cell_specs:
        if not cell.python or cell.python not in answers:
            continue
        rec = records.read_cell(layout.cell_dir(run_dir, cell.name))
        if rec is None or not rec.ok:
            continue
        now = answers[cell.python].get("versions") or {}
        changed = next((k for k in sorted(set(rec.versions) | set(now)) if rec.versions.get(k) != now.get(k)), None)
        if changed:
            raise EvalParityError(f"cell {cell.name} finished with {changed} {rec.versions.get(changed)}, and "
                                  f"--python {cell.python}={pythons[cell.python]} now has {now.get(changed)}: point "
                                  "it at the environment the cell ran in to resume, --force to rerun the cell "
                                  "there, or use another --out")


def check_chat_template(apply: bool, multiturn: bool | None, model_path) -> None:
    """--apply-chat-template needs a tokenizer with a chat template (else every cell would fail in lm-eval),
    and --fewshot-as-multiturn means nothing without it: one line each, before any model loads."""
    if multiturn and not apply:
        raise EvalParityError("--fewshot-as-multiturn turns few-shot examples into chat turns: it needs "
                              "--apply-chat-template too")
    if not apply:
        return
    from transformers import AutoTokenizer  # heavy: transformers; only with --apply-chat-template

    try:
        template = getattr(AutoTokenizer.from_pretrained(str(model_path)), "chat_template", None)
    except Exception as err:  # noqa: BLE001 - its tokenizer cannot even be read: the cells would say the same
        raise EvalParityError(f"--apply-chat-template: the tokenizer of {model_path} cannot be read "
                              f"({type(err).__name__}): check the model folder") from None
    if not template:
        raise EvalParityError(f"--apply-chat-template: the tokenizer of {model_path} has no chat template: drop "
                              "the option, or use the model's instruct version")


def plan_memory(dev: str, ray: str | None, model_path, cell_specs, max_len: int, tensor_parallel: int,
                cells_per_gpu: int | None):
    """The GPU memory plan of the run (``memplan``), printed; None on CPU, and for a Ray cluster named by
    address, whose GPUs this host cannot see (its cells keep the fixed defaults)."""
    if dev == "cpu":
        return None
    if ray not in (None, "local"):
        log("[dim]memory plan: skipped, the cells run on the Ray cluster's GPUs, not this host's[/dim]")
        return None

    plan = memplan.plan([(c.name, c.backend, c.dtype, c.batch_size) for c in cell_specs],
                        memplan.read_shape(model_path), memplan.gpus_here(), cpus=memplan.host_cpus(),
                        max_length=max_len, n_jobs=sum(c.shards for c in cell_specs),
                        tensor_parallel=tensor_parallel, cells_per_gpu=cells_per_gpu,
                        sizes=own_gpus(cell_specs, tensor_parallel))
    for line in plan.lines():
        log(line, highlight=False)
    return plan


def preflight(args: Checked, what: ModelAndTasks):
    """(tasks, the aliases resolved, the preflight plan): every task's name and data checked before any model
    loads, so that a typo or a missing dataset fails in seconds, not after the first cell. The default tasks
    read the embedded mirror, prepared (once) first."""

    if what.tasks is None:
        embedded.dataset_mirror()
    roots = mirrors.mirror_roots(what.datasets_dir)
    log(f"checking {len(args.task_list)} task(s) and their data ...")
    tm = tasks_mod.task_manager(what.include_path or [])
    task_list, task_aliases = tasks_mod.resolve_names(args.task_list, tm)
    for typed, real in task_aliases.items():
        log(f"task {safe(repr(typed))} is lm-eval's group {safe(repr(real))}: running {safe(real)}")
    plan = tasks_mod.preflight(task_list, tm, roots, args.limit, what.num_fewshot)
    unknown_limits = [t for t, _ in args.task_limits if t not in plan.leaves and t not in plan.groups]
    if unknown_limits:
        raise EvalParityError(f"--task-limit names {unknown_limits[0]}, which is not among the run's tasks: use one of "
                              f"{', '.join(sorted(plan.leaves))}")
    return task_list, task_aliases, plan


def build_spec(what: ModelAndTasks, align: AlignmentOptions, cells: CellOptions, place: PlacementOptions, *,
               model_id, fingerprint, task_list, task_aliases, plan, cell_specs, limit, task_limits, dev, max_len,
               memory_plan, staging, pythons=()) -> RunSpec:
    """The run's spec: everything its cells' results depend on, in one record (``spec.json``), which a
    rerun into the same directory must match. The option groups give what was typed; the keywords, what the
    setup found from it (the model, the tasks' names and documents, the cells, the device, the plans)."""
    from evalparity.cells import versions  # heavy: pandas (cells -> samples); loaded by the preflight already

    return RunSpec(
        model=model_id, tasks=tuple(task_list), cells=cell_specs, limit=limit, num_fewshot=what.num_fewshot,
        device=dev, include_paths=tuple(str(Path(p).resolve()) for p in what.include_path or []),
        datasets_dir=str(Path(what.datasets_dir).resolve()) if what.datasets_dir else None,
        alignment=align.alignment(max_len),
        task_limits=task_limits,
        leaf_docs=tuple(sorted(plan.leaves.items())), tensor_parallel=place.tensor_parallel,
        model_fingerprint=fingerprint,
        task_aliases=tuple(task_aliases.items()),
        memory_plan=memory_plan.to_json() if memory_plan else {},
        task_configs=tasks_mod.config_digest(what.include_path or []),
        software=tuple(sorted((k, v) for k, v in versions().items())),
        staging=staging,
        pythons=tuple(pythons),
    )


def plan_staging(staged: StagingOptions, task_list: list[str], plan, limit: int | None, task_limits, cell_specs,
                 opts, seed: int) -> dict | None:
    """The staged design of the run (``staging.make_plan``), printed, as the spec records it; None when every
    doc is scored: ``--full``, or staging does not apply (said why), or no task has more than one look."""
    from evalparity import staging  # numpy, scipy: after the preflight has loaded them

    at_least("--first-look", staged.first_look, 1, "docs")
    if staged.full:
        return None
    off = None
    if len({c.shards for c in cell_specs}) > 1:  # replicas split each round alike only where all have as many
        off = "cells with other numbers of replicas (--repeat …:dpN) score every document"
    elif opts.gate_logprobs:
        off = "--gate-logprobs gates on loglikelihoods, which the staged rule does not cover"
    if off:
        log(f"staged: off ({off}); scoring every document")
        return None
    per_task = dict(RunSpec(model="", tasks=(), cells=(), limit=limit, task_limits=task_limits,
                            leaf_docs=tuple(sorted(plan.leaves.items()))).samples() or {})
    docs = {leaf: len(per_task[leaf]) if leaf in per_task else min(n, limit or n) for leaf, n in plan.leaves.items()}
    units = {task: [(leaf, docs[leaf]) for leaf in leaves]
             for task, leaves in staging.units_of(task_list, plan.leaves, plan.groups).items()}
    design = staging.make_plan(units, seed=seed, first=staged.first_look, spending=staged.spending)
    if design is None:
        return None
    from evalparity.stats.staged import check_multiple

    check_multiple(opts.multiple)  # before any cell: the statistics would refuse it after every cell
    for u in design.units:
        looks = ", ".join(f"{n:,}" for n in u.looks)
        log(f"staged: {safe(u.name)} looks at {looks} docs, stopping when its gating comparisons "
            "settle (--full scores every doc)", highlight=False, soft_wrap=True)
    return design.to_json()


def report_documents(spec, plan, limit: int | None) -> None:
    """The size of the run, before it starts. The document count comes from the same rule the cells use
    (``spec.samples``), so the two cannot disagree."""
    per_task = spec.samples()
    n_docs = sum(len(ids) for ids in per_task.values()) if per_task else \
        sum(min(n, limit or n) for n in plan.leaves.values())
    log(f"tasks: {len(plan.leaves)} leaf task(s), {n_docs:,} documents per cell")


# ------------------------------------------------------------------ the matrix and after
def shares_a_gpu(spec, placement, reused, run_dir: Path, force: bool) -> bool:
    """Whether more than one of the jobs this run still has to run (cells not finished, or their shards; a
    reused reference is none) would hold a GPU at the same time (``matrix.shares_gpus``): what an MPS server
    is for."""
    from evalparity.matrix import shares_gpus
    from evalparity.rundir import units

    pending = [c for c in spec.cells if (reused is None or c.name != reused.target)
               and (force or not units.is_done(run_dir, c.name, identity=spec.identity()))]
    return shares_gpus(spec, placement, sum(c.shards for c in pending))


def start_mps(choice: str, sharing: tuple[bool, str], timings: RunLog):
    """The run's MPS server (``mps``) when ``sharing`` says to start one, else None; ``run.json`` records
    whether the cells used one and why (``mps``), and how long its start took (``mps_start``). A server that
    cannot serve a client stops the run under ``--mps on`` (one line) and is done without under ``auto``."""
    if not sharing[0]:
        timings.facts["mps"] = sharing[1]
        return None
    with timings.stage("mps_start"):
        server, why = mps.serve(choice, sharing)
    timings.facts["mps"] = why
    if server is None:
        log(f"[yellow]MPS: not used, {safe(why.removeprefix('off: '))} (the cells take turns on their GPU; --mps off "
            "skips the try)[/yellow]", soft_wrap=True, highlight=False)
    else:
        log("MPS: the cells that share a GPU run through a server of this run's own (--mps off: without)")
    return server


def run_cells(spec, run_dir: Path, model_path, force: bool, offline: bool, placement, timings: RunLog, head,
              opts=None, reused=None, sharing: tuple[bool, str] = (False, "off")):
    """Every cell not yet done, each in its own process (``matrix``), with progress on the console; the
    outcomes, one per cell, and their summary table. A staged run decides between its rounds with ``opts``;
    ``reused``: the reference taken from an earlier run (``--reference-from``), published, never run;
    ``sharing``: ``mps.decide``'s answer, whether the cells share their GPUs through an MPS server."""
    from evalparity.matrix import run_matrix, scores_table, summary_table  # heavy: pandas (-> cells -> samples)

    server = start_mps(placement.mps, sharing, timings)
    try:
        if server is not None:
            placement = dataclasses.replace(placement, cell_env=tuple(server.env().items()))
        outcomes = run_matrix(spec, run_dir, str(model_path), force=force, offline=offline, console=console,
                              placement=placement, log=timings, ray_head=head, opts=opts, reused=reused)
    finally:
        if server is not None:
            server.close(log_to=run_dir / "mps.log")
    console.print(summary_table(outcomes))
    scores = scores_table(outcomes)
    if scores is not None:
        console.print(scores)
    return outcomes


def report_outcomes(run_dir: Path, outcomes) -> list[str]:
    """The failed cells, printed with every attempt's reason and log (``failures``), and what to do (rerun;
    free the disk when it was full); returned by name."""
    failed = [o.name for o in outcomes if o.status == "failed"]
    if failed:
        log(f"[red]{len(failed)} cell(s) failed: {', '.join(failed)}. Rerun the same command to retry them.[/red]")
        for line in failures.attempt_lines(run_dir, failed, {o.name: o.meta for o in outcomes}):
            log(Text(visible(line)), soft_wrap=True, highlight=False)
        disk_full = [o.name for o in outcomes if o.status == "failed" and failures.disk_is_full(o.meta.get("error"))]
        if disk_full:
            log(f"[red]{', '.join(disk_full)}: the disk holding {safe(run_dir)} is full (or over its quota): "
                "free space there, then rerun the same command[/red]", soft_wrap=True, highlight=False)
    return failed


def check_enough_cells(outcomes, opts, single_cell: bool) -> None:
    """Stop before the statistics when there is nothing to compare (``signoff.enough_cells``): exit 0 for the
    one cell --single-cell asked for, exit 5 when fewer than two cells (or not the reference) finished."""
    ok = [o.name for o in outcomes if o.status != "failed"]
    if single_cell and len(ok) == len(outcomes) == 1:
        log(f"one cell, {ok[0]}, finished: no comparison made (--single-cell)")
        raise typer.Exit(0)
    if not signoff.enough_cells(ok, opts.reference):
        log(f"[red]not enough finished cells to compare (reference {safe(opts.reference)})[/red]")
        raise typer.Exit(EXIT_CELL_FAILED)


def localise_drift(run_dir: Path, model_path, n_prompts: int, cell_specs, opts, dev: str, max_len: int,
                   timings: RunLog, mps_choice: str = "auto") -> None:
    """--drift N: the drift of every main cell against the reference on N prompts of the run's own tasks,
    into RUN_DIR/drift, before the report so that the report shows it; each cell probed as the run
    configured it (``drift.launch_plan``)."""
    from evalparity.drift import (  # heavy: torch; only --drift
        cannot_probe,
        engine_warnings,
        launch_plan,
        prompts_from_run,
        run_drift,
        together_ok,
    )

    run_spec = records.read_spec(run_dir)
    why: dict[str, str] = {}  # hidden states not reachable: over HTTP, or in a vLLM engine's GPU workers
    for c in (c for c in cell_specs if not c.tag):
        has_probe = getattr(backends.get(c.backend), "drift_probes", True)
        reason = "its backend has no drift probe" if not has_probe else cannot_probe(run_spec, c)
        if reason:
            why[c.name] = reason
    probed = [c.name for c in cell_specs if not c.tag and c.name not in why]
    for name, reason in why.items():
        if name != opts.reference:
            log(f"drift: {name} not probed ({reason})")
    if opts.reference in why:
        log(f"drift: skipped, the reference {opts.reference} cannot be probed ({why[opts.reference]})")
        return
    launch = launch_plan(str(model_path), probed, opts.reference, device=dev, max_len=max_len, run_spec=run_spec)
    with timings.stage("drift"), rundir.staged_outputs(run_dir, (DRIFT,)) as stage:  # drift/ published whole
        results = run_drift(
            launch, prompts_from_run(run_dir, n_prompts), layout.drift_dir(stage), reference=opts.reference,
            max_len=max_len, together=together_ok(run_spec, [c for c in launch if c != opts.reference]),
            console=console, shown=layout.drift_dir(run_dir),
            mps_choice="off" if mps_choice == "off" else "auto",  # on: the run's cells; drift where it applies
            reference_too=together_ok(run_spec, list(launch)))
    # the cells' own processes ran under the executor's environment: say where a probe's engine was another
    for line in engine_warnings(run_dir, results):
        log(f"[yellow]warning:[/yellow] {safe(line)}")
