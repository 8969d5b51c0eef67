"""``hfcopy``: a third backend that exists only for the tests, registered from this one file.

It proves the backend contract (``evalparity.backends.base.Backend``): nothing in the package names it, yet
``evalparity run``, ``report``, ``drift`` and the checks before a run reach it through the registry. It is
lm-eval's HF model under another name (so its cells equal ``hf``'s bit for bit on a CPU), with marks of its
own that show each member was asked: an environment variable its LM checks for, a settings entry, a version
entry, a read-back, and a dtype limit (no float16).

Registration: a process that imports this module has the backend. The tests name it in
``EVALPARITY_PLUGINS=toy_backend`` with this folder on ``PYTHONPATH``, so the CLI, every cell process and
every drift worker import it on their first registry lookup (``evalparity.backends.registry``).
"""

from __future__ import annotations

import os
import sys
import zlib

from evalparity.backends import hf, registry

name = "hfcopy"
lm_eval_model = hf.lm_eval_model
install_hint = "it is tests/toy_backend.py: put tests/ on PYTHONPATH and set EVALPARITY_PLUGINS=toy_backend"
MARK = "EVALPARITY_TOY_BACKEND"


def model_args(spec, cell, model_path: str) -> dict:
    return hf.model_args(spec, cell, model_path)


def environment(spec, cell) -> dict[str, str]:
    return hf.environment(spec, cell) | {MARK: cell.name}


def settings(spec, cell, args: dict) -> dict:
    return hf.settings(spec, cell, args) | {"toy_backend": name}


PLANT = "zzplant"  # a request whose context holds this word gets its loglikelihood shifted: a planted drift


def create_lm(args: dict):
    if not os.environ.get(MARK):  # environment() must have reached the cell's process
        raise RuntimeError(f"{MARK} is not set: the backend's environment did not reach this process")
    lm = hf.create_lm(args)
    plant(lm)
    return lm


def plant(lm) -> None:
    """The planted effect the staged-run test needs: for docs whose question holds ``PLANT``, each choice's
    loglikelihood gets a fixed pseudo-random shift of 0 to 200 nats (the same in every process), so this
    backend's answer differs from ``hf``'s on most of those docs; every other request is ``hf``'s, bit for bit."""
    original = lm.loglikelihood

    def loglikelihood(requests, *a, **kw):
        out = original(requests, *a, **kw)
        shifted = []
        for req, (ll, greedy) in zip(requests, out):
            context, continuation = req.args[0], req.args[1]
            if PLANT in context:
                ll += (zlib.crc32(f"{context}|{continuation}".encode()) % 20000) / 100.0
            shifted.append((ll, greedy))
        return shifted

    lm.loglikelihood = loglikelihood


def attention_backend(lm) -> str:
    return hf.attention_backend(lm)


def loaded_settings(lm) -> dict:
    return {"toy_lm_class": type(lm).__name__}


def versions() -> dict[str, str]:
    return {"hfcopy": "test backend"}


def installed() -> tuple[bool, str]:
    ok, info = hf.installed()
    return ok, f"test backend over {info}"


def snags() -> list[tuple[str, str]]:
    return []


def unsupported_dtypes(device: str, dtypes: list[str]) -> dict[str, str]:
    return {"float16": "the toy backend runs float32 and bfloat16 only"} if "float16" in dtypes else {}


def memory_need(shape, dtype: str, max_length: int, tensor_parallel: int) -> tuple[int, int]:
    return hf.memory_need(shape, dtype, max_length, tensor_parallel)


def memory_knobs(need, budget: int, gpu_total: int, shape, **kw) -> dict:
    return hf.memory_knobs(need, budget, gpu_total, shape, **kw)


def drift_probe(lm):
    """The HF probe over the toy's LM (made by ``create_lm`` above, so with this backend's environment)."""
    return hf.drift_probe(lm)


registry.register(name, sys.modules[__name__])
