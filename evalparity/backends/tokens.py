"""Tokenizing many prompts in one call, on every core.

Every cell's process starts with ``TOKENIZERS_PARALLELISM=false`` (``cellenv.cell_environment``): lm-eval
forks in places after its tokenizer has run, and a tokenizer that used its thread pool before a fork warns
and turns itself off in the child; and cells packed on one host would each start a thread per core. The
probes' batch encodes (``HFProbe.encode``, ``VLLMProbe.encode``: drift and ``evalparity hidden``) tokenize
thousands of prompts in one call in a worker that forks nothing afterwards; there, and only there, the Rust
tokenizer's threads are worth having: 10,000 HellaSwag prompts took 2.8 s of an ``evalparity hidden`` run
on a 16-core H200 host on one thread, 0.55 s on all of them (results/drift-h200, session 22); on 2 cores,
1.44 s against 0.69 s. The same ids either way. The switch is read at each
call, so it is set for the call and put back after.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

SWITCH = "TOKENIZERS_PARALLELISM"


@contextlib.contextmanager
def all_cores() -> Iterator[None]:
    """HF tokenizers' thread pool on for the block (``SWITCH`` true), then the switch as it was."""
    before = os.environ.get(SWITCH)
    os.environ[SWITCH] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SWITCH, None)
        else:
            os.environ[SWITCH] = before
