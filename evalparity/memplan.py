"""GPU memory planning and automatic packing: how much of a GPU each cell gets, decided before any loads.

Why: fixed constants fail both ways on real GPUs. ``gpu_memory_utilization=0.3`` left a 13.7 B model's
fp32 weights (51.1 GiB) no room on a 141 GiB H200, while six SmolLM2-135M cells packed on one H200 only
ran once every vLLM cell was given 0.15 and HF a fixed batch size (three vLLM cells at 0.3 plus HF's
automatic batch sizes left one vLLM cell a negative KV cache). Both follow from arithmetic on numbers
known before any model loads: the model's parameter count and shapes (``config.json`` and the safetensors
headers; no weights read), each cell's dtype, the GPUs' total and free memory, the tensor-parallel size and
how many cells share a GPU.

The plan gives every cell an equal share of what is free on a GPU (less a reserve), so that cells that
start at the same time on one GPU cannot take each other's memory. The arithmetic that is a backend's own
is asked of it (``backends.base.Backend``): ``memory_need``, what one cell needs, and ``memory_knobs``, how
its share becomes engine settings (both sides work on ``shapes.ModelShape`` and ``shapes.CellNeed``, a leaf
module, so that the backends need not import the plan that asks them):

- vLLM: ``gpu_memory_utilization`` = share / total memory, because vLLM reads it as the fraction of the
  GPU's TOTAL memory its instance may use (weights, activations, KV cache), and refuses to start when that
  much is not free;
- HF: lm-eval's ``max_batch_size`` (the ceiling of its automatic batch size), so that the batch size that
  lm-eval's probe finds cannot outgrow the share once the other cells have grown into theirs.

Everything here is a pure function of its inputs, so that a fake GPU of any size tests it on a CPU. The
estimates are deliberately simple (named constants below) and on the safe side; a user's own
``--vllm-args gpu_memory_utilization=...`` or ``--hf-args max_batch_size=...`` still wins.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

from evalparity.backends import registry
from evalparity.errors import EvalParityError
from evalparity.shapes import CellNeed, GiB, ModelShape

RESERVE_FRACTION = 0.03         # of each GPU's total memory, left out of every plan (fragmentation, NCCL, others)
RESERVE_MIN = 1 * GiB
MIN_CPUS_PER_CELL = 2           # lm-eval's request building and our recording are CPU-bound, per cell
MAX_TENSOR_PARALLEL = 8         # the most GPUs of one host a refusal suggests splitting over


def read_shape(model_path: str | Path) -> ModelShape:
    """The model's shape from ``config.json`` and its parameter count from the safetensors headers (the
    first 8 bytes give the header's length, the JSON header every tensor's dtype and shape); without
    safetensors, the count is estimated from the config."""
    folder = Path(model_path)
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise EvalParityError(f"cannot read {folder / 'config.json'} to plan GPU memory ({err}): give a model "
                              "folder with its config.json") from None
    cfg = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
    hidden = int(cfg.get("hidden_size") or cfg.get("n_embd") or 0)
    layers = int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or 0)
    heads = int(cfg.get("num_attention_heads") or cfg.get("n_head") or 1)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or (hidden // heads if heads else 0))
    intermediate = int(cfg.get("intermediate_size") or 4 * hidden)
    vocab = int(cfg.get("vocab_size") or 0)
    params = safetensors_params(folder)
    if params is None:  # no safetensors: embeddings, attention and a gated MLP per layer
        attn = hidden * (heads * head_dim) * 2 + hidden * (kv_heads * head_dim) * 2
        tied = bool(cfg.get("tie_word_embeddings", False))
        params = vocab * hidden * (1 if tied else 2) + layers * (attn + 3 * hidden * intermediate)
    return ModelShape(params, layers, hidden, intermediate, vocab, kv_heads, head_dim)


def safetensors_params(folder: Path) -> int | None:
    """Parameters stored in the folder's ``*.safetensors`` files, from their headers; None if there are none."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                total += math.prod(t["shape"])
    return total


@dataclass(frozen=True)
class Gpu:
    """One GPU's memory in bytes, as the driver reports it now."""

    total: int
    free: int


def gpus_here() -> list[Gpu]:
    """Total and free memory of the GPUs this process may use, through NVML, which (unlike
    ``torch.cuda.mem_get_info``) does not create a CUDA context in the run's process, where it would hold
    memory for the whole run."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        try:  # optional, and only on GPU hosts: pynvml, else vLLM's copy of it
            import pynvml
        except ImportError:
            from vllm.third_party import pynvml  # type: ignore[no-redef]  # optional: vllm
        pynvml.nvmlInit()
        try:
            ids = [g.strip() for g in vis.split(",") if g.strip()] if vis is not None else \
                [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
            out = []
            for g in ids:
                h = pynvml.nvmlDeviceGetHandleByUUID(g) if g.startswith(("GPU-", "MIG-")) else \
                    pynvml.nvmlDeviceGetHandleByIndex(int(g))
                info = pynvml.nvmlDeviceGetMemoryInfo(h)
                out.append(Gpu(int(info.total), int(info.free)))
            return out
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML here: ask torch (which does start a context)
        import torch  # heavy: torch

        return [Gpu(*reversed(torch.cuda.mem_get_info(i))) for i in range(torch.cuda.device_count())]


def host_cpus() -> int:
    """CPUs this process may run on (its affinity, which a container or Slurm may narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cell_need(name: str, backend: str, dtype: str, shape: ModelShape, max_length: int,
              tensor_parallel: int = 1) -> CellNeed:
    """Bytes per GPU one cell needs, as its backend estimates them (``Backend.memory_need``)."""
    minimum, comfortable = registry.get(backend).memory_need(shape, dtype, max_length, tensor_parallel)
    return CellNeed(name, backend, dtype, shape.weight_bytes(dtype, tensor_parallel), minimum, comfortable)


@dataclass(frozen=True)
class CellPlan:
    """What one cell gets: recorded in the spec and in its cell.json (``settings.memory_plan``)."""

    budget_gib: float
    weights_gib: float
    need_gib: float                       # its minimum, for comparison with the budget
    # The engine settings the budget becomes (``Backend.memory_knobs``; None where a backend sets none). A
    # backend whose engine takes another knob adds a field here, which its ``model_args`` reads back.
    gpu_memory_utilization: float | None  # vLLM
    max_batch_size: int | None            # HF with batch_size auto
    cpus: int                             # its share of the host's cores
    # HF with batch_size auto: tokens of batch rows the share holds (rows x padded length). lm-eval's probe
    # finds the batch size at the longest request's length, so the row cap is taken there, in the cell
    # (``max_batch_size`` above is the cap at full ``max_length``, where a generation probes). On one H200 a
    # cap at full length gave HellaSwag (at most 153 tokens) 23 rows of a share
    # of which 64 rows used a quarter (5.9 of 22.6 GiB).
    batch_tokens: int | None = None
    # vLLM cells that share a GPU: a fixed KV cache instead of vLLM's profiling. vLLM sizes its KV cache from
    # the device's used memory during its start-up profiling, so the other cells starting beside it count as
    # its own use: on one H200, six SmolLM2 cells packed at 0.16 each left vllm-fp32 "No available memory
    # for the cache blocks" (results/h200-real-models). Set: share - weights - activations - CUDA context.
    kv_cache_memory_bytes: int | None = None
    # GPUs one replica spreads over (``spec.cell_gpus``: the cell's own tensor_parallel_size=, else the run's
    # --tensor-parallel); the budget above is per GPU, and a replica over more than one is never packed.
    gpus: int = 1


@dataclass(frozen=True)
class MemoryPlan:
    cells_per_gpu: int
    gpus: int
    tensor_parallel: int
    gpu_total_gib: float
    gpu_free_gib: float
    host_cpus: int
    why: str
    cells: dict[str, CellPlan]

    def to_json(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """The placement plan in words, for the start of a run."""
        head = (f"placement: {self.cells_per_gpu} cell(s) per GPU on {self.gpus} GPU(s) "
                f"({self.gpu_free_gib:.1f} of {self.gpu_total_gib:.1f} GiB free on the fullest), "
                f"tensor parallel {self.tensor_parallel}, {self.host_cpus} CPU(s): {self.why}")
        rows = []
        for name, c in self.cells.items():
            knob = "batch size as given"
            if c.gpu_memory_utilization is not None:
                knob = f"gpu_memory_utilization={c.gpu_memory_utilization}"
                if c.kv_cache_memory_bytes:
                    knob += f", KV cache {c.kv_cache_memory_bytes / GiB:.1f} GiB fixed (shared GPU)"
            elif c.batch_tokens is not None:
                knob = (f"batches of at most {c.batch_tokens:,} tokens (max_batch_size={c.max_batch_size} at "
                        f"full length)")
            elif c.max_batch_size is not None:
                knob = f"max_batch_size={c.max_batch_size}"
            over = f" over {c.gpus} GPUs" if c.gpus > 1 and c.gpus != self.tensor_parallel else ""
            rows.append(f"  {name}: {c.budget_gib:.1f} GiB per GPU{over} (weights {c.weights_gib:.1f}, needs at least "
                        f"{c.need_gib:.1f}), {knob}, {c.cpus} CPU(s)")
        return [head, *rows]


def usable(gpu: Gpu) -> int:
    """What a plan may hand out on one GPU: its free memory less a reserve."""
    return max(0, gpu.free - max(RESERVE_MIN, int(RESERVE_FRACTION * gpu.total)))


def plan(cells: list[tuple[str, str, str, int | str]], shape: ModelShape, gpus: list[Gpu], *, cpus: int,
         max_length: int, n_jobs: int, tensor_parallel: int = 1, cells_per_gpu: int | None = None,
         sizes: dict[str, int] | None = None) -> MemoryPlan:
    """The memory plan of a matrix. ``cells``: (name, backend, dtype, batch size) per cell; ``n_jobs``: the
    processes to run (cells times shards); ``cells_per_gpu``: the user's, or None to decide here; ``sizes``:
    the GPUs one replica takes, by cell, for the cells that give their own (``tensor_parallel_size=``;
    ``spec.cell_gpus``); every other cell's replica takes ``tensor_parallel``.

    A cell over more than one GPU gets its GPUs whole (``gpu_share``), sized per GPU for its split weights and
    KV cache; the cells of one GPU each may still share one (``cells_per_gpu``). Raises a one-line error when a
    cell cannot fit: it asks more GPUs than there are, its minimum exceeds one GPU's usable memory (the fix is
    more tensor parallelism, or fewer bytes per weight), or the user's ``--cells-per-gpu`` share."""
    if not gpus:
        raise EvalParityError("no GPU visible to plan memory on: use --device cpu, or check CUDA_VISIBLE_DEVICES")
    size = {name: (sizes or {}).get(name, tensor_parallel) for name, *_ in cells}
    check_gpu_count(size, set(sizes or {}), tensor_parallel, len(gpus))
    room = min(usable(g) for g in gpus)
    needs = [cell_need(n, b, d, shape, max_length, size[n]) for n, b, d, _ in cells]
    worst = max(needs, key=lambda x: x.minimum)
    if worst.minimum > room:
        raise EvalParityError(_too_big(worst, shape, gpus, room, max_length, size[worst.name],
                                       own=worst.name in (sizes or {})))
    packable = [n for n in needs if size[n.name] == 1]  # a replica over several GPUs takes them whole
    if cells_per_gpu is None:
        cells_per_gpu, why = packing(packable, room, cpus, n_jobs, len(gpus)) if packable else \
            (1, "tensor-parallel replicas are not packed")
    else:
        why = "--cells-per-gpu as given"
        tightest = max(packable, key=lambda x: x.minimum, default=None)
        if tightest is not None and tightest.minimum > room // cells_per_gpu:
            raise EvalParityError(
                f"--cells-per-gpu {cells_per_gpu} leaves each cell {room / cells_per_gpu / GiB:.1f} GiB, but "
                f"{tightest.name} needs at least {tightest.minimum / GiB:.1f} GiB: lower --cells-per-gpu to "
                f"{max(1, room // tightest.minimum)}, or drop it to let evalparity decide")
    total = min(g.total for g in gpus)
    running = min(n_jobs, cells_per_gpu * len(gpus) // min(size.values()))  # at most, side by side
    per_cell_cpus = max(1, cpus // max(1, running))
    out = {}
    for need, (name, backend, _, batch) in zip(needs, cells):
        shared = cells_per_gpu > 1 and size[name] == 1
        budget = room // cells_per_gpu if size[name] == 1 else room
        knobs = registry.get(backend).memory_knobs(need, budget, total, shape, batch_size=batch,
                                                   max_length=max_length, tensor_parallel=size[name],
                                                   shared=shared)
        out[name] = CellPlan(round(budget / GiB, 2), round(need.weights / GiB, 2), round(need.minimum / GiB, 2),
                             knobs.get("gpu_memory_utilization"), knobs.get("max_batch_size"), per_cell_cpus,
                             knobs.get("batch_tokens"), knobs.get("kv_cache_memory_bytes"), size[name])
    free = min(g.free for g in gpus)
    return MemoryPlan(cells_per_gpu, len(gpus), tensor_parallel, round(total / GiB, 1), round(free / GiB, 1),
                      cpus, why, out)


def check_gpu_count(sizes: dict[str, int], own: set[str], tensor_parallel: int, visible: int) -> None:
    """Every cell's replica fits the GPUs there are (``sizes``: GPUs per replica by cell; ``own``: the cells
    whose size is their own tensor_parallel_size=; ``visible``: the GPUs of this host, or of the Ray cluster's
    largest host): one line naming the widest cell otherwise, and the option that sets its size."""
    name, widest = max(sizes.items(), key=lambda x: x[1], default=("", 0))
    if widest <= visible:
        return
    if name not in own:
        raise EvalParityError(f"--tensor-parallel {tensor_parallel} needs {tensor_parallel} GPUs but "
                              f"{visible} are visible: lower it to {visible} or fewer")
    raise EvalParityError(f"cell {name} needs {widest} GPUs (its tensor_parallel_size={widest}) but {visible} "
                          f"{'is' if visible == 1 else 'are'} visible: run it on a host with {widest} GPUs, or "
                          f"lower its tensor_parallel_size to {max(1, visible)} or fewer")


def gpu_share(gpus: int, cells_per_gpu: int) -> float:
    """GPUs one job of a cell holds (its Ray ``num_gpus``): ``gpus`` whole when its replica spreads over more
    than one (a tensor-parallel engine needs each of them, so it is never packed), else its 1/``cells_per_gpu``
    share of one GPU."""
    return float(gpus) if gpus > 1 else 1.0 / cells_per_gpu


def gpus_to_hold(sizes: list[int], cells_per_gpu: int) -> int:
    """GPUs that hold jobs of these ``sizes`` (GPUs per replica) all at once: each wider one's GPUs, and the
    one-GPU jobs ``cells_per_gpu`` to a GPU."""
    narrow = sum(1 for g in sizes if g <= 1)
    return sum(g for g in sizes if g > 1) + math.ceil(narrow / cells_per_gpu)


def packing(needs: list[CellNeed], room: int, cpus: int, n_jobs: int, slots: int) -> tuple[int, str]:
    """Cells per GPU with no ``--cells-per-gpu``: as many as fit every cell's comfortable need in memory
    and leave each at least ``MIN_CPUS_PER_CELL`` of the host's cores, but no more than it takes to run
    every job at once on the GPUs there are (fewer per GPU means more memory for each). ``needs``: the cells
    of one GPU each (a tensor-parallel replica is never packed); ``slots``: the GPUs."""
    largest = max(n.comfortable for n in needs)
    by_memory = max(1, room // largest)
    by_cpus = max(1, cpus // (MIN_CPUS_PER_CELL * slots))
    by_jobs = max(1, math.ceil(n_jobs / slots))
    n = min(by_memory, by_cpus, by_jobs)
    if n == by_jobs:
        why = f"every one of the {n_jobs} job(s) at once"
    elif n == by_memory:
        why = f"as many as memory holds ({largest / GiB:.1f} GiB per cell to run comfortably)"
    else:
        why = f"as many as the CPU cores allow ({MIN_CPUS_PER_CELL} per cell at least)"
    return n, f"packed automatically: {why}"


def _too_big(need: CellNeed, shape: ModelShape, gpus: list[Gpu], room: int, max_length: int,
             tensor_parallel: int, own: bool = False) -> str:
    """The refusal of a cell that fits no GPU here, with the smallest tensor parallelism that would fit: the
    run's ``--tensor-parallel``, or the cell's own ``tensor_parallel_size=`` when it gave one (``own``)."""
    what = (f"cell {need.name} needs about {need.minimum / GiB:.1f} GiB per GPU ({need.dtype} weights "
            f"{need.weights / GiB:.1f} GiB of a {shape.params / 1e9:.1f} B-parameter model"
            + (f" over {tensor_parallel} GPUs" if tensor_parallel > 1 else "")
            + f") but a GPU here has {room / GiB:.1f} GiB to give")
    drop = f"drop {need.dtype} from --dtypes" if not own else f"drop the cell {need.name}"
    tp = tensor_parallel * 2
    while tp <= MAX_TENSOR_PARALLEL:
        if cell_need(need.name, need.backend, need.dtype, shape, max_length, tp).minimum <= room:
            option = f"--tensor-parallel {tp}" if not own else f"tensor_parallel_size={tp} on the cell"
            if tp <= len(gpus):
                return f"{what}: pass {option}, or {drop}"
            return f"{what}: it needs {option} on a host with {tp} such GPUs ({len(gpus)} visible here), or {drop}"
        tp *= 2
    return f"{what}, even split over {MAX_TENSOR_PARALLEL} GPUs: {drop}"
