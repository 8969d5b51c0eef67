"""Hugging Face transformers through lm-eval's ``hf`` model type."""

from __future__ import annotations

from evalparity.backends import parse_extra_args, precision
from evalparity.spec import CellSpec, RunSpec

LM_EVAL_TYPE = "hf"


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
    cap = spec.cell_memory(cell.name).get("max_batch_size")
    if cap and cell.batch_size == "auto":
        # the ceiling of lm-eval's batch-size probe, so that the batch it finds stays within the cell's
        # share of a GPU that other cells fill later (memplan)
        args["max_batch_size"] = cap
    if spec.tensor_parallel > 1:
        # HF has no tensor parallelism in lm-eval; it splits the layers over the cell's GPUs instead.
        args["parallelize"] = True
        args.pop("device")
    args.update(parse_extra_args(spec.hf_args))
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
        "max_batch_size": args.get("max_batch_size", "lm-eval default (64)" if cell.batch_size == "auto" else None),
        "memory_plan": spec.cell_memory(cell.name) or None,
    }


def create_lm(args: dict):
    """An HFLM that also keeps the generated token ids, keyed by the prompt text."""
    from lm_eval.models.huggingface import HFLM  # heavy: lm_eval, transformers, torch

    class RecordingHFLM(HFLM):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.generated_ids: dict[str, list[int]] = {}
            self._batch_contexts: list[str] = []

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
