"""Hugging Face transformers through lm-eval's ``hf`` model type: the ``hf`` backend (``base.Backend``)."""

from __future__ import annotations

from evalparity.backends import parse_extra_args, precision
from evalparity.backends.hf_scoring import DeferredScoring
from evalparity.backends.pretokenize import BatchedEncoding
from evalparity.shapes import CUDA_CONTEXT, DTYPE_BYTES, CellNeed, ModelShape
from evalparity.spec import CellSpec, RunSpec

name = "hf"
lm_eval_model = "hf"
install_hint = "pip install -e . (lm-eval and transformers are evalparity's own dependencies)"
drift_memory_capped = True  # base.Backend's optional member: its drift probe holds only torch-allocated memory
model_args_dtype = True  # base.Backend's optional member: model_args name the dtype it loads the model in
TARGET_ROWS = 8         # batch rows at full length that a comfortable HF share holds (memplan)
LM_EVAL_MAX_BATCH = 64  # lm-eval HFLM's own default ceiling for batch_size=auto


def model_args(spec: RunSpec, cell: CellSpec, model_path: str) -> dict:
    a = spec.alignment
    args: dict = {
        "pretrained": model_path,
        "dtype": cell.dtype,
        "device": spec.device,
        "batch_size": cell.batch_size,
        "max_length": a.max_length,
    }
    if a.softmax_fp32:
        # lm-eval's HF backend computes log_softmax in the model dtype unless told; vLLM uses fp32.
        args["softmax_dtype"] = "float32"
    if a.add_bos_token is not None:
        args["add_bos_token"] = a.add_bos_token
    plan = spec.cell_memory(cell.name)
    if cell.batch_size == "auto" and plan.get("batch_tokens"):
        # the ceiling of lm-eval's batch-size probe, so that the batch it finds stays within the cell's
        # share of a GPU that other cells fill later (memplan): rows x the probed length, taken in the cell
        args["batch_tokens"] = plan["batch_tokens"]
    elif cell.batch_size == "auto" and plan.get("max_batch_size"):  # a spec planned before batch_tokens
        args["max_batch_size"] = plan["max_batch_size"]
    if spec.tensor_parallel > 1:
        # HF has no tensor parallelism in lm-eval; it splits the layers over the cell's GPUs instead.
        args["parallelize"] = True
        args.pop("device")
    user = parse_extra_args(cell.arg_text())
    if "max_batch_size" in user or "batch_size" in user:  # the user's batch ceiling wins over the plan's
        args.pop("batch_tokens", None)
    args.update(user)
    return args


def environment(spec: RunSpec, cell: CellSpec) -> dict[str, str]:
    return precision.environment(cell.dtype, spec.alignment.true_fp32 and not cell.tf32)


def settings(spec: RunSpec, cell: CellSpec, args: dict) -> dict:
    return {
        "log_softmax_dtype": args.get("softmax_dtype", cell.dtype),
        "add_bos_token": args.get("add_bos_token", "tokenizer default"),
        "max_length": args.get("max_length"),
        "batch_size": args.get("batch_size"),
        "max_gen_toks": spec.alignment.max_gen_toks or "the task's own (lm-eval default 256)",
        "generation": "greedy (temperature 0, do_sample False) unless the task sets otherwise",
        "prefix_caching": "n/a",
        "parallelize": args.get("parallelize", False),
        "max_batch_size": args.get("max_batch_size",
                                   f"lm-eval default ({LM_EVAL_MAX_BATCH})" if cell.batch_size == "auto" else None),
        "batch_tokens": args.get("batch_tokens"),
        "memory_plan": spec.cell_memory(cell.name) or None,
    }


def create_lm(args: dict):
    """An HFLM that also keeps the generated token ids, keyed by the prompt text."""
    from lm_eval.api.registry import get_model  # heavy: lm_eval, transformers, torch

    class RecordingHFLM(DeferredScoring, BatchedEncoding, get_model(lm_eval_model)):
        def __init__(self, batch_tokens: int | None = None, **kw):
            super().__init__(**kw)
            self.generated_ids: dict[str, list[int]] = {}
            self._batch_contexts: list[str] = []
            self.batch_tokens = batch_tokens
            self.batch_probes: list[dict] = []

        def _detect_batch_size(self, requests=None, pos: int = 0):
            """lm-eval's probe, its ceiling lowered to the rows of this probe's length that the cell's
            memory share holds (``batch_tokens``), so that short requests get the batch they fit."""
            if not self.batch_tokens:
                return super()._detect_batch_size(requests, pos)
            # the length lm-eval's probe uses; full length for schedules of several probes (auto:N), whose
            # later probes run at a shorter length than the part-filled batch they size is padded to
            if requests and self.backend == "causal" and self.batch_schedule == 1:
                _, ctx, cont = requests[pos]
                length = len((ctx + cont)[-(self.max_length + 1):][:-1])
            else:
                length = self.max_length
            ceiling = self.max_batch_size
            cap = max(1, min(ceiling, self.batch_tokens // max(1, length)))
            self.max_batch_size = cap
            try:
                found = super()._detect_batch_size(requests, pos)
            finally:
                self.max_batch_size = ceiling
            probe = {"length": length, "cap": cap, "found": found}
            if probe not in self.batch_probes:
                self.batch_probes.append(probe)
            return found

        def batch_encode(self, strings: list[str]) -> list[list[int]]:
            """``HFLM.tok_encode`` for many strings in one tokenizer call: the same special-token rule
            (lm-eval's ``add_bos_token``, none where the text already starts with BOS)."""
            from lm_eval.models.utils import _add_special_kwargs, has_bos_prefix  # heavy: lm_eval (loaded by now)

            bos = self.tokenizer.decode(self.prefix_token_id)
            kwargs = _add_special_kwargs(None, self.add_bos_token)
            has = [has_bos_prefix(s, bos) for s in strings]
            out: list = [None] * len(strings)
            for flag, kw in ((True, kwargs | {"add_special_tokens": False}), (False, kwargs)):
                idx = [i for i, h in enumerate(has) if h is flag]
                if idx:
                    ids = self.tokenizer([strings[i] for i in idx], **kw).input_ids
                    for i, row in zip(idx, ids):
                        out[i] = row
            return out

        def tok_batch_encode(self, strings, *a, **kw):
            self._batch_contexts = list(strings)
            return super().tok_batch_encode(strings, *a, **kw)

        def _model_generate(self, context, max_length, stop, **kw):
            out = super()._model_generate(context, max_length, stop, **kw)
            width = context.shape[1]
            for text, row in zip(self._batch_contexts, out.tolist()):
                self.generated_ids[text] = row[width:]
            return out

    return RecordingHFLM(**args)


def attention_backend(lm) -> str:
    cfg = getattr(getattr(lm, "model", None), "config", None)
    return str(getattr(cfg, "_attn_implementation", "unknown"))


def loaded_settings(lm) -> dict:
    """After the evaluation: the batch sizes lm-eval's probes found under the memory plan's cap, and
    whether the scoring ran batched (``hf_scoring``)."""
    out: dict = {}
    if getattr(lm, "batch_probes", None):
        out["batch_probes"] = list(lm.batch_probes)
    if getattr(lm, "deferred_scoring", None) is not None:
        out["deferred_scoring"] = lm.deferred_scoring
    return out


# ---------------------------------------------------------------- what this machine has
def versions() -> dict[str, str]:
    return {}  # torch and transformers are every cell's (cells.versions)


def installed() -> tuple[bool, str]:
    try:
        import transformers  # heavy: transformers, lm_eval (doctor only)
        from lm_eval.api.registry import get_model

        get_model(lm_eval_model)
    except Exception as err:  # noqa: BLE001 - report any import failure
        return False, f"{type(err).__name__}: {str(err).splitlines()[0][:100] if str(err) else ''}"
    return True, f"lm-eval's {lm_eval_model} model, transformers {transformers.__version__}"


def snags() -> list[tuple[str, str]]:
    return []


def unsupported_dtypes(device: str, dtypes: list[str]) -> dict[str, str]:
    return {}  # transformers runs every dtype on CPU (slowly in half precision); GPUs are checked for all


# ---------------------------------------------------------------- the GPU memory plan
def row_bytes(shape: ModelShape, dtype: str, max_length: int, tensor_parallel: int = 1) -> int:
    """Peak bytes of one batch row of ``max_length`` tokens in lm-eval's HF scoring (an estimate): logits
    in the model dtype, their fp32 copy when the model's dtype is narrower (``log_softmax(dtype=float32)``
    upcasts first), the fp32 log-softmax, the previous batch's log-softmax (still referenced while the next
    batch runs), the returned KV cache, a few hidden-size buffers. With ``parallelize`` the layers are split
    over GPUs, so the logits still land whole on one of them.

    Measured on one H200 (SmolLM2-135M, 64 rows of 153 tokens, full HellaSwag, results/h200-real-models):
    peak 5.9 GiB in fp32 and 6.6 GiB in bf16, against 6.6 and 6.9 from this estimate plus the weights; an
    estimate without the fp32 copy and the previous batch's log-softmax said 4.8 and 3.3."""
    b = DTYPE_BYTES[dtype]
    logits = b + (4 if b < 4 else 0) + 4 + 4
    per_token = shape.vocab * logits + shape.kv_bytes_per_token(dtype) // tensor_parallel \
        + (shape.hidden * 8 + shape.intermediate * 3) * b
    return per_token * max_length


def memory_need(shape: ModelShape, dtype: str, max_length: int, tensor_parallel: int) -> tuple[int, int]:
    """Weights, the CUDA context and the forward pass of batch rows at full length: one row at least,
    ``TARGET_ROWS`` to be comfortable."""
    base = shape.weight_bytes(dtype, tensor_parallel) + CUDA_CONTEXT
    row = row_bytes(shape, dtype, max_length, tensor_parallel)
    return base + row, base + TARGET_ROWS * row


def memory_knobs(need: CellNeed, budget: int, gpu_total: int, shape: ModelShape, *, batch_size: int | str,
                 max_length: int, tensor_parallel: int, shared: bool) -> dict:
    """For ``batch_size=auto``, the ceiling of lm-eval's automatic batch size, so that the batch size its
    probe finds cannot outgrow the share once the other cells have grown into theirs: ``batch_tokens``, the
    tokens of batch rows the share holds, which the cell divides by the length lm-eval probes at, and
    ``max_batch_size``, that cap at full ``max_length``, for the plan's printout. A fixed batch size is the
    user's."""
    if batch_size != "auto":
        return {}
    tokens = (budget - need.weights - CUDA_CONTEXT) // row_bytes(shape, need.dtype, 1, tensor_parallel)
    rows = tokens // max_length  # a row's bytes are its tokens' (row_bytes), so this is the cap at full length
    return {"max_batch_size": int(max(1, min(LM_EVAL_MAX_BATCH, rows))), "batch_tokens": int(max(max_length, tokens))}


# ---------------------------------------------------------------- drift localisation
def drift_probe(lm):
    from evalparity.backends.probes import HFProbe  # heavy: torch, transformers (evalparity drift only)

    return HFProbe(lm)
