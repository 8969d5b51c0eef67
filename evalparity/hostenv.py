"""What a cell ran on, beyond the Python packages it imported: a ``collect-env``-style record (as PyTorch's
``collect_env`` and vLLM's bug template ask for) and the environment variables that steer the engines
(``steering_variables``), kept in each cell's record (``cell.json`` ``environment``) and shown side by side
in the report's setup section.

Why per cell: on Ray the cells of one run may run on other hosts, with other drivers and GPUs; a difference
between two cells' environments is a confound to see before calling a difference drift.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import shutil
import subprocess
import sys

# Packages whose versions change kernels: the attention libraries vLLM and HF may pick, and Triton.
KERNEL_PACKAGES = ("triton", "flash_attn", "flashinfer-python", "xformers", "bitsandbytes")

# Environment variables that steer the engines' choices and kernels: vLLM reads dozens (its model runner,
# attention backend, sampler, batch-invariant kernels), Triton and torch some, cuBLAS and cuDNN a few.
# Recorded as the cell's process saw them, each as its own entry ("$NAME"), so that a variable set in one
# shell and not another shows as a difference between cells or runs instead of passing for drift.
ENV_PREFIXES = ("VLLM_", "TRITON_", "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "CUBLAS_", "CUBLASLT_", "CUDNN_",
                "NVIDIA_TF32_", "CUDA_MPS_", "OMP_", "TOKENIZERS_")
# Words that mark a name that may hold a credential: named, its value never written (run folders are shared).
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
MAX_VALUE = 200  # characters of a value kept (a path list can be long)
WITHHELD = "(set; value withheld: the name suggests a credential)"


def collect() -> dict[str, str]:
    """The host, its accelerators and the kernel libraries, as strings ("absent" where a package is not
    installed; GPU fields only where torch is already imported and sees CUDA). Never raises."""
    out = {"python": platform.python_version(), "os": platform.platform(), "host": platform.node(),
           "cpu": _cpu_model(), "cpu_cores": str(os.cpu_count()), "memory_gib": _memory_gib()}
    for dist in KERNEL_PACKAGES:
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "absent"
    torch = sys.modules.get("torch")  # the cell has imported it by now; this module never imports it
    if torch is not None:
        try:
            out["torch_cuda"] = str(torch.version.cuda)
            if torch.cuda.is_available():
                out["cudnn"] = str(torch.backends.cudnn.version())
                out["gpus"] = "; ".join(f"{torch.cuda.get_device_name(i)} "
                                        f"({torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB)"
                                        for i in range(torch.cuda.device_count()))
                out["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
        except Exception:  # noqa: BLE001 - a record of the environment must not fail the cell
            pass
    driver = _nvidia_driver()
    if driver:
        out["nvidia_driver"] = driver
    return out | steering_variables(os.environ)


def steering_variables(environ) -> dict[str, str]:
    """``{"$NAME": value}`` for each variable of ``environ`` with one of ``ENV_PREFIXES`` (sorted; names and
    values as one printable ASCII line, values cut at ``MAX_VALUE`` characters); a name that may hold a
    credential (``may_hold_credential``) is kept with its value withheld."""
    out = {}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIXES):
            continue
        key = f"${_printable(name)}"
        if may_hold_credential(name):
            out[key] = WITHHELD
            continue
        value = _printable(str(environ[name]))
        out[key] = value if len(value) <= MAX_VALUE else value[:MAX_VALUE] + "..."
    return out


def may_hold_credential(name: str) -> bool:
    """Whether a part of ``name`` between underscores is, or ends in, one of ``SECRET_WORDS`` (plural too):
    VLLM_API_KEY, HF_TOKEN, MY_OAUTH; not TOKENIZERS_PARALLELISM."""
    return any(part.endswith(w) or part == w + "S" for part in name.upper().split("_") for w in SECRET_WORDS)


def _printable(text: str) -> str:
    """One line of ASCII: control and non-ASCII characters as Python escapes."""
    return text.encode("unicode_escape").decode("ascii")


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> str:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return f"{pages * size / 2**30:.0f}"
    except (ValueError, OSError, AttributeError):
        return "unknown"


def _nvidia_driver() -> str | None:
    """The NVIDIA driver's version from ``nvidia-smi`` (5 s at most), or None without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    versions = sorted({v.strip() for v in out.splitlines() if v.strip()})
    return ", ".join(versions) or None
