"""The report's figures, read from the matplotlib figure objects (labels, ticks, colours, extents), not by eye:
no label cut at the edge, gsm8k's two filters told apart, the margin band visible on any axis, a legend for
the verdict colours, every comparison drawn (or the number left out said), one colour per cell in every
figure, whole-number ticks on counts."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import Collection  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from evalparity.report import figures  # noqa: E402
from evalparity.report.formatting import TONES  # noqa: E402

CELLS = ["hf-bf16", "hf-fp16", "vllm-fp32", "vllm-bf16", "vllm-fp16"]
VERDICTS = ["EQUIVALENT", "DIFFERENT", "SHIFT", "INCONCLUSIVE"]


def comparisons(n: int, *, half_width: float, margin: float = 0.01, task: str = "hellaswag",
                filters: tuple[str, ...] = ("none",), verdicts: list[str] | None = None) -> pd.DataFrame:
    """``n`` gating comparisons of a proportion per filter, as ``stats/comparisons.parquet`` holds them:
    effects within the interval, intervals ``half_width`` (a fraction) either side."""
    rng = np.random.default_rng(0)
    rows = []
    for filt in filters:
        for i in range(n):
            e = float(rng.uniform(-half_width / 2, half_width / 2))
            rows.append({"task": task if n <= len(CELLS) else f"{task}_{i // len(CELLS):02d}", "metric": "exact_match",
                         "filter": filt, "cell": CELLS[i % len(CELLS)], "gating": True, "unit": "pp", "effect": e,
                         "ci_low": e - half_width, "ci_high": e + half_width, "margin": margin,
                         "margin_low": -margin, "margin_high": margin,
                         "verdict": (verdicts or VERDICTS)[i % len(verdicts or VERDICTS)]})
    return pd.DataFrame(rows)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def texts(fig) -> list[Text]:
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def outside(fig) -> list[str]:
    """What of ``fig`` reaches past its edge once drawn (what a saved PNG would cut): the texts by name, tick
    labels through the drawn extent (ticks beyond an axis's limits exist as texts but are not drawn)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    ticks = {id(t) for ax in fig.axes for t in [*ax.get_xticklabels(which="both"), *ax.get_yticklabels(which="both")]}
    out = []
    for t in texts(fig):
        b = t.get_window_extent(renderer)
        if id(t) not in ticks and (b.x0 < box.x0 - 1 or b.x1 > box.x1 + 1 or b.y0 < box.y0 - 1 or b.y1 > box.y1 + 1):
            out.append(t.get_text())
    drawn = fig.get_tightbbox(renderer)  # inches, every drawn artist
    if drawn.x0 < -0.01 or drawn.y0 < -0.01 or drawn.x1 > fig.get_figwidth() + 0.01 or (
            drawn.y1 > fig.get_figheight() + 0.01):
        out.append(f"the drawing spans {drawn} in a {fig.get_figwidth()} x {fig.get_figheight()} in figure")
    return out


def score_axes(fig):
    return fig.axes[0]


def delta_histogram(cells: list[str], counts: int = 3) -> pd.DataFrame:
    edges = np.logspace(-9, 1, 11)
    return pd.DataFrame([{"kind": "cross", "reference": "hf-fp32", "cell": c, "bin_low": lo, "bin_high": hi,
                          "count": (i + j) % counts} for j, c in enumerate(cells)
                         for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:]))])


def flipped(cells: list[str]) -> pd.DataFrame:
    return pd.DataFrame([{"cell": c, "ref_margin": 0.01 * (i + 1), "max_abs_delta": 0.02 * (i + 1)}
                         for i, c in enumerate(cells)])


def divergences(cells: list[str]) -> pd.DataFrame:
    return pd.DataFrame([{"kind": "cross", "cell": c, "position": p} for i, c in enumerate(cells) for p in (i, i + 2)])


def drift(cells: list[str]) -> dict[str, dict]:
    return {c: {"layers": [{"layer": k, "rel_error": 1e-4 * (k + 1), "cosine": 1 - 1e-6 * (k + 1)} for k in range(4)],
                "by_position": [{"bucket": b, "rel_error": 1e-4 * (b + 1)} for b in range(3)],
                "threshold": 1e-3, "first_layer_over_threshold": 2 if i else None,
                "first_drifting_by_prompt": {"by_entry": {"1": i, "2": 3}, "never": 5 - i}}
            for i, c in enumerate(cells)}


def all_figures(colors: dict[str, str], cells: list[str]):
    return [figures.draw_score_differences(comparisons(len(cells), half_width=0.4)),
            figures.draw_delta_distributions(delta_histogram(cells), colors),
            figures.draw_flips_vs_margin(flipped(cells), colors),
            figures.draw_first_divergence(divergences(cells), colors),
            figures.draw_drift_by_layer(drift(cells), colors),
            figures.draw_first_drifting_layer(drift(cells), colors),
            figures.draw_drift_by_position(drift(cells), colors)]


def test_first_drifting_layer_draws_the_share_of_prompts_drifted_by_each_entry():
    fig = figures.draw_first_drifting_layer(drift(["vllm-fp32", "vllm-bf16"]), figures.cell_colors(CELLS))
    lines = {visible_label(line): line for line in fig.axes[0].get_lines() if not visible_label(line).startswith("_")}
    # vllm-bf16 (i = 1): 1 prompt first over at entry 1, 3 at entry 2, 4 never, of 8
    assert list(lines["vllm-bf16"].get_ydata()) == [0, 1 / 8, 4 / 8, 4 / 8]
    assert list(lines["vllm-fp32"].get_ydata()) == [0, 0, 3 / 8, 3 / 8]
    assert figures.draw_first_drifting_layer({"x": {"layers": []}}, {}) is None  # a summary from before


def visible_label(line) -> str:
    return line.get_label()


def test_no_label_is_cut_at_the_figure_edge():
    """Was: the score figure's x-label ran past the right edge ('…decid'), the long y labels pushing it out."""
    cells = CELLS
    long_task = comparisons(len(cells), half_width=0.4, task="mmlu_high_school_european_history_and_more")
    for fig in [figures.draw_score_differences(long_task), *all_figures(figures.cell_colors(cells), cells)]:
        assert not outside(fig), outside(fig)


def overlaps(fig) -> list[tuple[str, str]]:
    """Pairs of texts (titles, axis labels, legend entries; not tick labels) drawn over each other."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ticks = {id(t) for ax in fig.axes for t in [*ax.get_xticklabels(which="both"), *ax.get_yticklabels(which="both")]}
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts(fig) if id(t) not in ticks]
    return [(a, b) for i, (a, box_a) in enumerate(boxes) for b, box_b in boxes[i + 1:] if box_a.overlaps(box_b)]


def test_no_texts_drawn_over_each_other():
    """Was, in a draft: the verdict legend drawn over the x-label."""
    cells = CELLS
    long_task = comparisons(16, half_width=0.4, task="gsm8k", filters=("strict-match", "flexible-extract"))
    for fig in [figures.draw_score_differences(long_task), *all_figures(figures.cell_colors(cells), cells)]:
        assert not overlaps(fig), overlaps(fig)


def test_the_check_for_cut_labels_can_fail():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_xlabel("a label far longer than this small figure is wide, so it runs past both edges")
    assert outside(fig)


def test_tick_labels_are_plain_text():
    """Was: log axes printed '$\\mathdefault{10^{-9}}$' (mathtext is off so a '$' in a task name stays
    text) and a label's line break printed as '\\n'."""
    cells = CELLS[:2]
    for fig in all_figures(figures.cell_colors(cells), cells):
        fig.canvas.draw()
        for t in texts(fig):
            assert "$" not in t.get_text() and "\\n" not in t.get_text(), t.get_text()


def test_gsm8k_filters_get_distinct_labels():
    comp = comparisons(2, half_width=0.4, task="gsm8k", filters=("strict-match", "flexible-extract"))
    ax = score_axes(figures.draw_score_differences(comp))
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == len(comp) == len(set(labels)), labels
    assert any("(strict-match)" in x for x in labels) and any("(flexible-extract)" in x for x in labels)


@pytest.mark.parametrize("half_width", [0.4, 0.005, 0.02])
def test_margin_band_is_visible_on_any_axis(half_width):
    """Was: the ±1 pp band was a sliver on a ±40 pp axis. Now it takes a tenth of the axis or more, whether the
    intervals dwarf the margin (±40 pp), sit inside it (±0.5 pp) or are a little wider (±2 pp); and no
    interval is clipped."""
    comp = comparisons(5, half_width=half_width, margin=0.01)
    ax = score_axes(figures.draw_score_differences(comp))
    (x_low, _), (x_high, _) = ax.transData.transform([(-1.0, 0), (1.0, 0)])  # ±margin in pp
    assert (x_high - x_low) / ax.bbox.width >= 0.1
    lo, hi = ax.get_xlim()
    assert lo <= 100 * comp["ci_low"].min() and hi >= 100 * comp["ci_high"].max()


def test_legend_names_the_verdict_colours_and_points_use_them():
    comp = comparisons(8, half_width=0.1)
    fig = figures.draw_score_differences(comp)
    legend = fig.legends[0]
    entries = {t.get_text(): h for t, h in zip(legend.get_texts(), legend.legend_handles)}
    for verdict in VERDICTS:
        assert to_hex(entries[verdict].get_color()) == TONES[verdict].text
    assert any(label.startswith("margin") for label in entries)
    points = score_axes(fig).collections[-1]  # the scatter, drawn over the error bars
    assert [to_hex(c) for c in points.get_facecolors()] == [TONES[v].text for v in comp["verdict"]]


def test_every_comparison_is_drawn():
    """Was: head(40) dropped comparisons silently."""
    comp = comparisons(57, half_width=0.1)
    fig = figures.draw_score_differences(comp)
    assert len(score_axes(fig).get_yticklabels()) == 57
    assert "shown" not in score_axes(fig).get_title()


def test_comparisons_beyond_the_cap_are_counted_and_the_unsettled_kept():
    n = figures.MAX_ROWS + 7
    comp = comparisons(n, half_width=0.1, verdicts=["EQUIVALENT"] * 9 + ["DIFFERENT"])
    fig = figures.draw_score_differences(comp)
    labels = [t.get_text() for t in score_axes(fig).get_yticklabels()]
    assert len(labels) == figures.MAX_ROWS
    assert f"{figures.MAX_ROWS} of {n} shown" in score_axes(fig).get_title()
    kept, total = figures.score_rows(comp)
    assert total == n and (kept["verdict"] == "DIFFERENT").sum() == (comp["verdict"] == "DIFFERENT").sum()


def _handle_colour(handle) -> str:
    if isinstance(handle, Line2D):
        return to_hex(handle.get_color())
    if isinstance(handle, Collection):  # a scatter's
        return to_hex(handle.get_facecolor()[0])
    return to_hex(handle.get_edgecolor())  # a step histogram's outline


def _colour_by_cell(fig) -> dict[str, str]:
    """Each legend entry's colour, keyed by the cell its label starts with."""
    out = {}
    for legend in [*fig.legends, *[ax.get_legend() for ax in fig.axes if ax.get_legend()]]:
        for text, handle in zip(legend.get_texts(), legend.legend_handles):
            out[text.get_text().split(" ")[0]] = _handle_colour(handle)
    return out


def test_a_cell_has_one_colour_in_every_figure():
    """Was: each figure coloured its cells in the order it met them, so vllm-fp16 changed colour between
    figures. The figures below meet the cells in different orders and subsets."""
    run_cells = CELLS
    colors = figures.cell_colors(run_cells)
    drawn = [figures.draw_delta_distributions(delta_histogram(run_cells[::-1]), colors),
             figures.draw_flips_vs_margin(flipped(run_cells[2:]), colors),
             figures.draw_first_divergence(divergences(run_cells[1:4]), colors),
             figures.draw_drift_by_layer(drift(["vllm-fp16", "vllm-bf16"]), colors),
             figures.draw_first_drifting_layer(drift(["hf-bf16", "vllm-fp16"]), colors),
             figures.draw_drift_by_position(drift(["vllm-bf16", "vllm-fp16", "hf-bf16"]), colors)]
    seen: dict[str, set[str]] = {}
    for fig in drawn:
        for cell, color in _colour_by_cell(fig).items():
            if cell in colors:
                seen.setdefault(cell, set()).add(color)
    assert set(seen) == set(run_cells)
    assert all(colours == {colors[cell]} for cell, colours in seen.items()), seen
    assert len(set(colors.values())) == len(run_cells)


def test_counts_have_whole_number_ticks():
    """Was: fractional ticks (0.5 generations) on count axes with few counts."""
    cells = CELLS[:2]
    colors = figures.cell_colors(cells)
    for fig in (figures.draw_delta_distributions(delta_histogram(cells, counts=3), colors),
                figures.draw_first_divergence(divergences(cells), colors)):
        ax = fig.axes[0]
        lo, hi = ax.get_ylim()
        ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks


def test_nothing_to_plot_draws_nothing():
    colors = figures.cell_colors(CELLS)
    assert figures.draw_score_differences(comparisons(0, half_width=0.1)) is None
    assert figures.draw_delta_distributions(pd.DataFrame(), colors) is None
    assert figures.draw_drift_by_layer({}, colors) is None
    assert figures.save(None, Path("/nonexistent/x.png")) is None
