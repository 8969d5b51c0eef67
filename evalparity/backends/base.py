"""The ``Backend`` contract: everything the rest of evalparity asks of an inference backend.

Why one contract: a backend's knowledge (its lm-eval arguments, its environment variables, what it needs
installed, which dtypes it can run on this device, how a GPU memory share becomes its engine arguments, how
drift is probed in it) used to be spread over a dozen files as ``if backend == "vllm"`` branches. Now the
rest of the package looks a backend up by name (``registry.get``) and asks it; adding one is one module
that implements this protocol plus one ``registry.register`` line (or a plugin module, see ``registry``).

An implementation may be a module (``backends/hf.py`` and ``backends/vllm.py`` are) or any object with
these members. Members are called in two kinds of process: the run's own (the CLI: spec checks, memory
plan, doctor), which must stay light, so only ``create_lm``, ``drift_probe`` and ``installed`` may import
the engine; and the cell's (``python -m evalparity.cells``), which loads the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: the registry imports this contract, and spec imports the registry
    from evalparity.shapes import CellNeed, ModelShape
    from evalparity.spec import CellSpec, RunSpec


@runtime_checkable
class Backend(Protocol):
    #: The backend's name: the first part of a cell's name (``hf-fp32``) and what ``--backends`` takes.
    name: str
    #: lm-eval's registered model type whose class ``create_lm`` builds on (``lm_eval --model <this>``), so
    #: that ``model_args`` mean what they mean on lm-eval's command line.
    lm_eval_model: str
    #: What to install when ``installed`` says no: shown by ``evalparity doctor``.
    install_hint: str

    # ---- the cell: arguments, environment, the record

    def model_args(self, spec: RunSpec, cell: CellSpec, model_path: str) -> dict:
        """lm-eval's model arguments for this cell, with every confound aligned as ``spec.alignment`` says
        and the cell's share of its GPU (``spec.cell_memory``) applied. Recorded in ``cell.json``."""
        ...

    def environment(self, spec: RunSpec, cell: CellSpec) -> dict[str, str]:
        """Environment variables the cell's process needs set before it imports torch or the engine (they
        are read at import time, so they cannot be set from inside the process)."""
        ...

    def settings(self, spec: RunSpec, cell: CellSpec, args: dict) -> dict:
        """The alignment settings in words, for ``cell.json``: what the report compares across cells so that
        a difference in settings is not mistaken for drift."""
        ...

    def create_lm(self, args: dict) -> Any:
        """An lm-eval LM (a subclass of ``lm_eval_model``'s class) that also keeps the generated token ids,
        as ``generated_ids: dict[prompt text, list[int]]``: the generation comparisons are on ids, since text
        can hide or invent differences (``stats/generations.py``)."""
        ...

    def attention_backend(self, lm: Any) -> str:
        """The attention implementation the loaded LM really uses, read back from it (it may differ from
        what was asked for): recorded with the precision modes, since it changes the numbers."""
        ...

    def loaded_settings(self, lm: Any) -> dict:
        """Further settings read back from the LM, added to the cell's settings record (empty when there
        are none). Asked once the model has loaded and again after the evaluation, so that what the engine
        decided while evaluating (the batch sizes lm-eval's probe found, say) is recorded too."""
        ...

    # ---- what this machine has

    def versions(self) -> dict[str, str]:
        """Versions of the software this backend adds to the common stack (torch, transformers, lm-eval),
        for ``cell.json`` and the report: every cell records every backend's, so that two cells' software
        can be compared. Must not import the engine."""
        ...

    def installed(self) -> tuple[bool, str]:
        """(usable here, its version or why not) for ``evalparity doctor``; may import the engine."""
        ...

    def snags(self) -> list[tuple[str, str]]:
        """(problem, fix) for each known installation snag of this backend present here (doctor). A fix
        that contains "nothing to do" is a note, not a problem."""
        ...

    def unsupported_dtypes(self, device: str, dtypes: list[str]) -> dict[str, str]:
        """dtype -> why this backend cannot run it on ``device`` ("cpu", "cuda", "cuda:N"), for the checks
        before any model loads. Only this backend's own limits: a GPU without bfloat16 is checked for all."""
        ...

    # ---- the GPU memory plan (memplan): pure arithmetic, tested on fake GPUs

    def memory_need(self, shape: ModelShape, dtype: str, max_length: int, tensor_parallel: int) -> tuple[int, int]:
        """(minimum, comfortable) bytes per GPU of one cell: the least it runs with at all, and what lets it
        run well. The plan refuses a matrix whose minimum fits no GPU and packs cells by the comfortable."""
        ...

    def memory_knobs(self, need: CellNeed, budget: int, gpu_total: int, shape: ModelShape, *,
                     batch_size: int | str, max_length: int, tensor_parallel: int, shared: bool) -> dict:
        """How a budget of ``budget`` bytes on a GPU of ``gpu_total`` becomes this backend's engine settings,
        as ``memplan.CellPlan`` fields (``gpu_memory_utilization``, ``max_batch_size``, ``batch_tokens``,
        ``kv_cache_memory_bytes``); ``model_args`` reads them back from the spec. ``shared``: other cells
        run on the same GPU at the same time. Fields not returned are None."""
        ...

    # ---- optional, not part of the protocol: a backend module MAY define
    #   warm_caches(architectures: list[str], device: str) -> list[str] | None
    # a command that fills a per-machine cache its cells would otherwise each fill at once; the run starts it
    # when its setup begins, beside the setup and the cells (``evalparity.warmup``);
    #   check_cell(cell: CellSpec) -> object
    # a cell's own settings checked before any cell starts, raising a one-line EvalParityError (the server
    # backend: its keys and the user's URL; ``cli/run.plan_cells``);
    #   drift_probes: bool = True
    # False where ``drift_probe`` always refuses (hidden states not reachable: a server over HTTP), so that
    # ``run --drift`` leaves such cells out instead of starting them to fail.
    #   cell_tensor_parallel: bool = False
    # True where the cell's own ``tensor_parallel_size=N`` sets the GPUs its replica takes (vllm, server);
    # ``spec.cell_gpus`` reads it, and every place that gives a cell GPUs asks that;
    #   drift_memory_capped: bool = False
    # True where a drift probe's GPU memory is all its process's torch caching allocator, none of it set
    # aside up front (HF): where sides are probed together, drift caps it at the cell's share of the run's
    # memory plan (``drift.worker.cap_gpu_memory``);
    #   model_args_dtype: bool = False
    # True where ``model_args`` always name the dtype the model is loaded in (``dtype``: hf, vllm): a cell's
    # record must then say it, and the dtype the cell claims must be that one (``records.verify_cell``);
    #   cannot_probe(spec, cell) -> str
    # why drift cannot probe this cell ("" where it can: a vLLM engine over several GPUs runs its hooks in
    # worker processes), so that ``drift`` refuses it in one line and ``run --drift`` leaves it out.

    # ---- drift localisation

    def drift_probe(self, lm: Any) -> Any:
        """A drift probe (``backends/probes.py``) over ``lm``, an LM that ``create_lm`` made (so the probe runs
        the model exactly as a cell loads it): ``encode(texts)``, ``n_entries``, ``device``,
        ``forward(prompts, entries, pooling) -> HiddenBatch`` and ``generate(prompts, n)``, computed by this
        backend's own engine. A backend without one raises EvalParityError: it must not be measured with
        another backend's engine."""
        ...
