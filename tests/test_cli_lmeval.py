"""lm-eval's spellings on evalparity's command line: its option names get the evalparity name in one line, and
its fractional ``--limit`` takes each task's share."""

from __future__ import annotations

import pytest
from conftest import evalparity, one_line_error

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
