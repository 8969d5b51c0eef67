"""The statistics stage: read the cells' per-sample tables, compare every cell with the reference, decide.

Reads ``cells/*/samples.parquet`` (only cells whose ``cell.json`` says ok), writes ``stats/``:
``comparisons.parquet`` (one row per task x metric x cell, with its verdict), ``deltas.parquet``,
``flips.parquet``, ``flipped_samples.parquet``, ``generations.parquet``, ``first_divergence.parquet`` and
``verdicts.json`` (the documented schema the report and CI read).

Which comparisons gate the sign-off: for a task inside a group (an mmlu subject), the group's pooled
comparison gates and the members are shown under it; for a plain task, the task's own. Score metrics gate;
loglikelihood shifts gate only with ``gate_logprobs``. Noise-floor comparisons (a cell against its repeat
at another batch size) never gate: they are the yardstick the cross-backend numbers are read against.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from statsmodels.stats.weightstats import DescrStatsW

from evalparity import samples as samples_mod
from evalparity.cells import read_cell_json, write_json
from evalparity.errors import EXIT_DIFFERENT, EXIT_INCONCLUSIVE, EvalParityError
from evalparity.stats import deltas, flips, generations, multiplicity, paired, power, verdict
from evalparity.stats.options import StatsOptions  # noqa: F401 - part of this module's interface

SCHEMA = "evalparity.verdicts/1"


@dataclass(frozen=True)
class StatsSummary:
    sign_off: str
    reason: str
    comparisons: pd.DataFrame

    def exit_code(self, fail_on_inconclusive: bool = True) -> int:
        if self.sign_off == verdict.PASS:
            return 0
        if self.sign_off == verdict.FAIL:
            return EXIT_DIFFERENT
        return EXIT_INCONCLUSIVE if fail_on_inconclusive else 0


# ---------------------------------------------------------------- loading
def load_cells(run_dir: Path) -> tuple[dict[str, pd.DataFrame], dict[str, dict]]:
    tables, metas = {}, {}
    cells_dir = run_dir / "cells"
    for d in sorted(cells_dir.iterdir()) if cells_dir.is_dir() else []:
        if not d.is_dir() or d.name.startswith(".") or d.name.endswith(".failed"):
            continue
        meta = read_cell_json(d)
        if not meta or meta.get("status") != "ok" or not (d / "samples.parquet").exists():
            continue
        tables[d.name] = samples_mod.read_table(d / "samples.parquet")
        metas[d.name] = meta
    return tables, metas


def _pairs(metas: dict[str, dict], reference: str) -> list[tuple[str, str, str]]:
    """(kind, reference cell, cell): the cross-cell comparisons (these gate), the noise-floor ones (a cell
    against its repeat at another batch size) and the precision-mode ones (a TF32 cell against its true-fp32
    base and against the reference)."""
    out = [("cross", reference, c) for c in metas if c != reference and not metas[c].get("tag")]
    for c, m in metas.items():
        base = m.get("base_cell")
        if m.get("tf32"):
            if base in metas:
                out.append(("precision_mode", base, c))
            if reference != base:
                out.append(("precision_mode", reference, c))
        elif m.get("tag") and base in metas:
            out.append(("noise_floor", base, c))
    return out


def _doc_frame(ref: pd.DataFrame, cell: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, filter, doc): metric columns of both cells side by side."""
    mcols = samples_mod.metric_columns(ref)
    keep = ["task", "group", "filter", "doc_id", *mcols]
    r = ref[ref["choice"] == 0][keep]
    c = cell[cell["choice"] == 0][["task", "filter", "doc_id", *[m for m in mcols if m in cell]]]
    return r.merge(c, on=["task", "filter", "doc_id"], suffixes=("_ref", "_cell"))


# ---------------------------------------------------------------- one score comparison
def _score_row(x_ref: np.ndarray, x_cell: np.ndarray, opts: StatsOptions, clusters=None) -> dict:
    ok = np.isfinite(x_ref) & np.isfinite(x_cell)
    n_nonfinite = int(np.sum(np.isfinite(x_ref) & ~np.isfinite(x_cell)))
    x_ref, x_cell = x_ref[ok], x_cell[ok]
    clusters = clusters[ok] if clusters is not None else None
    n = int(x_ref.size)
    base = {"n": n, "ref_score": float(x_ref.mean()) if n else math.nan,
            "cell_score": float(x_cell.mean()) if n else math.nan, "n_nonfinite": n_nonfinite}
    if n == 0:
        return base | {"effect": math.nan, "ci_low": math.nan, "ci_high": math.nan, "p_diff": 1.0, "p_equiv": 1.0,
                       "method": "none", "mdd": math.nan, "n_needed": math.nan, "discordant": 0}
    binary = np.all(np.isin(x_ref, (0.0, 1.0))) and np.all(np.isin(x_cell, (0.0, 1.0)))
    if binary:
        use_clusters = clusters if clusters is not None and len(np.unique(clusters)) > 1 else None
        r = paired.paired_binary(x_ref, x_cell, margin=opts.margin, alpha=opts.alpha, clusters=use_clusters)
        psi = r.discordant / n
        return base | {"effect": r.statistic, "ci_low": r.ci.low, "ci_high": r.ci.high, "p_diff": r.pvalue,
                       "p_equiv": r.tost_pvalue, "method": f"McNemar exact + TOST ({r.method})",
                       "mdd": power.minimum_detectable_difference(n, psi, alpha=opts.alpha),
                       "n_needed": power.n_for_equivalence(opts.margin, max(psi, 1.0 / n), alpha=opts.alpha),
                       "discordant": r.discordant, "ref_only": r.ref_only, "cell_only": r.cell_only}
    d = x_cell - x_ref
    if n < 2 or np.all(d == d[0]):
        exact = n >= 2
        return base | {"effect": float(d.mean()), "ci_low": float(d.mean()) if exact else -math.inf,
                       "ci_high": float(d.mean()) if exact else math.inf, "p_diff": 1.0 if d[0] == 0 else 0.0,
                       "p_equiv": 0.0 if exact and abs(d[0]) < opts.margin else 1.0,
                       "method": "all differences equal", "mdd": math.nan, "n_needed": math.nan,
                       "discordant": int(np.sum(d != 0))}
    ds = DescrStatsW(d)
    lo, hi = ds.tconfint_mean(alpha=opts.alpha)
    sd = float(d.std(ddof=1))
    from scipy import stats as sps

    z = sps.norm.ppf(1 - opts.alpha / 2) + sps.norm.ppf(0.8)
    z_equiv = sps.norm.ppf(1 - opts.alpha) + sps.norm.ppf(0.9)  # TOST at 80% power when Δ = 0
    return base | {"effect": float(d.mean()), "ci_low": float(lo), "ci_high": float(hi),
                   "p_diff": float(ds.ttest_mean(0)[1]), "p_equiv": float(ds.ttost_mean(-opts.margin, opts.margin)[0]),
                   "method": "paired t + TOST (continuous metric)", "mdd": float(z * sd / math.sqrt(n)),
                   "n_needed": float(math.ceil((z_equiv * sd / opts.margin) ** 2)),
                   "discordant": int(np.sum(d != 0))}


# ---------------------------------------------------------------- the whole stage
def compute(run_dir: Path, opts: StatsOptions) -> StatsSummary:
    tables, metas = load_cells(run_dir)
    if opts.reference not in tables:
        have = ", ".join(tables) or "none"
        raise EvalParityError(f"reference cell {opts.reference} has no finished results in {run_dir} "
                              f"(finished: {have}): pass --reference with one of them")
    if len(tables) < 2:
        raise EvalParityError(f"only one finished cell in {run_dir}: a comparison needs two")
    samples_mod.check_alignment({opts.reference: tables[opts.reference],
                                 **{k: v for k, v in tables.items() if k != opts.reference}})
    rows, delta_rows, flip_rows, flipped, gen_rows, divs, hist_rows = [], [], [], [], [], [], []
    for kind, ref_name, cell_name in _pairs(metas, opts.reference):
        ref, cell = tables[ref_name], tables[cell_name]
        docs = _doc_frame(ref, cell)
        common = {"kind": kind, "reference": ref_name, "cell": cell_name}
        for (task, filt), g in docs.groupby(["task", "filter"], sort=True):
            group = g["group"].iloc[0]
            for m in samples_mod.metric_columns(ref):
                if f"{m}_ref" not in g or g[f"{m}_ref"].isna().all():
                    continue
                r = _score_row(g[f"{m}_ref"].to_numpy(float), g[f"{m}_cell"].to_numpy(float), opts)
                rows.append(common | {"task": task, "group": group, "level": "task", "filter": filt,
                                      "metric": m[len(samples_mod.METRIC_PREFIX):]} | r)
        for (group, filt), g in docs.groupby(["group", "filter"], sort=True):
            if g["task"].nunique() < 2:
                continue
            for m in samples_mod.metric_columns(ref):
                if g[f"{m}_ref"].isna().all():
                    continue
                clusters = g["task"].to_numpy() if opts.cluster else None
                r = _score_row(g[f"{m}_ref"].to_numpy(float), g[f"{m}_cell"].to_numpy(float), opts, clusters)
                rows.append(common | {"task": group, "group": group, "level": "group", "filter": filt,
                                      "metric": m[len(samples_mod.METRIC_PREFIX):]} | r)
        _loglikelihood_stats(ref, cell, common, opts, rows, delta_rows, flip_rows, flipped, hist_rows)
        _generation_stats(ref, cell, common, gen_rows, divs)
    comp = pd.DataFrame(rows)
    if comp.empty:
        raise EvalParityError("no metric could be compared: the cells share no task with per-sample metrics")
    comp = _gating(comp, opts)
    comp = _adjust_and_decide(comp, opts)
    status, reason = verdict.sign_off(comp.loc[comp["gating"], "verdict"].tolist())
    out = run_dir / "stats"
    out.mkdir(exist_ok=True)
    samples_mod.write_table(comp, out / "comparisons.parquet")
    for name, data in (("deltas", delta_rows), ("flips", flip_rows), ("generations", gen_rows),
                       ("delta_histogram", hist_rows)):
        samples_mod.write_table(pd.DataFrame(data), out / f"{name}.parquet")
    samples_mod.write_table(pd.concat(flipped) if flipped else pd.DataFrame(), out / "flipped_samples.parquet")
    samples_mod.write_table(pd.DataFrame(divs, columns=["kind", "reference", "cell", "task", "position"]),
                            out / "first_divergence.parquet")
    summary = StatsSummary(status, reason, comp)
    write_json(out / "verdicts.json", verdicts_document(run_dir, comp, opts, summary, metas))
    return summary


def _loglikelihood_stats(ref, cell, common, opts, rows, delta_rows, flip_rows, flipped, hist_rows) -> None:
    ll_types = ("multiple_choice", "loglikelihood", "loglikelihood_rolling")
    r = ref[ref["output_type"].isin(ll_types) & (ref["filter"] == "none")]
    c = cell[cell["output_type"].isin(ll_types) & (cell["filter"] == "none")]
    if r.empty:
        return
    j = r.merge(c[["task", "filter", "doc_id", "choice", "loglikelihood"]],
                on=["task", "filter", "doc_id", "choice"], suffixes=("_ref", "_cell"))
    hist_rows += _delta_histogram(j, common)
    for task, g in j.groupby("task", sort=True):
        d = deltas.loglikelihood_deltas(g["loglikelihood_ref"].to_numpy(), g["loglikelihood_cell"].to_numpy(),
                                        tolerance=opts.ll_tolerance, alpha=opts.alpha,
                                        n_resamples=opts.n_resamples, seed=opts.seed)
        delta_rows.append(common | {"task": task, "group": g["group"].iloc[0]} | _delta_dict(d))
        rows.append(common | {
            "task": task, "group": g["group"].iloc[0], "level": "task", "filter": "none", "metric": "loglikelihood",
            "n": d.n, "ref_score": float(np.nanmean(g["loglikelihood_ref"])),
            "cell_score": float(np.nanmean(g["loglikelihood_cell"])), "n_nonfinite": d.n_nonfinite_cell,
            "effect": d.statistic, "ci_low": d.ci.low, "ci_high": d.ci.high, "p_diff": d.pvalue,
            "p_equiv": d.tost_pvalue, "method": "Wilcoxon + bootstrap CI + TOST (mean Δ loglikelihood, nats)",
            "mdd": math.nan, "n_needed": math.nan, "discordant": d.n - d.n_exact_zero})
        if g["output_type"].iloc[0] != "multiple_choice":
            continue
        choices = g.rename(columns={"loglikelihood_ref": "ref_score", "loglikelihood_cell": "cell_score"})
        f = flips.decision_flips(choices[["doc_id", "choice", "ref_score", "cell_score", "gold"]])
        flip_rows.append(common | {"task": task, "group": g["group"].iloc[0], "n_docs": f.n_docs,
                                   "observed": f.statistic, "expected": f.expected, "pvalue": f.pvalue})
        if len(f.flipped):
            detail = f.flipped.copy()
            ctx = g[g["choice"] == 0].set_index("doc_id")["context"]
            conts = g.groupby("doc_id")["continuation"].apply(list)
            detail["context"] = detail["doc_id"].map(ctx)
            detail["choices"] = detail["doc_id"].map(conts)
            for k, v in common.items():
                detail[k] = v
            detail["task"] = task
            flipped.append(detail)


def _delta_histogram(j: pd.DataFrame, common: dict) -> list[dict]:
    """|Δ loglikelihood| counts for one pair's joined requests, pooled over its tasks (the report's histogram)."""
    counts = deltas.abs_delta_histogram(j["loglikelihood_ref"].to_numpy(), j["loglikelihood_cell"].to_numpy())
    if counts.sum() == 0:
        return []
    edges = deltas.HIST_EDGES
    return [common | {"bin_low": float(edges[i]), "bin_high": float(edges[i + 1]), "count": int(c)}
            for i, c in enumerate(counts)]


def _delta_dict(d: deltas.DeltaResult) -> dict:
    out = {k: v for k, v in asdict(d).items() if k != "ci"}
    out["mean"] = out.pop("statistic")
    out["wilcoxon_p"] = out.pop("pvalue")
    out["ci_low"], out["ci_high"] = d.ci.low, d.ci.high
    return out


def _generation_stats(ref, cell, common, gen_rows, divs) -> None:
    r = ref[(ref["output_type"] == "generate_until")]
    if r.empty:
        return
    c = cell[(cell["output_type"] == "generate_until")]
    j = r.merge(c[["task", "filter", "doc_id", "generated_text", "generated_ids"]], on=["task", "filter", "doc_id"],
                suffixes=("_ref", "_cell"))
    # Generations do not depend on the filter; take one filter per task.
    for task, g in j.groupby("task", sort=True):
        g = g[g["filter"] == g["filter"].iloc[0]]
        to_list = lambda s: [None if v is None or (isinstance(v, float) and math.isnan(v)) else list(v) for v in s]  # noqa: E731
        res = generations.compare_generations(to_list(g["generated_ids_ref"]), to_list(g["generated_ids_cell"]),
                                              g["generated_text_ref"].fillna("").tolist(),
                                              g["generated_text_cell"].fillna("").tolist())
        gen_rows.append(common | {"task": task, "n": res.n, "identical_ids": res.statistic,
                                  "identical_text": res.identical_text, "n_without_ids": res.n_without_ids,
                                  "n_diverged": int(res.first_divergence.size),
                                  "median_first_divergence": res.median_first_divergence})
        divs.extend((common["kind"], common["reference"], common["cell"], task, int(p)) for p in res.first_divergence)


def _gating(comp: pd.DataFrame, opts: StatsOptions) -> pd.DataFrame:
    in_group = comp["group"] != comp["task"]
    grouped_tasks = set(comp.loc[(comp["level"] == "group"), "group"])
    member_of_gated_group = (comp["level"] == "task") & in_group & comp["group"].isin(grouped_tasks)
    is_ll = comp["metric"] == "loglikelihood"
    comp["gating"] = (comp["kind"] == "cross") & ~member_of_gated_group & (~is_ll | opts.gate_logprobs)
    return comp


def _adjust_and_decide(comp: pd.DataFrame, opts: StatsOptions) -> pd.DataFrame:
    comp = comp.copy()
    comp["p_diff_adj"] = np.nan
    comp["p_equiv_adj"] = np.nan
    for mask in (comp["gating"], ~comp["gating"]):
        if mask.any():
            comp.loc[mask, "p_diff_adj"] = multiplicity.adjust(comp.loc[mask, "p_diff"].to_numpy(), opts.multiple)
            comp.loc[mask, "p_equiv_adj"] = multiplicity.adjust(comp.loc[mask, "p_equiv"].to_numpy(), opts.multiple)
    verdicts, reasons, margins = [], [], []
    for row in comp.itertuples(index=False):
        is_ll = row.metric == "loglikelihood"
        margin = opts.ll_tolerance if is_ll else opts.margin
        v, why = verdict.decide(effect=row.effect, ci_low=row.ci_low, ci_high=row.ci_high,
                                p_diff_adj=row.p_diff_adj, p_equiv_adj=row.p_equiv_adj, margin=margin,
                                alpha=opts.alpha, n=int(row.n), unit="nats" if is_ll else "pp",
                                mdd=None if is_ll else row.mdd, n_needed=None if is_ll else row.n_needed,
                                n_nonfinite=int(row.n_nonfinite))
        verdicts.append(v)
        reasons.append(why)
        margins.append(margin)
    comp["verdict"], comp["reason"], comp["margin"] = verdicts, reasons, margins
    return comp


def _clean(x):
    if isinstance(x, (np.floating, float)):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.bool_,)):
        return bool(x)
    return x


def verdicts_document(run_dir: Path, comp: pd.DataFrame, opts: StatsOptions, summary: StatsSummary,
                      metas: dict[str, dict]) -> dict:
    """The ``verdicts.json`` schema (documented in the README): one record per comparison + sign-off."""
    spec_path = run_dir / "spec.json"
    spec = json.loads(spec_path.read_text()) if spec_path.exists() else {}
    records = []
    for i, r in enumerate(comp.to_dict("records")):
        records.append({
            "id": i, "kind": r["kind"], "task": r["task"], "group": r["group"], "level": r["level"],
            "filter": r["filter"], "metric": r["metric"], "cell": r["cell"], "reference": r["reference"],
            "n": _clean(r["n"]), "reference_score": _clean(r["ref_score"]), "cell_score": _clean(r["cell_score"]),
            "effect": _clean(r["effect"]), "ci": [_clean(r["ci_low"]), _clean(r["ci_high"])],
            "ci_level": 1 - opts.alpha, "p_value": _clean(r["p_diff"]), "p_value_adjusted": _clean(r["p_diff_adj"]),
            "p_equivalence": _clean(r["p_equiv"]), "p_equivalence_adjusted": _clean(r["p_equiv_adj"]),
            "margin": _clean(r["margin"]), "method": r["method"], "verdict": r["verdict"], "reason": r["reason"],
            "gating": bool(r["gating"]),
        })
    return {
        "schema": SCHEMA,
        "model": spec.get("model"),
        "tasks": spec.get("tasks"),
        "cells": sorted(metas),
        "options": asdict(opts),
        "sign_off": {"status": summary.sign_off, "reason": summary.reason,
                     "exit_code": summary.exit_code(True),
                     "exit_code_if_inconclusive_allowed": summary.exit_code(False)},
        "comparisons": records,
    }
