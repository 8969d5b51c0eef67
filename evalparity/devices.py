"""Device detection and what each device can run, checked before any model loads."""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

from evalparity.backends import registry
from evalparity.errors import EvalParityError


def visible_gpus(cheap: bool = False) -> list[str]:
    """The GPUs this process may use (``CUDA_VISIBLE_DEVICES`` where set); ``cheap``: as the NVIDIA driver
    lists them, without importing torch (seconds) or starting CUDA: a guess that a later check confirms."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [g for g in vis.split(",") if g.strip()]
    if cheap:
        try:
            return sorted(os.listdir("/proc/driver/nvidia/gpus"))
        except OSError:
            return []
    try:
        import torch  # heavy: torch (the cheap count above needs none)

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001
        return []


def torch_cuda_build() -> str | None:
    """The CUDA version torch was built for (``torch.version.cuda``), read from its ``version.py`` without
    importing torch; None for a CPU build, or where torch or that file cannot be read."""
    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            return None
        tree = ast.parse((Path(spec.origin).parent / "version.py").read_text())
    except (OSError, ValueError, SyntaxError, ImportError):
        return None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(node.value, ast.Constant):
            return node.value.value if isinstance(node.value.value, str) else None
    return None


def resolve_device(device: str, cheap: bool = False) -> str:
    """'auto' -> 'cuda' when a CUDA GPU is visible, else 'cpu'; an unavailable device is refused.

    ``cheap``: whether a GPU is usable is read from the driver (``visible_gpus(cheap=True)``) and from the
    CUDA version torch was built for (``torch_cuda_build``: a CPU build on a GPU host makes ``auto`` the
    CPU, as torch would), not from torch's import, for a command whose worker imports torch anyway and
    checks CUDA itself (``check_cuda``): ``evalparity hidden`` then starts its worker within a second
    instead of after torch's import."""
    d = device.strip().lower()
    if d not in ("auto", "cpu", "cuda") and not d.startswith("cuda:"):
        raise EvalParityError(f"unknown device {device!r}: use cpu, cuda or auto")
    if d == "cpu":
        return "cpu"
    why, fix = "no CUDA GPU visible", "use --device cpu"
    if cheap:
        listed, build = bool(visible_gpus(cheap=True)), torch_cuda_build()
        has_cuda = listed and build is not None
        if listed and build is None:
            why, fix = "torch here is a CPU build", "install a CUDA build of torch, or use --device cpu"
    else:
        import torch  # heavy: torch

        has_cuda = torch.cuda.is_available()
    if d == "auto":
        return "cuda" if has_cuda else "cpu"
    if not has_cuda:
        raise EvalParityError(f"device {device} is not available here ({why}): {fix}")
    return d


def check_cuda(device: str) -> None:
    """In a worker that imports torch: refuse in one line a CUDA device that torch cannot use (the driver
    listed a GPU, ``resolve_device(cheap=True)``, but this torch has no CUDA or cannot start it)."""
    if not device.startswith("cuda"):
        return
    import torch  # heavy: torch (the worker's own)

    if not torch.cuda.is_available():
        raise EvalParityError(f"device {device} is not available to torch here (torch {torch.__version__}, CUDA "
                              f"{torch.version.cuda or 'none'}): use --device cpu, or install a CUDA build of torch")


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
