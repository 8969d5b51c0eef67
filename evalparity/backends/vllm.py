"""vLLM through lm-eval's ``vllm`` model type, aligned for scoring."""

from __future__ import annotations

from evalparity.backends import compat, parse_extra_args, precision
from evalparity.spec import CellSpec, RunSpec

LM_EVAL_TYPE = "vllm"
CPU_KVCACHE_GIB = "2"


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
    if spec.tensor_parallel > 1:
        args["tensor_parallel_size"] = spec.tensor_parallel
    if a.add_bos_token is not None:
        args["add_bos_token"] = a.add_bos_token
    args.update(parse_extra_args(spec.vllm_args))
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


def create_lm(args: dict):
    """A VLLM LM that also keeps the generated token ids, keyed by the prompt text, and scores with flat
    prompt logprobs (``flat_scoring_params``) where vLLM has them."""
    compat.apply()
    from lm_eval.models.vllm_causallms import VLLM  # heavy: lm_eval; optional: vllm

    class RecordingVLLM(VLLM):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.generated_ids: dict[str, list[int]] = {}
            self._by_prompt_ids: dict[tuple, list[int]] = {}
            self.scoring_params = flat_scoring_params()  # None: lm-eval's own path

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

    return RecordingVLLM(**args)


def attention_backend(lm) -> str:
    try:
        cfg = lm.model.llm_engine.vllm_config
        return str(getattr(getattr(cfg, "attention_config", None), "backend", None) or "auto")
    except Exception:  # noqa: BLE001 - best effort; the log says which backend vLLM chose
        return "see cell.log"
