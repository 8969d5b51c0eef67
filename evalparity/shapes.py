"""What the GPU memory plan and the backends share: a model's shape, one cell's need, the bytes of a dtype.

Why a leaf of its own: the plan (``memplan``) asks each backend what a cell needs (``Backend.memory_need``)
and how a share becomes engine settings (``Backend.memory_knobs``), and the backends do that arithmetic on
these shapes. With the shapes in ``memplan``, the backends imported the plan and the plan imported the
backends: a cycle, hidden inside functions. Here they are plain data that imports nothing of evalparity, so
both sides import them and neither imports the other's stage backwards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GiB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CUDA_CONTEXT = int(0.6 * GiB)  # a process's CUDA context and library workspaces, outside PyTorch's allocator


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on, read from the model folder without loading weights (``memplan.read_shape``)."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    kv_heads: int
    head_dim: int

    def weight_bytes(self, dtype: str, tensor_parallel: int = 1) -> int:
        """Bytes of weights per GPU at ``dtype`` (the cell's dtype, whatever the checkpoint's)."""
        return math.ceil(self.params * DTYPE_BYTES[dtype] / tensor_parallel)

    def kv_bytes_per_token(self, dtype: str, tensor_parallel: int = 1) -> int:
        """K and V of every layer for one token, per GPU (KV heads are split over tensor-parallel ranks)."""
        heads = max(1, math.ceil(self.kv_heads / tensor_parallel))
        return 2 * self.layers * heads * self.head_dim * DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class CellNeed:
    """A cell's memory per GPU: ``minimum`` to run at all, ``comfortable`` to run well (``memplan.cell_need``)."""

    name: str
    backend: str
    dtype: str
    weights: int
    minimum: int
    comfortable: int
