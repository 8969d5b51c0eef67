"""transformers without scikit-learn and SciPy: a process that loads models skips libraries it never uses.

transformers' generation utilities (``generation/candidate_generator.py``, imported by every causal-LM class
through ``GenerationMixin``) import ``sklearn.metrics.roc_curve`` whenever scikit-learn is installed, and
lm-eval installs it. That one import brings in scikit-learn, ``scipy.stats`` and ``scipy.special``: measured
on this project's 2-core CPU machine (shared with another job), ``from transformers import
AutoModelForCausalLM`` plus lm-eval's HF model took 8.9-20.3 s with it and 4.5-7.0 s without it (three fresh
processes each; torch already imported); on an H200 host the HF probe's load 12.2-13.7 s against 8.5-9.2 s.
Every cell, probe, ``evalparity hidden`` worker and the embedded model's preparation pays that once per
process, before its model loads.

transformers uses ``roc_curve`` only to tune an assistant model's confidence threshold in assisted
generation, which evalparity never runs (lm-eval's models generate without an assistant). So the processes
that evalparity starts to load models tell transformers, before its generation utilities are imported, that
scikit-learn is absent (``apply``). Anything else that imports scikit-learn (an lm-eval task's metric, say)
still imports it as usual: only transformers' own question is answered.

SciPy the same way: transformers' loss functions (``loss/loss_utils.py``, imported by ``modeling_utils``, so
by every model class) import ``scipy.optimize.linear_sum_assignment`` for the object-detection losses'
Hungarian matcher whenever SciPy is installed. No causal LM uses it (an object-detection model's loss would
fail in such a process, which never trains one), and anything else that imports SciPy still gets it.
Measured on the 2-core machine: 0.43 s of a 4.8 s import of transformers' model classes and lm-eval's HF
model, with scikit-learn already answered.

tests/test_slim.py checks, in a fresh process, that the answers keep scikit-learn and SciPy out of a model's
imports, so that a transformers that asks the question elsewhere fails the test instead of quietly costing the
seconds again.
"""

from __future__ import annotations

import sys

GENERATION_UTILS = "transformers.generation.candidate_generator"


def _absent() -> bool:
    return False


def apply() -> None:
    """Before transformers' generation utilities and losses are imported: make ``transformers.utils``'
    ``is_sklearn_available`` and ``is_scipy_available`` (the names those modules import) say no in this
    process. A no-op where they are imported already (their import has happened), or where transformers is
    not installed. Call it first thing in a process that will load a model."""
    if GENERATION_UTILS in sys.modules:
        return
    try:
        import transformers.utils as tf_utils  # heavy: transformers' utilities (imported by any model load)
    except ImportError:
        return
    tf_utils.is_sklearn_available = _absent
    tf_utils.is_scipy_available = _absent
