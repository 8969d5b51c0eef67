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
"""

from __future__ import annotations

import sys

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


def main(argv: list[str]) -> int:
    slim.apply()  # before vLLM imports transformers: without scikit-learn and SciPy (evalparity/slim.py)
    try:
        done = warm(argv)
    except Exception as err:  # noqa: BLE001 - a warm-up that fails costs nothing but its own time
        print(f"vLLM warm-up skipped: {type(err).__name__}: {str(err)[:200]}", flush=True)
        return 0
    print(f"vLLM model-info cache warm for: {', '.join(done) or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
