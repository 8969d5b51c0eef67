"""The verdict table on the terminal (issue 27, item 2): fixed verdicts.json documents rendered at 80 columns,
as in a CI log: every number whole, the unsettled and failed comparisons first, a headline that names the
next step, where each staged task stopped, and user text shown as written."""

from __future__ import annotations

import io
import re

from rich.console import Console

from evalparity.cli.verdict_table import print_verdicts

CELLS = ["vllm-fp32", "vllm-bf16", "hf-bf16"]


def comparison(task: str, metric: str, cell: str, verdict: str, effect: float, half: float, n: int,
               n_needed: int | None, gating: bool = True, unit: str = "fraction") -> dict:
    return {"task": task, "level": "task", "filter": "none", "metric": metric, "cell": cell, "reference": "hf-fp32",
            "verdict": verdict, "gating": gating, "effect": effect, "ci_low": effect - half, "ci_high": effect + half,
            "n": n, "n_needed": n_needed, "unit": unit}


def document(status: str, reason: str, rows: list[dict], staging: dict | None = None) -> dict:
    return {"sign_off": {"status": status, "reason": reason}, "comparisons": rows, "staging": staging}


def render(verdicts: dict, width: int = 80) -> str:
    out = io.StringIO()
    print_verdicts(Console(file=out, width=width, force_terminal=False), verdicts)
    return out.getvalue()


def numbers(c: dict) -> list[str]:
    """The numbers a row must show whole: Δ and its CI in pp, n, and n_needed when unsettled."""
    scale = 100 if c["unit"] in ("pp", "fraction") else 1
    out = [f"{c['effect'] * scale:+.2f}", f"{c['ci_low'] * scale:.2f}", f"{c['ci_high'] * scale:.2f}", f"{c['n']:,}"]
    if c["verdict"] not in ("EQUIVALENT", "DIFFERENT") and c["n_needed"] is not None:
        out.append(f"{c['n_needed']:,}")
    return out


def rows_of(text: str) -> list[str]:
    """The table's rows (the lines that hold a verdict), in order."""
    return [line for line in text.splitlines() if re.search(r"\b(EQUIVALENT|DIFFERENT|SHIFT|INCONCLUSIVE)\b  ", line)]


def check_numbers(text: str, rows: list[dict]) -> None:
    assert "…" not in text and "..." not in text, text
    for c in rows:
        if c["gating"]:
            for number in numbers(c):
                assert number in text, (number, text)


def test_pass_lists_every_comparison_and_says_all_equivalent():
    rows = [comparison("hellaswag", m, cell, "EQUIVALENT", 0.0005 * i, 0.0041, 4000, 800 + i)
            for i, (m, cell) in enumerate((m, c) for m in ("acc", "acc_norm") for c in CELLS)]
    rows.append(comparison("hellaswag", "loglikelihood", "hf-bf16", "DIFFERENT", 0.2, 0.003, 16000, None,
                           gating=False, unit="nats"))
    text = render(document("PASS", "all 6 comparisons EQUIVALENT", rows))
    check_numbers(text, rows)
    assert len(rows_of(text)) == 6 and "loglikelihood" not in text  # gating comparisons only
    assert text.rstrip().splitlines()[-1] == "PASS: all 6 EQUIVALENT"
    assert "settle" in text and "800" not in text  # settled: nothing to settle
    assert max(len(line) for line in text.splitlines()) <= 80


def test_fail_puts_the_different_first_and_names_them():
    rows = [comparison("gsm8k", "exact_match", c, "EQUIVALENT", 0.001, 0.004, 1319, 500) for c in CELLS]
    rows.append(comparison("gsm8k", "exact_match", "vllm-fp16", "DIFFERENT", -0.0523, 0.011, 1319, 2100))
    rows.append(comparison("arc_easy", "acc", "vllm-fp16", "INCONCLUSIVE", -0.004, 0.012, 2376, 10418))
    text = render(document("FAIL", "1 of 5 comparisons DIFFERENT, INCONCLUSIVE 1", rows))
    check_numbers(text, rows)
    order = [re.search(r"EQUIVALENT|DIFFERENT|INCONCLUSIVE", line).group(0) for line in rows_of(text)]
    assert order == ["DIFFERENT", "INCONCLUSIVE", "EQUIVALENT", "EQUIVALENT", "EQUIVALENT"], text
    assert "-5.23 [-6.33, -4.13]" in text
    headline = " ".join(text.split("FAIL:", 1)[1].split())
    assert headline.startswith("1 of 5 comparisons DIFFERENT (gsm8k exact_match vllm-fp16)"), headline
    assert "evalparity drift" in headline


def test_inconclusive_names_the_docs_that_would_settle_it():
    rows = [comparison(t, m, c, "INCONCLUSIVE", 0.0833 * (i % 3 - 1), 0.18, 6, 14473 - 97 * i)
            for i, (t, m, c) in enumerate((t, m, c) for t in ("gsm8k", "gpqa") for m in ("acc", "exact_match")
                                          for c in CELLS[:2])]
    rows.append(comparison("gsm8k", "acc", "hf-bf16", "SHIFT", 0.5, 0.2, 6, None))
    text = render(document("INCONCLUSIVE", "SHIFT 1, INCONCLUSIVE 8 of 9 comparisons, none DIFFERENT", rows))
    check_numbers(text, rows)
    assert "SHIFT" in rows_of(text)[0] and all("INCONCLUSIVE" in r for r in rows_of(text)[1:])  # SHIFT first
    headline = " ".join(text.split("INCONCLUSIVE:", 1)[1].split())
    assert headline == ("9 of 9 comparisons unsettled (INCONCLUSIVE, SHIFT); about 14,473 docs per task would "
                        "settle them: raise --limit or drop it"), headline


def test_a_staged_run_says_where_each_task_stopped():
    rows = [comparison("hellaswag", "acc", c, "EQUIVALENT", 0.0, 0.0057, 2000, 523) for c in CELLS]
    rows.append(comparison("arc_challenge", "acc", "vllm-bf16", "INCONCLUSIVE", 0.0034, 0.011, 1172, 4410))
    staging = {"rule": "group-sequential", "off": None, "tasks": [
        {"task": "arc_challenge", "looks": [500, 1172], "stopped_at_look": 2, "of_looks": 2, "docs": 1172,
         "docs_available": 1172, "why": "its docs ran out"},
        {"task": "hellaswag", "looks": [500, 1000, 2000, 4000, 10042], "stopped_at_look": 3, "of_looks": 5,
         "docs": 2000, "docs_available": 10042, "why": "every gating comparison settled"}]}
    text = render(document("INCONCLUSIVE", "INCONCLUSIVE 1 of 4 comparisons, none DIFFERENT", rows, staging))
    check_numbers(text, rows)
    flat = " ".join(text.split())
    assert "staging: arc_challenge stopped at look 2 of 2 (1,172 of 1,172 docs): its docs ran out" in flat
    assert "staging: hellaswag stopped at look 3 of 5 (2,000 of 10,042 docs): every gating comparison settled" in flat
    assert "about 4,410 docs per task would settle them" in flat


def test_hostile_names_are_shown_as_written():
    name = "[red]x\x1b[2J"
    rows = [comparison(name, "acc", "vllm-fp32", "DIFFERENT", 0.07, 0.02, 400, 90),
            comparison("plain", "acc", "[bold]c[/]", "EQUIVALENT", 0.0, 0.01, 400, 90)]
    text = render(document("FAIL", "1 of 2 comparisons DIFFERENT", rows))
    assert "\x1b" not in text
    assert "[red]x\\x1b[2J" in text and "[bold]c[/]" in text
    check_numbers(text, rows)
    out = io.StringIO()  # on a terminal too: rich's own styles, never the name's escape
    print_verdicts(Console(file=out, width=80, force_terminal=True), document("FAIL", "r", rows))
    assert "\x1b[2J" not in out.getvalue() and "[red]x\\x1b[2J" in out.getvalue()


def test_numbers_stay_whole_when_names_are_long():
    rows = [comparison("mmlu_high_school_macroeconomics_and_more", "acc_norm", "vllm-bf16-tf32-repeat", "SHIFT",
                       -0.1235, 0.0455, 123456, 1234567)]
    rows[0]["level"], rows[0]["filter"] = "group", "strict-match"
    text = render(document("INCONCLUSIVE", "SHIFT 1 of 1 comparisons, none DIFFERENT", rows))
    check_numbers(text, rows)
    assert "-12.35 [-16.90, -7.80]" in text and "123,456" in text and "1,234,567" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_the_terminal_and_the_report_give_the_same_next_step():
    """One sentence for both (stats/next_step.py): the terminal's headline and the report's sign-off box."""
    import numpy as np
    import pandas as pd

    from evalparity.cli.verdict_table import headline
    from evalparity.report.sections import next_step as report_next_step

    rows = [{"task": "hellaswag", "metric": "acc", "cell": "vllm-bf16", "verdict": "INCONCLUSIVE", "n_needed": 4410},
            {"task": "hellaswag", "metric": "acc_norm", "cell": "vllm-bf16", "verdict": "EQUIVALENT",
             "n_needed": None}]
    terminal = headline({"sign_off": {"status": "INCONCLUSIVE", "reason": "r"}}, rows)[1]
    frame = pd.DataFrame(rows).astype({"n_needed": "Int64"}).astype({"n_needed": object})
    frame.loc[0, "n_needed"] = np.int64(4410)  # pandas hands the report numpy integers
    assert report_next_step("INCONCLUSIVE", frame) == terminal
    assert "about 4,410 docs per task would settle them" in terminal
    bad = [dict(rows[0], verdict="DIFFERENT")]
    assert report_next_step("FAIL", pd.DataFrame(bad)) == headline({"sign_off": {"status": "FAIL"}}, bad)[1]
    assert report_next_step("PASS", pd.DataFrame(rows)) is None
