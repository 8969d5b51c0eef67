"""Builds the report context from a run directory: reads ``stats/``, ``cells/*/cell.json``, ``spec.json``
and ``drift/``, draws the figures into ``report/figures/`` and hands each section's data to its builder
(``sections``)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pandas as pd

from evalparity.errors import EvalParityError
from evalparity.files import read_json
from evalparity.report import figures, sections
from evalparity.report.context import Drift, Figure, ReportContext
from evalparity.rundir import layout, records


def read_stats(run_dir: Path, name: str) -> pd.DataFrame:
    """``stats/<name>.parquet``, or an empty table when the statistics stage wrote none."""
    p = layout.stats_table(run_dir, name)
    return pd.read_parquet(p) if p.exists() else pd.DataFrame()


def cell_records(run_dir: Path, names: list[str]) -> dict[str, dict]:
    """The records of the cells the statistics used (``verdicts.json``'s ``cells``, verified by
    ``records.verify_run`` when they were computed), by cell name in sorted order."""
    recs = {n: records.read_cell(layout.cell_dir(run_dir, n)) for n in sorted(names)}
    return {n: r.to_json() for n, r in recs.items() if r is not None}


def load_drift(run_dir: Path) -> dict[str, dict]:
    """``evalparity drift``'s per-cell summaries (``drift/<cell>.json``), by cell; empty without a drift run."""
    return records.read_drift_summaries(layout.drift_dir(run_dir))


def figure(path: Path | None, alt: str) -> Figure | None:
    """A drawn PNG as the reports show it; None when it was not drawn (nothing to plot)."""
    if path is None or not path.exists():
        return None
    return Figure(alt, f"figures/{path.name}", base64.b64encode(path.read_bytes()).decode())


def _kept(fig, figdir: Path, name: str) -> Path | None:
    # A figure whose inputs are not here (a run directory copied without its per-sample tables) keeps
    # the PNG an earlier report stage drew, so the report can be rewritten from stats/ alone.
    path = figures.save(fig, figdir / name)
    return path if path is not None else (figdir / name if (figdir / name).exists() else None)


def _figures(run_dir: Path, figdir: Path, comp: pd.DataFrame, flipped: pd.DataFrame,
             colors: dict[str, str]) -> list[Figure]:
    shown, total = figures.score_rows(comp)
    which = (f"all {total} gating comparisons of proportions" if len(shown) == total else
             f"{len(shown)} of {total} gating comparisons of proportions, the ones not EQUIVALENT first")
    drawn = [
        figure(figures.save(figures.draw_score_differences(comp), figdir / "score_differences.png"),
               f"Score differences with the CIs their verdicts were decided on ({which})"),
        figure(_kept(figures.draw_delta_distributions(read_stats(run_dir, "delta_histogram"), colors), figdir,
                     "delta_loglikelihood.png"), "Distribution of |Δ loglikelihood| per cell"),
        figure(_kept(figures.draw_flips_vs_margin(flipped, colors), figdir, "flips_vs_margin.png"),
               "Flipped decisions against the reference margin"),
        figure(_kept(figures.draw_first_divergence(read_stats(run_dir, "first_divergence"), colors), figdir,
                     "first_divergence.png"), "First divergence of greedy generations"),
    ]
    return [f for f in drawn if f is not None]


def _drift(run_dir: Path, figdir: Path, colors: dict[str, str]) -> Drift | None:
    summaries = load_drift(run_dir)
    if not summaries:
        return None
    try:
        drawn = [figure(figures.save(figures.draw_drift_by_layer(summaries, colors), figdir / "drift_by_layer.png"),
                        "Relative error and cosine distance by layer"),
                 figure(figures.save(figures.draw_first_drifting_layer(summaries, colors),
                                     figdir / "first_drifting_layer.png"), "Where each cell starts to drift"),
                 figure(figures.save(figures.draw_drift_by_position(summaries, colors),
                                     figdir / "drift_by_position.png"), "Final-layer drift by token position")]
        return sections.drift(summaries, [f for f in drawn if f is not None])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        # read_drift_summaries checks a summary's cell and reference; the measurements are drift.worker's, and
        # one of another shape (hand-written, or another version's) is refused here, never a traceback
        raise EvalParityError(f"{layout.drift_dir(run_dir)}: a drift summary evalparity cannot read "
                              f"({type(err).__name__}: {str(err)[:60]}): rerun `evalparity drift` to redo it, or "
                              "move drift/ out of the run") from None


def build_context(run_dir: Path, figdir: Path) -> ReportContext:
    """The report of ``run_dir``, figures drawn into ``figdir`` (``report/figures``)."""
    verdicts = json.loads(layout.verdicts_file(run_dir).read_text())
    comp = read_stats(run_dir, "comparisons")
    flipped = read_stats(run_dir, "flipped_samples")
    spec = read_json(layout.spec_file(run_dir)) or {}
    metas = cell_records(run_dir, verdicts.get("cells") or [])
    # every cell the figures may draw: the run's, and any that only the drift stage probed
    colors = figures.cell_colors([*(verdicts.get("cells") or []), *load_drift(run_dir)])
    return ReportContext(
        model=str(verdicts.get("model") or "a comparison of lm-eval outputs"),
        sign_off=sections.sign_off(verdicts, comp),
        method=sections.method(verdicts["options"]),
        verdicts=sections.verdict_matrix(comp),
        setup=sections.setup(spec, metas),
        paired=sections.paired(comp),
        compared=sections.compared(comp, metas),
        figures=_figures(run_dir, figdir, comp, flipped, colors),
        deltas=sections.deltas(read_stats(run_dir, "deltas")),
        flips=sections.flips(read_stats(run_dir, "flips")),
        generations=sections.generations(read_stats(run_dir, "generations")),
        noise_floor=sections.noise_floor(comp),
        drift=_drift(run_dir, figdir, colors),
        flipped_samples=sections.flipped_samples(flipped),
    )
