"""lm-eval's spellings on evalparity's command line: its option names get the evalparity name in one line, and
its fractional ``--limit`` takes each task's share."""

from __future__ import annotations

import json

import pytest
from conftest import VARIANT_CELLS, evalparity, one_line_error

from evalparity.errors import EvalParityError
from evalparity.spec import check_limit, fraction_limits


@pytest.mark.parametrize("flag, says", [("--model_args", "--hf-args"), ("--output_path", "--out"),
                                        ("--num_fewshot", "--num-fewshot"), ("--use_cache", "never used")])
def test_lm_eval_spellings_get_the_evalparity_name(flag, says):
    proc = evalparity("run", flag, "x")
    line = one_line_error(proc)
    assert proc.returncode == 2 and "lm-eval's spelling" in line and says in line


def test_limit_reads_numbers_and_fractions():
    assert check_limit(None) == (None, None)
    assert check_limit("100") == (100, None) and check_limit(7) == (7, None)
    assert check_limit("0.1") == (None, 0.1)
    for bad in ("0", "-3", "2.5", "x", "nan", "inf"):
        with pytest.raises(EvalParityError):
            check_limit(bad)


def test_a_fraction_is_each_tasks_share_and_a_task_limit_keeps_its_own():
    leaves = {"mmlu_a": 100, "mmlu_b": 7, "gsm8k": 1319}
    got = dict(fraction_limits(0.1, leaves, (("gsm8k", 50),)))
    assert got == {"mmlu_a": 10, "mmlu_b": 1, "gsm8k": 50}


def test_chat_template_options_are_checked_before_any_model_loads(tiny_model, tiny_tasks, tmp_path):
    base = ["run", "--model", str(tiny_model), "--tasks", "tiny_mc", "--include-path", str(tiny_tasks),
            "--backends", "hf", "--dtypes", "fp32,bf16", "--limit", "2", "--out", str(tmp_path / "r")]
    proc = evalparity(*base, "--apply-chat-template")
    assert proc.returncode == 2 and "has no chat template" in one_line_error(proc)
    proc = evalparity(*base, "--fewshot-as-multiturn")
    assert proc.returncode == 2 and "needs --apply-chat-template" in one_line_error(proc)


def test_chat_template_reaches_every_cell_and_is_recorded(hf_variant_run):
    """The shared run of conftest.hf_variant_run: a copy of the tiny model given a chat template, applied."""
    _, out, proc = hf_variant_run
    assert proc.returncode in (0, 4), proc.stderr[-2000:]
    spec = json.loads((out / "spec.json").read_text())
    assert spec["alignment"]["apply_chat_template"] and spec["alignment"]["system_instruction"] == "Be brief."
    for cell in VARIANT_CELLS:
        rec = json.loads((out / "cells" / cell / "cell.json").read_text())
        assert rec["settings"]["chat"] == {"apply_chat_template": True, "system_instruction": "Be brief."}
        samples = next((out / "cells" / cell / "lm_eval").rglob("samples_tiny_mc_*.jsonl")).read_text()
        assert "<<system>>Be brief.<<user>>" in samples  # the template wrapped the request lm-eval scored
