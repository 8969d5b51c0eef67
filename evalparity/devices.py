"""Device detection and what each device can run, checked before any model loads."""

from __future__ import annotations

from pathlib import Path

from evalparity.backends import registry
from evalparity.errors import EvalParityError


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when a CUDA GPU is visible, else 'cpu'; an unavailable device is refused."""
    d = device.strip().lower()
    if d not in ("auto", "cpu", "cuda") and not d.startswith("cuda:"):
        raise EvalParityError(f"unknown device {device!r}: use cpu, cuda or auto")
    if d == "cpu":
        return "cpu"
    import torch  # heavy: torch

    has_cuda = torch.cuda.is_available()
    if d == "auto":
        return "cuda" if has_cuda else "cpu"
    if not has_cuda:
        raise EvalParityError(f"device {device} is not available here (no CUDA GPU visible): use --device cpu")
    return d


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def unsupported_dtypes(device: str, dtypes: list[str], backends: list[str]) -> dict[str, str]:
    """dtype -> why this device cannot run it (empty when all can run): each backend's own limits
    (``Backend.unsupported_dtypes``, e.g. vLLM's CPU kernels and AVX2), then the GPU's."""
    bad: dict[str, str] = {}
    for b in backends:
        for d, why in registry.get(b).unsupported_dtypes(device, dtypes).items():
            bad.setdefault(d, why)
    if device != "cpu":
        import torch  # heavy: torch

        if "bfloat16" in dtypes and not torch.cuda.is_bf16_supported():
            bad["bfloat16"] = f"{torch.cuda.get_device_name(0)} has no bfloat16 support (needs compute capability 8.0+)"
    return bad


def check_dtypes(device: str, dtypes: list[str], backends: list[str]) -> None:
    bad = unsupported_dtypes(device, dtypes, backends)
    if bad:
        d, why = next(iter(bad.items()))
        raise EvalParityError(f"dtype {d} cannot run on {device}: {why}; drop it from --dtypes")
