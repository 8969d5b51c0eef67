"""Device detection and what each device can run, checked before any model loads."""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

from evalparity.backends import registry
from evalparity.errors import EvalParityError


def visible_gpus(cheap: bool = False) -> list[str]:
    """The GPUs this process may use (``CUDA_VISIBLE_DEVICES`` where set, read as CUDA reads it); ``cheap``:
    as the NVIDIA driver lists them, without importing torch (seconds) or starting CUDA: a guess that a later
    check confirms."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return _cuda_visible(vis)
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


def _cuda_visible(value: str) -> list[str]:
    """The devices a ``CUDA_VISIBLE_DEVICES`` value leaves visible: its entries up to the first one that is
    not a device (an index such as ``-1``, the usual way to hide every GPU, or any other text), as CUDA does."""
    out = []
    for entry in (x.strip() for x in value.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        out.append(entry)
    return out


def torch_gpu_build() -> tuple[str, str] | None:
    """What GPUs torch was built for, read from its ``version.py`` without importing it: ("cuda", version)
    (``torch.version.cuda``), ("hip", version) for ROCm, None for a CPU build, or where torch or that file
    cannot be read."""
    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            return None
        tree = ast.parse((Path(spec.origin).parent / "version.py").read_text())
    except (OSError, ValueError, SyntaxError, ImportError):
        return None
    found: dict[str, str] = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant) and \
                isinstance(node.value.value, str):
            found[target.id] = node.value.value
    kind = next((k for k in ("cuda", "hip") if k in found), None)
    return (kind, found[kind]) if kind else None


def _gpu_without_torch() -> bool | None:
    """Whether torch could use a GPU here, where that is sure without importing it: False for a CPU build of
    torch, True for a CUDA build and a GPU the driver lists (the worker confirms); None otherwise (ROCm, or a
    CUDA build with no GPU listed), where torch has to be asked."""
    build = torch_gpu_build()
    if build is None:
        return False
    return True if build[0] == "cuda" and visible_gpus(cheap=True) else None


def resolve_device(device: str, cheap: bool = False) -> str:
    """'auto' -> 'cuda' when a CUDA GPU is visible, else 'cpu'; an unavailable device is refused.

    ``cheap``: for a command whose worker imports torch anyway and checks CUDA itself (``check_cuda``):
    ``evalparity hidden`` then starts its worker within a second instead of after torch's import. torch is
    not imported where the answer is sure without it: a CPU build of torch (no GPU it can use), or a CUDA
    build and a GPU the driver lists (the worker confirms). Anything else (ROCm, or a CUDA build with no GPU
    in the driver's list: WSL2, GPUs hidden by ``CUDA_VISIBLE_DEVICES``) asks torch, as without ``cheap``."""
    d = device.strip().lower()
    if d not in ("auto", "cpu", "cuda") and not d.startswith("cuda:"):
        raise EvalParityError(f"unknown device {device!r}: use cpu, cuda or auto")
    if d == "cpu":
        return "cpu"
    why, fix = "no CUDA GPU visible", "use --device cpu"
    has_cuda = _gpu_without_torch() if cheap else None
    if has_cuda is None:
        import torch  # heavy: torch

        has_cuda = torch.cuda.is_available()
    elif not has_cuda and visible_gpus(cheap=True):
        why, fix = "torch here is a CPU build", "install a CUDA build of torch, or use --device cpu"
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
        raise EvalParityError(f"device {device} (the driver lists a GPU) is not available to torch here (torch "
                              f"{torch.__version__}, CUDA {torch.version.cuda or 'none'}): use --device cpu, or "
                              "install a CUDA build of torch")


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
