"""RunSpec and CellSpec: what to run, validated before any model loads.

A run is a matrix of cells, one per (backend, dtype[, repeat tag]). Everything that must be identical
across cells (tasks, limit, few-shot, seeds, alignment settings) lives on the RunSpec; only the backend,
dtype and batch size vary per cell. The spec is written to ``spec.json`` in the run directory, and a rerun
into the same directory must present the same spec (else it would mix two experiments).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from evalparity.backends import registry
from evalparity.errors import EvalParityError

DTYPE_ALIASES = {
    "fp32": "float32", "float32": "float32", "float": "float32",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16",
}
SHORT_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
# A cell's own engine argument that spreads its replica over several GPUs (vLLM's name; ``cell_gpus``)
TENSOR_PARALLEL_ARG = "tensor_parallel_size"


def parse_dtype(name: str) -> str:
    """'bf16' -> 'bfloat16'; raises a one-line error naming the accepted spellings."""
    key = name.strip().lower()
    if key not in DTYPE_ALIASES:
        raise EvalParityError(f"unknown dtype {name!r}: use fp32/float32, bf16/bfloat16 or fp16/float16")
    return DTYPE_ALIASES[key]


def dtype_of(value) -> str | None:
    """A dtype as a model's arguments record it (``bfloat16``, ``torch.float16``, ``fp32``...) as a spec dtype
    (``float32``, ``bfloat16``, ``float16``); None for a spelling that is none of those."""
    return DTYPE_ALIASES.get(str(value).replace("torch.", "").lower())


def parse_backend(name: str) -> str:
    """'HF' -> 'hf'; an unknown backend is a one-line error that lists the known ones (``backends.registry``)."""
    return registry.check_name(name)


def split_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


@dataclass(frozen=True)
class Alignment:
    """Settings that would otherwise differ between backends and pass for drift. Each one is recorded in
    the cell metadata; each one can be overridden from the CLI (``--no-align-softmax`` etc.)."""

    softmax_fp32: bool = True          # HF computes log_softmax in the model dtype unless told; vLLM uses fp32
    add_bos_token: bool | None = None  # None: the tokenizer's own default, applied identically on both sides
    max_length: int = 2048             # same context window on both backends
    prefix_caching: bool = False       # vLLM prefix caching can return stale prompt logprobs
    seed: int = 1234
    true_fp32: bool = True             # no TF32 in fp32 cells (torch matmul, cuDNN, Triton)
    max_gen_toks: int | None = None   # None: each task's own; else a cap passed to lm-eval's gen_kwargs
    # Chat templating, lm-eval's own (a known source of HF-vs-vLLM disagreement when it differs): the
    # tokenizer's chat template on every request, a system instruction, few-shot examples as turns (None:
    # lm-eval's default); the same on every cell.
    apply_chat_template: bool = False
    system_instruction: str | None = None
    fewshot_as_multiturn: bool | None = None


@dataclass(frozen=True)
class CellSpec:
    backend: str
    dtype: str
    batch_size: int | str  # a number, or "auto" (each backend picks what fits: lm-eval's auto batch size)
    tag: str = ""
    tf32: bool = False     # an fp32 cell that runs in TF32, to measure that precision mode as its own cell
    shards: int = 1        # the cell's documents split over this many replicas (processes), merged afterwards
    # A named variant (``--cell NAME=BACKEND:DTYPE[:key=value,...]``) and what makes it one. Each setting is
    # part of the cell's identity: recorded in its cell.json, checked against the spec when a run resumes
    # or is verified, and shown wherever its verdict is (``variant_difference``).
    label: str = ""                          # the cell's own name; "" names it backend-dtype[-tag]
    args: tuple[tuple[str, str], ...] = ()   # the backend's model/engine arguments, as typed (lm-eval k=v)
    env: tuple[tuple[str, str], ...] = ()    # environment variables of the cell's process (env.VAR=value)
    model: str = ""                          # another checkpoint of the run's model (same tokenizer), if any
    python: str = ""                         # the interpreter (a ``--python NAME``) the cell's process runs on
    # ``model``'s fingerprint (``rundir.model_fingerprint``), taken before any cell starts. The cell's, not the
    # run's: RunSpec.identity leaves the cells out so that a run folder may gain cells, and a checkpoint that
    # one cell scores must not change what every other cell was made under. It is part of the cell's variant
    # (``model_digest``), so a record made with other weights at that path is refused (``records.verify_cell``,
    # and before a resume starts: ``cli.run.check_cell_models``).
    model_fingerprint: dict | None = None

    @property
    def name(self) -> str:
        return f"{self.base_name}-{self.tag}" if self.tag else self.base_name

    def arg_text(self) -> str:
        """The cell's backend arguments as lm-eval's ``k=v,k=v`` (``backends.parse_extra_args`` reads it)."""
        return ",".join(f"{k}={v}" for k, v in self.args)

    def variant(self) -> dict:
        """What makes this cell a variant, as its cell.json records it and the report shows it: the
        backend arguments, environment, model and interpreter it was given (empty ones left out)."""
        out: dict = {}
        if self.args:
            out["args"] = dict(self.args)
        if self.env:
            out["env"] = dict(self.env)
        if self.model:
            out["model"] = self.model
        if self.model_fingerprint:
            out["model_digest"] = self.model_fingerprint.get("digest")
        if self.python:
            out["python"] = self.python
        return out

    @property
    def base_name(self) -> str:
        """The cell this one repeats (itself when it is not a repeat: a named variant is its own)."""
        return self.label or f"{self.backend}-{SHORT_DTYPE[self.dtype]}"


@dataclass(frozen=True)
class RunSpec:
    model: str
    tasks: tuple[str, ...]
    cells: tuple[CellSpec, ...]
    limit: int | None = None
    num_fewshot: int | None = None
    device: str = "cpu"
    include_paths: tuple[str, ...] = ()
    datasets_dir: str | None = None
    alignment: Alignment = field(default_factory=Alignment)
    task_limits: tuple[tuple[str, int], ...] = ()  # per-task document limits, overriding ``limit``
    leaf_docs: tuple[tuple[str, int], ...] = ()    # documents in each leaf task, from the preflight
    tensor_parallel: int = 1                         # GPUs per replica (vLLM tensor parallel; HF parallelize)
    # the model's resolved source and its files' hashes (rundir.model_fingerprint): part of the identity, so
    # that new weights at the same path, or a relative path from another folder, never reuse old cells
    model_fingerprint: dict | None = None
    task_aliases: tuple[tuple[str, str], ...] = ()   # names as typed -> lm-eval's (``ceval`` -> ``ceval-valid``)
    # What else the results depend on that a resumed run could change underneath: the contents of the task
    # configurations it reads (``tasks.config_digest``: the YAMLs of --include-path and task_configs/) and the
    # software that evaluates them (lm-eval's and every backend's versions). Part of the identity, so that a
    # resume after a YAML edit or an upgrade is refused instead of mixing old cells with new ones.
    task_configs: str | None = None
    software: tuple[tuple[str, str], ...] = ()
    # A staged run's plan (``staging.StagingPlan.to_json``: the docs' order seed, the looks of every task, the
    # α-spending function); None when every doc is scored (``--full``, or no task has more than one look).
    # Part of the identity: another order or other looks is another experiment.
    staging: dict | None = None
    # GPU memory plan (``memplan.MemoryPlan.to_json``; empty on CPU): what each cell gets of its GPU. Not
    # part of the identity: it follows the GPUs' free memory at the start, which a resumed run sees anew.
    memory_plan: dict = field(default_factory=dict, compare=False, hash=False)
    # The interpreters named with ``--python NAME=PATH`` (path absolute, symlinks kept: a venv's bin/python is
    # a link to its base interpreter, and resolving it would leave the venv). Not part of the identity: a run
    # folder may gain a cell with an interpreter of its own without refusing every finished one, and a path
    # says nothing of what runs there. What a cell's results depend on is the software its process imports,
    # and that is the cell's: its cell.json records the versions and interpreter it ran with, and a resume
    # against an interpreter whose versions changed is refused (``cli.run.check_interpreters``).
    pythons: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)

    def to_json(self) -> dict:
        d = asdict(self)
        d["cells"] = [asdict(c) | {"name": c.name, "args": [list(x) for x in c.args], "env": [list(x) for x in c.env]}
                      for c in self.cells]
        d["task_limits"] = [list(x) for x in self.task_limits]
        d["leaf_docs"] = [list(x) for x in self.leaf_docs]
        d["task_aliases"] = [list(x) for x in self.task_aliases]
        d["software"] = [list(x) for x in self.software]
        d["pythons"] = [list(x) for x in self.pythons]
        return d

    @property
    def model_digest(self) -> str | None:
        """The digest of the model's fingerprint (``model_fingerprint``), as every cell records it; None for a
        model that has none (a hub id resolved nowhere, a synthetic spec)."""
        return (self.model_fingerprint or {}).get("digest")

    def identity(self) -> str:
        """A hash of what the results depend on: the same identity means the same experiment. The cells
        are left out so that a rerun may add cells to a run directory; the repeat cells' settings are
        in their own cell.json."""
        d = self.to_json()
        d.pop("cells")
        d.pop("task_aliases")  # how the tasks were typed does not change the experiment
        d.pop("memory_plan")
        d.pop("pythons")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, d: dict) -> RunSpec:
        cells = tuple(cell_from_json(c) for c in d["cells"])
        return cls(
            model=d["model"], tasks=tuple(d["tasks"]), cells=cells, limit=d.get("limit"),
            num_fewshot=d.get("num_fewshot"), device=d.get("device", "cpu"),
            include_paths=tuple(d.get("include_paths", ())), datasets_dir=d.get("datasets_dir"),
            alignment=Alignment(**d.get("alignment", {})),
            task_limits=tuple((k, int(v)) for k, v in d.get("task_limits", ())),
            leaf_docs=tuple((k, int(v)) for k, v in d.get("leaf_docs", ())),
            tensor_parallel=int(d.get("tensor_parallel", 1)),
            model_fingerprint=d.get("model_fingerprint"),
            task_aliases=tuple((k, v) for k, v in d.get("task_aliases", ())),
            task_configs=d.get("task_configs"),
            software=tuple((str(k), str(v)) for k, v in d.get("software", ())),
            staging=d.get("staging"),
            memory_plan=d.get("memory_plan") or {},
            pythons=tuple((str(k), str(v)) for k, v in d.get("pythons", ())),
        )

    def interpreter(self, cell: CellSpec) -> str:
        """The path of the interpreter ``cell`` runs under (its ``python=NAME`` in ``pythons``), or "" for the
        one running evalparity; a name the spec does not map is a one-line error."""
        if not cell.python:
            return ""
        found = dict(self.pythons).get(cell.python)
        if found is None:
            raise EvalParityError(f"cell {cell.name} runs under python={cell.python}, which no --python names: add "
                                  f"--python {cell.python}=/path/to/python")
        return found

    def cell_gpus(self, cell: CellSpec) -> int:
        """GPUs one replica of ``cell`` takes (``cell_gpus``, with this run's ``--tensor-parallel``)."""
        return cell_gpus(cell, self.tensor_parallel)

    def cell_memory(self, cell: str) -> dict:
        """The memory plan's entry for one cell (``memplan.CellPlan`` as a dict); empty without a plan."""
        return dict(self.memory_plan.get("cells", {}).get(cell, {}))

    def samples(self) -> dict[str, list[int]] | None:
        """lm-eval's ``samples`` (doc indices per leaf task) when per-task limits are set, else None and
        ``limit`` applies. A task in ``task_limits`` gets its own limit; its group's members share it."""
        if not self.task_limits:
            return None
        per = dict(self.task_limits)
        out = {}
        for leaf, n in self.leaf_docs:
            lim = per.get(leaf, next((v for k, v in per.items() if leaf.startswith(k + "_")), self.limit))
            out[leaf] = list(range(min(n, lim) if lim else n))
        return out

    def shard_samples(self, shard: int, shards: int) -> dict[str, list[int]]:
        """lm-eval's ``samples`` for one shard: every ``shards``-th document of each leaf task, starting at
        ``shard``. Interleaving (rather than blocks) gives every shard a like mix of long and short documents;
        the shards together hold exactly the documents of the unsharded cell."""
        per = self.samples()
        if per is None:
            per = {leaf: list(range(min(n, self.limit) if self.limit else n)) for leaf, n in self.leaf_docs}
        return {leaf: ids[shard::shards] for leaf, ids in per.items()}


def cell_gpus(cell: CellSpec, tensor_parallel: int) -> int:
    """GPUs one replica of ``cell`` takes: its own ``tensor_parallel_size=`` where its backend spreads a
    replica by that argument (``cell_tensor_parallel``: vllm, and a server evalparity starts), else the run's
    ``--tensor-parallel`` (every other cell: an hf cell splits its layers over that many GPUs).

    The one answer to "how many GPUs does this cell's engine need", asked by the memory plan, the jobs' GPU
    requests (Ray's ``num_gpus``, the local executor's ``CUDA_VISIBLE_DEVICES``), the checks before any cell
    starts, the engine arguments and ``--reference-from``: a cell given GPUs by one rule and an engine sized by
    another would see fewer GPUs than it needs (vLLM: "World size (2) is larger than the number of available
    GPUs (1)")."""
    given = _own_size(cell)
    return tensor_parallel if given is None else parse_gpus(given, f"cell {cell.name}")


def takes_own_gpus(backend: str) -> bool:
    """Whether a cell of ``backend`` spreads its replica by its own ``tensor_parallel_size=`` (the backend's
    ``cell_tensor_parallel``: vllm, and a server evalparity starts)."""
    return getattr(registry.get(backend), "cell_tensor_parallel", False)


def _own_size(cell: CellSpec) -> str | None:
    """The cell's own ``tensor_parallel_size=`` as typed, where its backend takes it; else None."""
    given = dict(cell.args).get(TENSOR_PARALLEL_ARG)
    return given if given is not None and takes_own_gpus(cell.backend) else None


def own_gpus(cells, tensor_parallel: int) -> dict[str, int]:
    """The cells whose own ``tensor_parallel_size=`` sets their GPUs (``cell_gpus``), by name, with those GPUs:
    what a refusal of too few GPUs names as the fix, rather than ``--tensor-parallel``."""
    return {c.name: cell_gpus(c, tensor_parallel) for c in cells if _own_size(c) is not None}


def parse_gpus(value: str, where: str) -> int:
    """A ``tensor_parallel_size=`` value as a whole number of GPUs (1 or more); one line otherwise."""
    text = str(value).strip()
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        raise EvalParityError(f"{where}: {TENSOR_PARALLEL_ARG}={value} is not a whole number of GPUs: give 1 or "
                              f"more, e.g. {TENSOR_PARALLEL_ARG}=2")
    return int(text)


def cell_from_json(c: dict) -> CellSpec:
    """A cell as spec.json holds it (``RunSpec.to_json``)."""
    return CellSpec(c["backend"], c["dtype"], c["batch_size"], c.get("tag", ""), c.get("tf32", False),
                    c.get("shards", 1), label=c.get("label", ""),
                    args=tuple((str(k), str(v)) for k, v in c.get("args", ())),
                    env=tuple((str(k), str(v)) for k, v in c.get("env", ())),
                    model=c.get("model", ""), python=c.get("python", ""),
                    model_fingerprint=c.get("model_fingerprint"))


def parse_batch_size(text: str) -> int | str:
    t = str(text).strip().lower()
    if t == "auto":
        return "auto"
    if not t.isdigit() or int(t) < 1:
        raise EvalParityError(f"--batch-size {text} must be a positive number or auto")
    return int(t)


def parse_task_limits(items: list[str]) -> tuple[tuple[str, int], ...]:
    out = []
    for it in items:
        name, _, n = it.partition("=")
        if not name or not n.isdigit() or int(n) < 1:
            raise EvalParityError(f"bad --task-limit {it!r}: write TASK=N with N >= 1, e.g. gsm8k=300")
        out.append((name.strip(), int(n)))
    return tuple(out)


def build_cells(backends: list[str], dtypes: list[str], batch_size: int | str,
                repeats: list[str], tf32: list[str] = (), shards: int = 1) -> tuple[CellSpec, ...]:
    """The matrix backends x dtypes, plus repeat cells given as 'backend:dtype:batch_size' or
    'backend:dtype:dpN'.

    A repeat is the same backend and dtype at another batch size, or split over N shards: comparing it with
    its base cell measures the noise floor that batch composition (or sharding) adds on its own.
    """
    if not backends:
        raise EvalParityError("no backends given: pass --backends vllm,hf (or one of them)")
    if not dtypes:
        raise EvalParityError("no dtypes given: pass --dtypes fp32,bf16,fp16 (or some of them)")
    if shards < 1:
        raise EvalParityError(f"--shards {shards} must be at least 1")
    cells = [CellSpec(parse_backend(b), parse_dtype(d), batch_size, shards=shards) for b in backends for d in dtypes]
    for r in repeats:
        parts = r.split(":")
        dp = len(parts) == 3 and parts[2].lower().startswith("dp") and parts[2][2:].isdigit()
        if len(parts) != 3 or not (parts[2].isdigit() or dp) or int(parts[2].lower().removeprefix("dp")) < 1:
            raise EvalParityError(f"bad --repeat {r!r}: write backend:dtype:batch_size or backend:dtype:dpN, "
                                  "e.g. hf:fp32:4 or vllm:fp32:dp2")
        b, d = parse_backend(parts[0]), parse_dtype(parts[1])
        if dp:
            n = int(parts[2][2:])
            if n == shards:
                raise EvalParityError(f"--repeat {r!r} uses the main cells' {shards} shard(s): a sharding repeat "
                                      "needs another shard count")
            cells.append(CellSpec(b, d, batch_size, tag=f"dp{n}", shards=n))
            continue
        bs = int(parts[2])
        if bs == batch_size:
            raise EvalParityError(f"--repeat {r!r} uses the main batch size {batch_size}: a repeat needs "
                                  "another batch size to measure the noise floor")
        cells.append(CellSpec(b, d, bs, tag=f"bs{bs}", shards=shards))
    for b in tf32:
        cells.append(CellSpec(parse_backend(b), "float32", batch_size, tag="tf32", tf32=True, shards=shards))
    names = [c.name for c in cells]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise EvalParityError(f"cell {sorted(dup)[0]} is listed twice: drop the duplicate backend or dtype")
    return tuple(cells)


REPEAT_TAG = re.compile(r"(bs|dp)([1-9][0-9]*)")  # a noise-floor repeat's tag: another batch size, or shards
TAGGED_NAME = re.compile(r"-(?:(?:bs|dp)[1-9][0-9]*|tf32)$")  # how a repeat's or a TF32 cell's name ends


def named_like_a_tagged_cell(name: str) -> bool:
    """Whether ``name`` ends as evalparity names a repeat or a TF32 cell (``-bs4``, ``-dp2``, ``-tf32``):
    names kept for those, so that no cell of a run can be re-declared one by editing its tag and label alone
    (``tagged_cell_problem``)."""
    return TAGGED_NAME.search(name) is not None


def tagged_cell_problem(cells: Sequence[CellSpec], others: Collection[str] = ()) -> tuple[CellSpec, str] | None:
    """The first cell that is tagged but not as evalparity makes a tagged cell, or named like one but not
    tagged, and why; None when there is none.

    A tag takes a cell out of the gating comparisons: a noise-floor repeat (``bs<N>``: its base at batch
    size N; ``dp<N>``: over N shards) is paired with its base only, a TF32 cell (``tf32``) with its base and
    the reference as a precision mode. Evalparity makes them from their base (``build_cells``,
    ``variants.repeat_of``): the base's backend, dtype and variant (arguments, environment, model,
    interpreter), the tag's batch size or shard count; and their names (``…-bs4``) are kept for them
    (``named_like_a_tagged_cell``). A spec read back (``records``) is held to the same, so that editing a
    cell's tag and label (the cells are not in the spec's identity, so that a run folder may gain cells) can
    neither take a cell out of the gating comparisons nor put one in. ``others``: names of the cells a run
    directory holds already (their entries are checked when that spec is read); a repeat of one of them is
    checked against it there."""
    bases = {c.name: c for c in cells if not c.tag}
    for c in cells:
        if (c.tf32 or c.tag == "tf32") and not (c.tf32 and c.tag == "tf32" and c.dtype == "float32"):
            return c, "is a TF32 cell only in part (a TF32 cell is fp32, tagged tf32 and marked tf32)"
        if not c.tag:
            if named_like_a_tagged_cell(c.name):
                return c, "is named like a repeat or a TF32 cell (-bs<N>, -dp<N>, -tf32) but is not one"
            continue
        if not c.tf32:
            m = REPEAT_TAG.fullmatch(c.tag)
            if m is None:
                return c, f"is tagged {c.tag!r}, which no repeat is (bs<N>, dp<N> or tf32)"
            if int(m.group(2)) != (c.batch_size if m.group(1) == "bs" else c.shards):
                what = "batch size" if m.group(1) == "bs" else "shard count"
                return c, f"is tagged {c.tag} but has {what} {c.batch_size if m.group(1) == 'bs' else c.shards}"
            if c.base_name in others:
                continue
        base = bases.get(c.base_name)
        if base is None:
            if c.tf32:
                continue  # a TF32 cell without its true-fp32 base is compared with the reference only
            return c, f"is a repeat of {c.base_name}, which is not a cell of this run with its backend and dtype"
        if (base.backend, base.dtype) != (c.backend, c.dtype):
            return c, f"is a repeat of {c.base_name}, which is not a cell of this run with its backend and dtype"
        if base.variant() != c.variant():
            return c, f"is a repeat of {c.base_name} with other settings (a repeat has its base's variant)"
    return None


def check_repeats_have_base(cells: tuple[CellSpec, ...], others: list[str]) -> None:
    """``tagged_cell_problem`` as the plan's one-line refusal, before anything starts: its GPU time would buy
    nothing."""
    found = tagged_cell_problem(cells, others)
    if found is not None:
        lone, why = found
        raise EvalParityError(f"--repeat makes {lone.name}, which {why}: add {lone.base_name} (its backend, dtype "
                              "and settings) to the run, or drop the repeat")


def check_two_cells(cells: tuple[CellSpec, ...], others: list[str], single_cell: bool) -> None:
    """A run compares cells: with ``others`` (the cells its run folder holds already) it needs two, unless
    ``single_cell`` asks for one alone (to add it to a run folder later). One line, before anything starts."""
    if len(cells) + len(others) < 2 and not single_cell:
        raise EvalParityError(f"this run has a single cell ({cells[0].name}): there is nothing to compare it "
                              "with; add a backend or dtype (e.g. --dtypes fp32,bf16), or pass --single-cell "
                              "to run it alone")


def check_limit(limit: int | str | None) -> tuple[int | None, float | None]:
    """``--limit`` as (documents per task, None) or, as lm-eval reads a number below 1, (None, the fraction of
    each task's documents); a one-line error for anything else."""
    if limit is None:
        return None, None
    text = str(limit).strip()
    try:
        value = float(text)
    except ValueError:
        raise EvalParityError(f"--limit {text!r} is not a number: give documents per task (e.g. 100) or a "
                              "fraction of each task below 1 (e.g. 0.1)") from None
    if not value > 0 or value != value or value == float("inf"):
        raise EvalParityError(f"--limit {text} would evaluate no documents: give a positive number or omit it")
    if value < 1:
        return None, value
    if value != int(value):
        raise EvalParityError(f"--limit {text} is neither a whole number of documents nor a fraction below 1: "
                              f"give {int(value)} or {int(value) + 1}")
    return int(value), None


def fraction_limits(fraction: float, leaves: dict[str, int],
                    task_limits: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """``--limit F`` (0 < F < 1) as per-task limits: ⌈F·N⌉ of each leaf task's N docs (at least one), as
    lm-eval's fractional limit takes them; a ``--task-limit`` given for a task keeps its own."""
    import math

    given = dict(task_limits)
    out = dict(task_limits)
    for leaf, n in sorted(leaves.items()):
        if leaf not in given and not any(leaf.startswith(k + "_") for k in given):
            out[leaf] = max(1, math.ceil(fraction * n))
    return tuple(sorted(out.items()))


def model_label(model: str) -> str:
    """A short, path-safe name for default run directories."""
    return Path(model.rstrip("/")).name.replace("/", "__") or "model"
