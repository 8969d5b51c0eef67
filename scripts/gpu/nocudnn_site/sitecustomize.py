"""The session-31 experiment (scripts/gpu), kept to repeat it: with this folder on ``PYTHONPATH`` and
``EP_NO_CUDNN_SDPA`` set, every Python process started keeps torch's SDPA off cuDNN (the product's HF probes
now do so themselves: ``backends.probes.SDPA_KERNELS``)."""

import os

if os.environ.get("EP_NO_CUDNN_SDPA"):
    import torch

    torch.backends.cuda.enable_cudnn_sdp(False)
