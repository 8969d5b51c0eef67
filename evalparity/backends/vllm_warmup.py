"""``python -m evalparity.backends.vllm_warmup ARCH...``: fill vLLM's model-info cache for these
architectures, once, while a run sets up (``evalparity.warmup``).

Why (measured on a fresh H200, issue 26; results/staged-h200): before building an engine, vLLM inspects
the model's architecture class in a subprocess that imports vLLM and torch again, unless
``$VLLM_CACHE_ROOT/modelinfos`` already has the answer for that class's source. On a fresh machine every
vLLM cell of a run pays that at once: 25.7 s of a cell's 68-70 s load under the profiler (with empty
caches), none with a filled cache. The cache is keyed by the class's source file, not by the model, so one
inspection by architecture name serves every cell. This process exists only for that, so it inspects in
its own process instead of starting another one.

Best effort: any failure (another vLLM without these internals) exits 0 and the cells inspect as before.

``python -m evalparity.backends.vllm_warmup --engine``: compile a vLLM cell's kernels once, before the cell
needs them. Why (measured on fresh H200s, session 26; results/staged-h200): vLLM's V2 model runner compiles
its Triton kernels (input preparation, the sampler's every feature, Triton attention for fp32) when its
engine starts, 14-15 s of a cold cell's 45 s to ready, against none warm: Triton's cache
(``~/.triton/cache``) keys a kernel by its source, types and constants, not by the process or the weights.
This process starts at the beginning of the run's setup, with the cell's environment, and imports vLLM and
lm-eval while the run reads its tasks. Then it reads one JSON line on stdin, sent once the run's memory
plan is made (so the plan never sees its memory): ``{"args": {...}}``, the cell's own engine arguments with
random weights of one layer (``backends.vllm.kernel_warmup_args``), or ``{"skip": "why"}``. It builds the
cell's LM exactly as the cell does (``backends.vllm.create_lm``), which runs vLLM's kernel warm-up, and
exits. The cells, still importing, find the kernels compiled.
"""

from __future__ import annotations

import json
import os
import sys
import time

from evalparity import slim


def warm(architectures: list[str]) -> list[str]:
    """Inspect each architecture through vLLM's registry (its cache is written as a side effect); the names
    vLLM answered for."""
    from vllm.model_executor.models import registry  # heavy: vllm (optional)

    if hasattr(registry, "_run_in_subprocess"):
        registry._run_in_subprocess = lambda fn: fn()  # this process is the subprocess vLLM would start
    done = []
    for arch in architectures:
        if registry.ModelRegistry._try_inspect_model_cls(arch) is not None:
            done.append(arch)
    return done


def engine(stdin) -> str:
    """Import, wait for the run's message, build the cell's engine: what happened, in one line."""
    t0 = time.perf_counter()
    from evalparity.backends import compat, vllm  # light

    compat.apply()
    import lm_eval.models.vllm_causallms  # noqa: F401  heavy: lm_eval, vllm, torch (the wait is spent here)

    imported = time.perf_counter() - t0
    line = stdin.readline()
    message = json.loads(line) if line.strip() else {"skip": "the run sent nothing (it ended first)"}
    if "skip" in message:
        return f"engine warm-up skipped: {message['skip']} (imports {imported:.1f} s)"
    t1 = time.perf_counter()
    lm = vllm.create_lm(message["args"])  # vLLM's own kernel warm-up runs while the engine starts
    return (f"engine warm-up done: kernels compiled in {time.perf_counter() - t1:.1f} s "
            f"(imports {imported:.1f} s, {time.perf_counter() - t0:.1f} s in all; {built(lm)})")


def built(lm) -> str:
    """What engine the warm-up built, read back from vLLM: its layers and weights (one, dummy)."""
    try:
        config = lm.model.llm_engine.vllm_config
        return (f"{config.model_config.hf_config.num_hidden_layers} layer(s), "
                f"{config.load_config.load_format} weights, {config.model_config.dtype}")
    except AttributeError:  # another vLLM's layout: the warm-up ran all the same
        return "engine layout not read"


def main(argv: list[str]) -> int:
    slim.apply()  # before vLLM imports transformers: without scikit-learn (evalparity/slim.py)
    if argv[:1] == ["--engine"]:
        try:
            said = engine(sys.stdin)
        except Exception as err:  # noqa: BLE001 - a warm-up that fails costs nothing but its own time
            said = f"engine warm-up failed: {type(err).__name__}: {str(err)[:300]}"
        print(said, flush=True)
        sys.stderr.flush()
        os._exit(0)  # not the engine's shutdown: the process's end frees the GPU at once
    try:
        done = warm(argv)
    except Exception as err:  # noqa: BLE001 - a warm-up that fails costs nothing but its own time
        print(f"vLLM warm-up skipped: {type(err).__name__}: {str(err)[:200]}", flush=True)
        return 0
    print(f"vLLM model-info cache warm for: {', '.join(done) or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
