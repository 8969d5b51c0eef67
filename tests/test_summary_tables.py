"""The cells and scores tables a run prints after its cells fit a CI log's 80 columns: one line per cell, no
score cut (issue 27: the aggregate column took 4 lines per cell and printed "acc_norm=0.7…")."""

from __future__ import annotations

import io

from rich.console import Console

from evalparity.matrix import CellOutcome, scores_table, summary_table

CELLS = ["vllm-fp32", "vllm-bf16", "vllm-fp16", "hf-fp32", "hf-bf16", "hf-fp16"]


def _outcomes() -> list[CellOutcome]:
    out = []
    for i, name in enumerate(CELLS):
        meta = {"load_s": 31.4 + i, "eval_s": 112.25, "wall_s": 150.0, "peak_rss_gib": 3.71,
                "aggregate": {"hellaswag": {"acc,none": 0.41234 + i / 1000, "acc_norm,none": 0.52871,
                                            "acc_stderr,none": 0.004},
                              "gsm8k": {"exact_match,strict-match": 0.3125, "exact_match,flexible-extract": 0.3375}}}
        out.append(CellOutcome(name, "ok", 150.0, meta))
    return out


def _render(table, width: int = 80) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(table)
    return buf.getvalue()


def test_one_line_per_cell_at_80_columns():
    text = _render(summary_table(_outcomes()))
    rows = [line for line in text.splitlines() if any(line.strip("│ ").startswith(c) for c in CELLS)]
    assert len(rows) == len(CELLS), text  # each cell's row is one line
    assert all(len(line) <= 80 for line in text.splitlines()) and "…" not in text, text


def test_every_score_whole_with_six_cells_at_80_columns():
    text = _render(scores_table(_outcomes()))
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines()), text
    for i in range(len(CELLS)):
        assert f"{0.41234 + i / 1000:.3f}" in text
    assert text.count("0.529") == len(CELLS) and "strict-match" in text and "flexible-extract" in text
    assert "stderr" not in text  # headline metrics only
    rows = [line for line in text.splitlines() if "hellaswag" in line]
    assert len(rows) == 2  # acc and acc_norm, one line each


def test_no_scores_no_table():
    assert scores_table([CellOutcome("hf-fp32", "failed", 1.0, {"error": "boom"})]) is None
