"""The report's figures, as PNG files (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from evalparity.files import atomic_target
from evalparity.printable import visible


def _plt():
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False  # a '$' in a task name is text, not TeX to parse (or fail on)
    import matplotlib.pyplot as plt

    return plt


def delta_distributions(hist: pd.DataFrame, out: Path) -> Path | None:
    """|Δ loglikelihood| per compared pair (log scale), pooled over tasks, from ``stats/delta_histogram``."""
    if hist is None or hist.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for (kind, ref, cell), g in hist.groupby(["kind", "reference", "cell"], sort=False):
        g = g.sort_values("bin_low")
        edges = np.append(g["bin_low"].to_numpy(), g["bin_high"].iloc[-1])
        label = f"{cell}{'' if kind == 'cross' else f' vs {ref}'} (n={int(g['count'].sum())})"
        ax.stairs(g["count"].to_numpy(), edges, linewidth=1.6, label=label)
    ax.set_xscale("log")
    refs = sorted(set(hist.loc[hist["kind"] == "cross", "reference"]))
    ax.set_xlabel(f"|Δ loglikelihood| vs {', '.join(refs) or 'base'} (nats per request; 1e-9 = identical)")
    ax.set_ylabel("requests")
    ax.legend(fontsize=8)
    ax.set_title("Loglikelihood drift per request")
    return _save(fig, out / "delta_loglikelihood.png")


def flips_vs_margin(flipped: pd.DataFrame, out: Path) -> Path | None:
    if flipped is None or flipped.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name, g in flipped.groupby("cell"):
        ax.scatter(g["ref_margin"].clip(lower=1e-6), g["max_abs_delta"].clip(lower=1e-6), s=14, label=name, alpha=0.7)
    lim = [1e-6, max(1.0, float(flipped[["ref_margin", "max_abs_delta"]].max().max()) * 1.5)]
    ax.plot(lim, lim, color="grey", linestyle="--", linewidth=1, label="|Δ| = margin")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("reference margin between its top two choices (nats)")
    ax.set_ylabel("largest |Δ| among the doc's choices")
    ax.set_title("Flipped decisions: near-ties (left) or large drift (top)")
    ax.legend(fontsize=8)
    return _save(fig, out / "flips_vs_margin.png")


def score_differences(comp: pd.DataFrame, out: Path) -> Path | None:
    """Paired differences with their CIs, for the gating score comparisons."""
    c = comp[(comp["gating"]) & (comp["unit"] == "pp")].copy()
    if c.empty:
        return None
    plt = _plt()
    c = c.head(40)
    labels = [visible(f"{r.task} {r.metric} · {r.cell}") for r in c.itertuples()]
    fig, ax = plt.subplots(figsize=(7.5, 0.35 * len(c) + 1.4))
    y = np.arange(len(c))
    colors = c["verdict"].map({"EQUIVALENT": "#1a7f37", "DIFFERENT": "#cf222e", "INCONCLUSIVE": "#bf8700",
                               "SHIFT": "#9a6700"}).fillna("#57606a")
    lo = (c["effect"] - c["ci_low"].clip(lower=-1)).clip(lower=0)
    hi = (c["ci_high"].clip(upper=1) - c["effect"]).clip(lower=0)
    ax.errorbar(100 * c["effect"], y, xerr=[100 * lo, 100 * hi], fmt="none", ecolor="grey", capsize=3)
    ax.scatter(100 * c["effect"], y, c=list(colors), zorder=3)
    m = 100 * float(c["margin"].iloc[0])
    ax.axvspan(-m, m, color="#1a7f37", alpha=0.08, label=f"±{m:g} pp margin")
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("cell − reference (percentage points); each bar is the CI its verdict was decided on")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Score differences")
    return _save(fig, out / "score_differences.png")


def first_divergence(divs: pd.DataFrame, out: Path) -> Path | None:
    if divs is None or divs.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for name, g in divs[divs["kind"] == "cross"].groupby("cell"):
        ax.hist(g["position"], bins=range(0, int(divs["position"].max()) + 2), histtype="step", linewidth=1.6,
                label=f"{name} ({len(g)} diverged)")
    ax.set_xlabel("first generated token that differs from the reference")
    ax.set_ylabel("generations")
    ax.legend(fontsize=8)
    ax.set_title("Where greedy generations diverge")
    return _save(fig, out / "first_divergence.png")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    import matplotlib.pyplot as plt  # heavy: matplotlib (loaded by _plt by now)

    try:
        with atomic_target(path) as tmp:
            fig.savefig(tmp, dpi=110, format="png")  # the temp name has no .png for matplotlib to go by
    finally:
        plt.close(fig)
    return path


def drift_by_layer(drift: dict[str, dict], out: Path) -> Path | None:
    if not drift:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for cell, s in drift.items():
        layers = [x["layer"] for x in s["layers"]]
        axes[0].plot(layers, [max(x["rel_error"], 1e-12) for x in s["layers"]], marker="o", ms=3, label=cell)
        axes[1].plot(layers, [1 - x["cosine"] + 1e-16 for x in s["layers"]], marker="o", ms=3, label=cell)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[0].set_xlabel("hidden-state entry (0 = embeddings, last = final norm)")
    axes[1].set_xlabel("hidden-state entry")
    axes[0].set_ylabel("relative error vs reference")
    axes[1].set_ylabel("1 − cosine similarity")
    axes[0].legend(fontsize=7)
    fig.suptitle("Drift by layer")
    return _save(fig, out / "drift_by_layer.png")


def drift_by_position(drift: dict[str, dict], out: Path) -> Path | None:
    if not drift:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for cell, s in drift.items():
        b = s["by_position"]
        ax.plot([x["bucket"] for x in b], [max(x["rel_error"], 1e-12) for x in b], marker="o", label=cell)
    ax.set_yscale("log")
    ax.set_xlabel("token position")
    ax.set_ylabel("final-layer relative error")
    ax.legend(fontsize=7)
    ax.set_title("Drift by position")
    return _save(fig, out / "drift_by_position.png")
