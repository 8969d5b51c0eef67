"""evalparity/slim.py: the processes that load models import transformers without scikit-learn.

Each check runs in a fresh interpreter: what a process imports depends on what it imported before."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sklearn") is None,
                                reason="scikit-learn is not installed: transformers would not import it anyway")


def _python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_a_model_class_and_lmevals_hf_model_import_without_sklearn_or_scipy_after_apply():
    """With ``apply`` first, transformers' causal-LM classes (their generation utilities and losses) and
    lm-eval's HF model load without scikit-learn and SciPy. The controls show that each question ``apply``
    answers is the one that imports its library: without ``apply`` both come in; with only scikit-learn's
    question answered (``apply`` before SciPy's was added), SciPy's optimizer still does, through the losses."""
    code = """
        import sys
        {apply}
        from transformers import AutoModelForCausalLM, LlamaForCausalLM
        import lm_eval.models.huggingface
        import transformers.generation.candidate_generator
        import transformers.loss.loss_utils
        print(sorted(m for m in ("sklearn", "sklearn.metrics", "scipy.optimize") if m in sys.modules))
    """
    assert _python(code.format(apply="from evalparity import slim; slim.apply()")) == "[]"
    assert _python(code.format(apply="")) == "['scipy.optimize', 'sklearn', 'sklearn.metrics']"
    sklearn_only = "import transformers.utils as u; u.is_sklearn_available = lambda: False"
    assert _python(code.format(apply=sklearn_only)) == "['scipy.optimize']"


def test_another_import_of_sklearn_or_scipy_still_works_after_apply():
    """Only transformers' questions are answered: a task metric that imports scikit-learn or SciPy itself
    gets it."""
    out = _python("""
        from evalparity import slim; slim.apply()
        from transformers import AutoModelForCausalLM
        from sklearn.metrics import f1_score
        from scipy.optimize import linear_sum_assignment
        print(f1_score([0, 1, 1], [0, 1, 0]) + linear_sum_assignment([[1, 0], [0, 1]])[1].sum())
    """)
    assert float(out) == pytest.approx(2 / 3 + 1)


def test_every_process_that_loads_a_model_applies_it_before_anything_else():
    """The entry points of the processes evalparity starts to load models (cells, the hidden and drift
    workers, the embedded model's preparation, the vLLM warm-up and ``vllm serve``) each call ``slim.apply``
    first: here ``apply`` is replaced by one that records its caller and stops the process's work, so an
    entry point that reached anything else first fails (it meets its dummy arguments) instead."""
    out = _python("""
        import sys
        from evalparity import slim

        class Applied(Exception):
            pass

        def recording():
            raise Applied

        slim.apply = recording
        from evalparity import cells, hidden
        from evalparity.backends import server_process, vllm_warmup
        from evalparity.data import embedded
        from evalparity.drift import worker
        entries = {"cells": lambda: cells.main(["/nonexistent", "c", "m"]),
                   "cells probe": lambda: cells.main(["--probe", "hf"]),
                   "hidden": lambda: hidden.main(["/nonexistent", "main"]),
                   "drift": lambda: worker.main(["/nonexistent", "c"]),
                   "prepare": embedded._prepare_main,
                   "warm-up": lambda: vllm_warmup.main(["LlamaForCausalLM"]),
                   "serve": lambda: server_process.main(["--help"])}
        applied = []
        for name, entry in entries.items():
            try:
                entry()
            except Applied:
                applied.append(name)
            except BaseException as err:
                print(f"{name}: {type(err).__name__}: {err}", file=sys.stderr)
        print(",".join(applied))
    """)
    assert out.split(",") == ["cells", "cells probe", "hidden", "drift", "prepare", "warm-up", "serve"]
