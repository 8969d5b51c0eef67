"""Precision modes: probe and set them per cell, so that TF32 or reduced-precision reductions are
recorded (and, for fp32 cells, turned off) instead of passing for drift.

On an H200, vLLM's Triton attention runs "fp32" in TF32 unless ``TRITON_F32_DEFAULT=ieee``; torch matmuls
and cuDNN can use TF32 too. All of these are settings: an fp32 cell is true fp32 on both backends unless
the user asks for a TF32 cell.
"""

from __future__ import annotations

import os


def environment(dtype: str, true_fp32: bool) -> dict[str, str]:
    """Environment for the cell process, set before torch/triton import. Only fp32 cells are touched:
    true fp32 asks Triton for IEEE fp32 dots, a TF32 cell asks for TF32 explicitly.

    vLLM's GPU worker resets torch's matmul precision to ``VLLM_FLOAT32_MATMUL_PRECISION`` (default
    "highest") when it starts, after ``apply`` ran, so a TF32 cell must say so there too. The H200 run of
    2026-11-30 showed it: its TF32 cell read back "highest" and measured Triton's TF32 attention alone."""
    if dtype != "float32":
        return {}
    return {"TRITON_F32_DEFAULT": "ieee" if true_fp32 else "tf32",
            "VLLM_FLOAT32_MATMUL_PRECISION": "highest" if true_fp32 else "high"}


def apply(true_fp32: bool) -> None:
    """Set torch's own switches in this process (after import)."""
    import torch  # heavy: torch

    torch.set_float32_matmul_precision("highest" if true_fp32 else "high")
    torch.backends.cuda.matmul.allow_tf32 = not true_fp32
    torch.backends.cudnn.allow_tf32 = not true_fp32


def _legacy(read) -> bool | str:
    """A legacy TF32 switch (``allow_tf32``) read back, or why it cannot be: torch refuses to answer the legacy
    question once the new per-backend API (``fp32_precision``) has set its parts differently, as vLLM's
    batch-invariant mode does (``VLLM_BATCH_INVARIANT=1``: measured on an H200, the cell crashed here)."""
    try:
        value = read()
    except RuntimeError:
        return "mixed: see the fp32_precision entries"
    return value if isinstance(value, str) else bool(value)


def probe() -> dict:
    """What this process will actually do, read back from torch and the environment: the legacy switches and,
    where this torch has them, the new per-backend ``fp32_precision`` settings (what decides when they
    disagree)."""
    import torch  # heavy: torch

    out = {
        "float32_matmul_precision": _legacy(torch.get_float32_matmul_precision),
        "cuda_matmul_allow_tf32": _legacy(lambda: torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": _legacy(lambda: torch.backends.cudnn.allow_tf32),
        "cuda_matmul_allow_bf16_reduced_precision_reduction":
            bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
        "cuda_matmul_allow_fp16_reduced_precision_reduction":
            bool(torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction),
        "triton_f32_default": os.environ.get("TRITON_F32_DEFAULT", "(unset: tf32 on GPUs that have it)"),
    }
    parts = (("cuda_matmul", lambda: torch.backends.cuda.matmul), ("cudnn_conv", lambda: torch.backends.cudnn.conv),
             ("cudnn_rnn", lambda: torch.backends.cudnn.rnn))
    for key, owner in parts:
        try:
            value = getattr(owner(), "fp32_precision", None)
        except (AttributeError, RuntimeError):
            value = None
        if value is not None:
            out[f"{key}_fp32_precision"] = str(value)
    return out
