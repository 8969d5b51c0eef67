"""The report's figures (matplotlib, Agg backend: no display needed).

Each figure is drawn by a ``draw_*`` function that returns the matplotlib figure (None when there is
nothing to plot), so the tests can read its labels, ticks and colours, and saved by ``save``. Colours mean
one thing everywhere: a verdict has its colour from ``formatting.TONES`` (the same as in the report's
tables), a cell has one colour in every figure (``cell_colors``, from the run's cells, not from the order in
which a figure happens to meet them).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from evalparity.files import atomic_target
from evalparity.printable import visible
from evalparity.report.formatting import TONES, metric_label

# Cell colours, Okabe–Ito's colour-blind-safe set (its yellow, too light on white, left out) and four more.
CELL_PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#882255",
                "#999933", "#44aa99", "#6699cc", "#aa4499")
NO_VERDICT = "#57606a"  # a comparison whose verdict has no colour of its own
MAX_ROWS = 150  # score comparisons drawn at most; the title says how many more there are
ZOOM = 8  # beyond this many margins of data, the score axis is logarithmic outside ±margin (symlog)
ROW_INCHES, BASE_INCHES = 0.3, 2.0  # the score figure's height per comparison, and for its title and axis
DPI = 110


def _plt():
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False  # a '$' in a task name is text, not TeX to parse (or fail on)
    import matplotlib.pyplot as plt

    return plt


def cell_colors(cells: Iterable[str]) -> dict[str, str]:
    """One colour per cell for every figure, by the cell's place among the run's cells (sorted)."""
    return {c: CELL_PALETTE[i % len(CELL_PALETTE)] for i, c in enumerate(sorted(set(cells)))}


def _color(colors: dict[str, str], cell: str) -> str:
    return colors.get(cell) or CELL_PALETTE[len(colors) % len(CELL_PALETTE)]


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _power_of_ten(x: float, _pos=None) -> str:
    """A log axis's tick as plain text ('10⁻⁹'): matplotlib's own labels are mathtext, which the figures turn
    off so that a '$' in a task name stays text."""
    if x <= 0:
        return ""
    exp = np.log10(x)
    return f"10{str(int(round(exp))).translate(_SUPERSCRIPT)}" if abs(exp - round(exp)) < 1e-9 else ""


def _log_ticks(axis) -> None:
    from matplotlib.ticker import FuncFormatter, NullFormatter  # heavy: matplotlib (loaded by _plt by now)

    axis.set_major_formatter(FuncFormatter(_power_of_ten))
    axis.set_minor_formatter(NullFormatter())


def _plain_ticks(axis) -> None:
    """Tick labels as plain numbers ('-10', '0', '1'), for the symlog score axis."""
    from matplotlib.ticker import FuncFormatter  # heavy: matplotlib (loaded by _plt by now)

    axis.set_major_formatter(FuncFormatter(lambda x, _pos=None: f"{x:g}"))


def _integer_counts(axis) -> None:
    """Ticks on a count axis at whole numbers only."""
    from matplotlib.ticker import MaxNLocator  # heavy: matplotlib (loaded by _plt by now)

    axis.set_major_locator(MaxNLocator(integer=True))


def draw_delta_distributions(hist: pd.DataFrame, colors: dict[str, str]):
    """|Δ loglikelihood| per compared pair (log scale), pooled over tasks, from ``stats/delta_histogram``."""
    if hist is None or hist.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    for (kind, ref, cell), g in hist.groupby(["kind", "reference", "cell"], sort=True):
        g = g.sort_values("bin_low")
        edges = np.append(g["bin_low"].to_numpy(), g["bin_high"].iloc[-1])
        label = visible(f"{cell}{'' if kind == 'cross' else f' vs {ref}'} (n={int(g['count'].sum())})")
        ax.stairs(g["count"].to_numpy(), edges, linewidth=1.6, label=label, color=_color(colors, cell),
                  linestyle="-" if kind == "cross" else "--")
    ax.set_xscale("log")
    _log_ticks(ax.xaxis)
    refs = visible(", ".join(sorted(set(hist.loc[hist["kind"] == "cross", "reference"]))) or "base")
    ax.set_xlabel(f"|Δ loglikelihood| vs {refs}\n(nats per request; 10⁻⁹ = identical)")
    ax.set_ylabel("requests")
    _integer_counts(ax.yaxis)
    ax.legend(fontsize=8)
    ax.set_title("Loglikelihood drift per request")
    return fig


def draw_flips_vs_margin(flipped: pd.DataFrame, colors: dict[str, str]):
    if flipped is None or flipped.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    for name, g in flipped.groupby("cell", sort=True):
        ax.scatter(g["ref_margin"].clip(lower=1e-6), g["max_abs_delta"].clip(lower=1e-6), s=14, label=visible(name),
                   alpha=0.7, color=_color(colors, name))
    lim = [1e-6, max(1.0, float(flipped[["ref_margin", "max_abs_delta"]].max().max()) * 1.5)]
    ax.plot(lim, lim, color="grey", linestyle="--", linewidth=1, label="|Δ| = margin")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _log_ticks(ax.xaxis)
    _log_ticks(ax.yaxis)
    ax.set_xlabel("reference margin between its top two choices (nats)")
    ax.set_ylabel("largest |Δ| among\nthe doc's choices")
    ax.set_title("Flipped decisions: near-ties (left) or large drift (top)")
    ax.legend(fontsize=8)
    return fig


def score_rows(comp: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The gating comparisons of proportions that the score figure draws, and how many there are in all: at
    most ``MAX_ROWS``, those not EQUIVALENT kept first when some must be left out."""
    c = comp[(comp["gating"]) & (comp["unit"] == "pp")] if not comp.empty else comp
    if len(c) <= MAX_ROWS:
        return c, len(c)
    keep = c.assign(_eq=c["verdict"] == "EQUIVALENT").sort_values("_eq", kind="stable").head(MAX_ROWS)
    return c.loc[sorted(keep.index)], len(c)


def _margin_band(c: pd.DataFrame) -> tuple[float, float]:
    """The proportion margin in pp (low, high; one end infinite under --direction worse)."""
    low = c["margin_low"].iloc[0] if "margin_low" in c else -c["margin"].iloc[0]
    high = c["margin_high"].iloc[0] if "margin_high" in c else c["margin"].iloc[0]
    return 100 * float(low), 100 * float(high)


def draw_score_differences(comp: pd.DataFrame):
    """Paired differences with the CIs their verdicts were decided on, one row per gating comparison of a
    proportion, coloured by verdict, over the margin band. When the intervals dwarf the margin (±40 pp
    against ±1 pp) the axis is linear inside ±margin and logarithmic beyond, so the band stays visible."""
    c, total = score_rows(comp)
    if c.empty:
        return None
    plt = _plt()
    from matplotlib.lines import Line2D  # heavy: matplotlib (loaded by _plt by now)
    from matplotlib.patches import Patch

    labels = [visible(f"{r.task} {metric_label(r.metric, r.filter)} · {r.cell}"
                      + (f" vs {r.reference}" if getattr(r, "kind", "cross") == "pair" else ""))
              for r in c.itertuples()]
    fig, ax = plt.subplots(figsize=(8, ROW_INCHES * len(c) + BASE_INCHES), layout="constrained")
    y = np.arange(len(c))
    effect = 100 * c["effect"].to_numpy(dtype=float)
    lo = 100 * c["ci_low"].clip(lower=-1).to_numpy(dtype=float)
    hi = 100 * c["ci_high"].clip(upper=1).to_numpy(dtype=float)
    lo, hi = np.where(np.isnan(lo), effect, lo), np.where(np.isnan(hi), effect, hi)  # no interval: the point
    colors = [TONES[v].text if v in TONES else NO_VERDICT for v in c["verdict"]]
    xerr = np.vstack([np.clip(effect - lo, 0, None), np.clip(hi - effect, 0, None)])  # 2 x n: below, above
    ax.errorbar(effect, y, xerr=xerr, fmt="none",
                ecolor="#6e7781", capsize=3, zorder=2)
    ax.scatter(effect, y, c=colors, zorder=3, s=28)
    m_low, m_high = _margin_band(c)
    m = min(abs(x) for x in (m_low, m_high) if np.isfinite(x))
    extent = float(np.nanmax(np.abs(np.concatenate([lo, hi, effect, [m]]))))
    if extent > ZOOM * m:
        ax.set_xscale("symlog", linthresh=m, linscale=1)
        _plain_ticks(ax.xaxis)
        scale = f"linear within ±{m:g} pp, logarithmic beyond"
    else:
        scale = "linear"
    ax.set_xlim(-1.15 * extent, 1.15 * extent)
    band_low, band_high = max(m_low, -1.15 * extent), min(m_high, 1.15 * extent)
    ax.axvspan(band_low, band_high, color=TONES["EQUIVALENT"].background, zorder=0)
    for edge in (m_low, m_high):
        if np.isfinite(edge):
            ax.axvline(edge, color=TONES["EQUIVALENT"].text, linestyle=":", linewidth=1, zorder=1)
    ax.axvline(0, color="black", linewidth=0.8, zorder=1)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_ylim(len(c) - 0.5, -0.5)
    # centred on the figure, not under the axes: long task labels push the axes right, and a label centred
    # under them would run past the figure's edge
    fig.supxlabel(f"cell − reference, percentage points ({scale});\neach bar is the CI its verdict was decided on",
                  fontsize=10)
    shown = [v for v in TONES if v in set(c["verdict"])]
    margin_text = f"margin {m_low:g} pp and up" if not np.isfinite(m_high) else f"margin ±{m:g} pp"
    handles = [Patch(facecolor=TONES["EQUIVALENT"].background, edgecolor="#6e7781", label=margin_text)] + [
        Line2D([], [], marker="o", linestyle="none", color=TONES[v].text, label=v) for v in shown]
    fig.legend(handles=handles, loc="outside upper center", ncols=len(handles), fontsize=8, frameon=False)
    left = "" if total == len(c) else f" ({len(c)} of {total} shown; all are in the paired statistics table)"
    ax.set_title(f"Score differences{left}")
    return fig


def draw_first_divergence(divs: pd.DataFrame, colors: dict[str, str]):
    if divs is None or divs.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
    for name, g in divs[divs["kind"] == "cross"].groupby("cell", sort=True):
        ax.hist(g["position"], bins=range(0, int(divs["position"].max()) + 2), histtype="step", linewidth=1.6,
                label=visible(f"{name} ({len(g)} diverged)"), color=_color(colors, name))
    ax.set_xlabel("first generated token that differs from the reference")
    ax.set_ylabel("generations")
    _integer_counts(ax.xaxis)
    _integer_counts(ax.yaxis)
    ax.legend(fontsize=8)
    ax.set_title("Where greedy generations diverge")
    return fig


def draw_drift_by_layer(drift: dict[str, dict], colors: dict[str, str]):
    if not drift:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), layout="constrained")
    for cell, s in sorted(drift.items()):
        layers = [x["layer"] for x in s["layers"]]
        color = _color(colors, cell)
        axes[0].plot(layers, [max(x["rel_error"], 1e-12) for x in s["layers"]], marker="o", ms=3, label=visible(cell),
                     color=color)
        axes[1].plot(layers, [1 - x["cosine"] + 1e-16 for x in s["layers"]], marker="o", ms=3, color=color)
    for ax in axes:
        ax.set_yscale("log")
        _log_ticks(ax.yaxis)
        _integer_counts(ax.xaxis)
    axes[0].set_xlabel("hidden-state entry\n(0 = embeddings, last = final norm)")
    axes[1].set_xlabel("hidden-state entry")
    axes[0].set_ylabel("relative error vs reference")
    axes[1].set_ylabel("1 − cosine similarity")
    axes[0].legend(fontsize=7)
    fig.suptitle("Drift by layer")
    return fig


def draw_first_drifting_layer(drift: dict[str, dict], colors: dict[str, str]):
    """Where each cell starts to drift: per hidden-state entry, the share of prompts whose relative error
    first passes the threshold at or before it (a step curve per cell), its level at the right edge being the
    share that drift anywhere; the cell's first entry over the threshold over all prompts is marked. Cells
    whose summary predates per-prompt counts are left out; None when none has them."""
    rows = {c: s for c, s in drift.items() if (s.get("first_drifting_by_prompt") or {}).get("by_entry") is not None}
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
    for cell, s in sorted(rows.items()):
        fd = s["first_drifting_by_prompt"]
        entries = [x["layer"] for x in s["layers"]]
        total = sum(fd["by_entry"].values()) + fd["never"]
        if not total or not entries:
            continue
        share, acc = [], 0
        for e in entries:
            acc += fd["by_entry"].get(str(e), 0)
            share.append(acc / total)
        color = _color(colors, cell)
        ax.step(entries, share, where="post", label=visible(cell), color=color)
        first = s.get("first_layer_over_threshold")
        if first is not None and first in entries:
            ax.plot([first], [share[entries.index(first)]], marker="o", ms=5, color=color)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("hidden-state entry (0 = embeddings, last = final norm)")
    ax.set_ylabel("share of prompts drifted")
    _integer_counts(ax.xaxis)
    any_s = next(iter(rows.values()))
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"First layer over the threshold ({any_s.get('threshold', 1e-3):g}), prompt by prompt; "
                 "dot: all prompts together", fontsize=9)
    return fig


def draw_drift_by_position(drift: dict[str, dict], colors: dict[str, str]):
    if not drift:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
    for cell, s in sorted(drift.items()):
        b = s["by_position"]
        ax.plot([x["bucket"] for x in b], [max(x["rel_error"], 1e-12) for x in b], marker="o", label=visible(cell),
                color=_color(colors, cell))
    ax.set_yscale("log")
    _log_ticks(ax.yaxis)
    ax.set_xlabel("token position")
    ax.set_ylabel("final-layer relative error")
    ax.legend(fontsize=7)
    ax.set_title("Drift by position")
    return fig


def save(fig, path: Path) -> Path | None:
    """Write ``fig`` as a PNG at ``path`` (atomically) and close it; None when there was no figure. The
    saved area is the drawing's own extent, so no label is cut at the edge."""
    if fig is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    import matplotlib.pyplot as plt  # heavy: matplotlib (loaded by _plt by now)

    try:
        with atomic_target(path) as tmp:
            # the temp name has no .png for matplotlib to go by
            fig.savefig(tmp, dpi=DPI, format="png", bbox_inches="tight", pad_inches=0.1)
    finally:
        plt.close(fig)
    return path
