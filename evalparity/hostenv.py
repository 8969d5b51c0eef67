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
import re
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
# Words that mark a name that may hold a credential: a part of the name (split at anything but letters and
# digits, trailing digits dropped) that is one of them or ends in one. Its value is withheld unless it is a
# plain number or switch under no ALWAYS_SECRET word (vLLM's ..._TOKENS thresholds are tuning, not secrets).
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PWD", "PASSPHRASE", "CREDENTIAL", "CRED",
                "AUTH", "BEARER", "COOKIE", "SESSION", "JWT", "SAS", "DSN", "CERT", "CERTFILE", "KEYFILE", "PRIVATE",
                "SIGNATURE", "HEADER", "HEADERS")
# Of those, the words whose values are withheld even when plain numbers (a numeric password or key is still
# one): all but TOKEN, whose names in vLLM's own list are thresholds (VLLM_..._TOKEN_THRESHOLD, ..._TOKENS).
ALWAYS_SECRET = tuple(w for w in SECRET_WORDS if w != "TOKEN")
# Values withheld whatever the name: what credentials look like (auth headers, PEM blocks, the token formats of
# Hugging Face, OpenAI, GitHub and AWS, JWTs) and long opaque strings; a URL's user:password is masked.
SECRET_VALUE = re.compile(r"(?i)authorization|bearer\s|basic\s|-----BEGIN|\bhf_[a-z0-9]{20,}|\bsk-[\w-]{16,}"
                          r"|\bgh[pousr]_\w{30,}|\bAKIA[0-9A-Z]{16}|\beyJ[\w-]+\.[\w-]+|[A-Za-z0-9+=_-]{32,}")
URL_USERINFO = re.compile(r"([a-z][a-z0-9+.-]*://)[^/@\s]+@", re.IGNORECASE)
PLAIN_VALUE = re.compile(r"(?i)-?\d+(\.\d+)?|true|false|yes|no|on|off")
# Per process or per run, steering nothing: left out (a port, a shared-memory name, the MPS server's folders).
# A cache's folder (evalparity sets torch's compile cache to its default for every child: procs.private_tmp_env)
# steers nothing either.
PER_PROCESS = ("VLLM_PORT", "VLLM_HOST_IP", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
               "TORCHINDUCTOR_CACHE_DIR")
MAX_VALUE = 200  # characters of a value kept (a path list can be long)
MAX_NAME = 100   # characters of a name kept
MAX_VARIABLES = 100  # variables kept; the record says how many more there were
WITHHELD = "(set; value withheld: the name suggests a credential)"
WITHHELD_VALUE = "(set; value withheld: it looks like a credential)"


def collect(environ) -> dict[str, str]:
    """The host, its accelerators and the kernel libraries, as strings ("absent" where a package is not
    installed; GPU fields only where torch is already imported and sees CUDA), and the steering variables of
    ``environ`` (a cell passes its environment from before the engine's import, which sets some of its own).
    Never raises."""
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
    return out | steering_variables(environ)


def steering_variables(environ) -> dict[str, str]:
    """``{"$NAME": value}`` for each variable of ``environ`` with one of ``ENV_PREFIXES`` (sorted; names and
    values as one printable ASCII line, cut at ``MAX_NAME`` and ``MAX_VALUE`` characters; at most
    ``MAX_VARIABLES``, then one entry saying how many more), less the ``PER_PROCESS`` ones. Credentials are
    never written: a value is withheld when the name may hold one (``may_hold_credential``) and the value is
    not a plain number or switch (or the name has an ``ALWAYS_SECRET`` word), or when the value looks like
    one (``SECRET_VALUE``); a URL's user:password is masked."""
    names = [n for n in sorted(environ) if n.startswith(ENV_PREFIXES) and n not in PER_PROCESS
             and not n.endswith("_SHM_BUFFER_NAME")]
    out = {}
    for name in names[:MAX_VARIABLES]:
        key = f"${_cut(_printable(name), MAX_NAME)}"
        value = str(environ[name])
        if may_hold_credential(name) and (may_hold_credential(name, ALWAYS_SECRET)
                                          or not PLAIN_VALUE.fullmatch(value.strip())):
            out[key] = WITHHELD
        elif SECRET_VALUE.search(value):
            out[key] = WITHHELD_VALUE
        else:
            out[key] = _cut(_printable(URL_USERINFO.sub(r"\1***@", value)), MAX_VALUE)
    if len(names) > MAX_VARIABLES:
        out["$..."] = f"{len(names) - MAX_VARIABLES} more not recorded"
    return out


def may_hold_credential(name: str, words: tuple[str, ...] = SECRET_WORDS) -> bool:
    """Whether a part of ``name`` (split at anything but letters and digits, trailing digits dropped) is, or
    ends in, one of ``words`` (plural too): VLLM_API_KEY, HF_TOKEN1, my-oauth, DB_PASS; not
    TOKENIZERS_PARALLELISM."""
    parts = [p.rstrip("0123456789") for p in re.split(r"[^A-Z0-9]+", name.upper())]
    return any(p.endswith(w) or p == w + "S" for p in parts if p for w in words)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


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
