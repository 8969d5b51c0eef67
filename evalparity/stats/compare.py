"""The statistics stage: read the cells' per-sample tables, compare every cell with the reference, decide.

Reads ``cells/*/samples.parquet`` and writes ``stats/``: ``comparisons.parquet`` (one ``record.Comparison``
per task × metric × cell), ``deltas.parquet``, ``flips.parquet``, ``flipped_samples.parquet``,
``generations.parquet``, ``first_divergence.parquet`` and ``verdicts.json`` (the documented schema the
report and CI read).

Which comparisons gate the sign-off: every cell against the reference ("cross") and each ``--compare A:B``
pair (B against A, "pair"); for a task inside a group (an mmlu subject), the group's pooled comparison gates
and the members are shown under it; for a plain task, the task's own. Every record says what its cell
changes against its reference (``differs``). Proportion metrics
gate with the proportion margin; other metrics only with a margin given for them; loglikelihoods only with
``gate_logprobs``. Noise-floor comparisons (a cell against its repeat at another batch size) never gate and
get no verdict: they are the yardstick that the cross-backend discordance is tested against.

Every cell the run's spec names must be readable: a cell that failed, is missing, or whose table cannot be
read makes the sign-off INCOMPLETE (exit 5), named in the verdicts and the report, whatever the others say.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from evalparity import samples as samples_mod
from evalparity import variants
from evalparity.errors import EXIT_CELL_FAILED, EXIT_DIFFERENT, EXIT_INCONCLUSIVE, EvalParityError
from evalparity.files import read_json, write_json
from evalparity.rundir import layout, records
from evalparity.staging import staging_of
from evalparity.stats import deltas, flips, generations, inference, multiplicity, paired, power, staged, verdict
from evalparity.stats.options import StatsOptions, check_metric_names
from evalparity.stats.record import SCHEMA, Comparison, columns

__all__ = ["StatsOptions", "StatsSummary", "compute", "SCHEMA"]


@dataclass(frozen=True)
class StatsSummary:
    sign_off: str
    reason: str
    comparisons: pd.DataFrame
    incomplete: tuple[tuple[str, str], ...] = ()  # (cell, why) for every named cell that could not be read
    staging: staged.Trace | None = None  # a staged run's stops, per task (None: every doc was scored)

    def exit_code(self, fail_on_inconclusive: bool = True) -> int:
        if self.sign_off == verdict.INCOMPLETE:
            return EXIT_CELL_FAILED
        if self.sign_off == verdict.PASS:
            return 0
        if self.sign_off == verdict.FAIL:
            return EXIT_DIFFERENT
        return EXIT_INCONCLUSIVE if fail_on_inconclusive else 0


# ---------------------------------------------------------------- loading
def load_cells(run_dir: Path) -> tuple[dict[str, pd.DataFrame], dict[str, dict], list[tuple[str, str]]]:
    """The verified cells' tables and records, and (cell, why) for each named cell that a rerun would finish.

    ``records.verify_run`` has checked the spec, each record, its identity and its table's seal (refusing in
    one line what a rerun would not fix); here, with the rows in hand, each table must also hold the row
    count its seal names, only its own cell's rows, and each (task, filter, doc, choice) once."""
    run = records.verify_run(run_dir)
    tables, metas = {}, {}
    for name, rec in run.cells.items():
        path = layout.table(layout.cell_dir(run_dir, name))
        table = samples_mod.read_table(path)
        fix = f"remove {path.parent} and rerun the same command to redo that cell"
        cells_in = sorted(map(str, table["cell"].unique())) if "cell" in table else []
        if len(table) and cells_in != [name]:
            raise EvalParityError(f"{path}: its rows are {', '.join(cells_in) or 'no cell'}'s, not {name}'s: {fix}")
        if rec.table is not None and len(table) != rec.table.n_rows:
            raise EvalParityError(f"{path}: {len(table)} rows, its record says {rec.table.n_rows}: {fix}")
        dup = table.duplicated(samples_mod.KEY)
        if dup.any():
            row = table.loc[dup, samples_mod.KEY].iloc[0].to_dict()
            raise EvalParityError(f"{path}: {int(dup.sum())} repeated rows (first: {row}); a per-sample table holds "
                                  f"each task, filter, doc and choice once: {fix}")
        tables[name], metas[name] = table, rec.to_json()
    return tables, metas, list(run.incomplete)


def _pairs(metas: dict[str, dict], reference: str,
           asked: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str, str]]:
    """(kind, reference cell, cell): the cross-cell comparisons (these gate), the ``--compare A:B`` ones
    (B against A: "pair", gating too), the noise-floor ones (a cell against its repeat at another batch
    size) and the precision-mode ones (a TF32 cell against its true-fp32 base and against the reference).
    A pair whose cell has no table (a failed cell: the sign-off is INCOMPLETE) is left out, as its cross
    comparison is."""
    out = [("cross", reference, c) for c in metas if c != reference and not metas[c].get("tag")]
    out += [("pair", a, b) for a, b in asked if a in metas and b in metas]
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
    mcols = metric_union(ref, cell)
    r = ref[ref["choice"] == 0].reindex(columns=["task", "group", "filter", "doc_id", *mcols])
    c = cell[cell["choice"] == 0].reindex(columns=["task", "filter", "doc_id", *mcols])
    return r.merge(c, on=["task", "filter", "doc_id"], suffixes=("_ref", "_cell"))


def metric_union(ref: pd.DataFrame, cell: pd.DataFrame) -> list[str]:
    """The metric columns of either table: a metric that one cell lost entirely is a comparison whose
    values are missing on that side (non-finite on one side: DIFFERENT), never a silently skipped metric."""
    return list(dict.fromkeys([*samples_mod.metric_columns(ref), *samples_mod.metric_columns(cell)]))


# ---------------------------------------------------------------- one comparison, before the family
@dataclass
class Pending:
    """A comparison whose tests are computed but whose verdict waits for its family's adjustment."""

    meta: dict
    n: int
    reference_score: float
    cell_score: float
    estimand: str
    unit: str
    inf: inference.PairedInference | None
    margin: verdict.Margin | None
    tests: verdict.Tests | None
    shift_test: str
    method: str
    counts: dict = field(default_factory=dict)
    mdd: float | None = None
    n_needed: float | None = None
    n_needed_at_zero: float | None = None
    discordance: pd.Series | None = None  # per doc: 1 where the two cells' scores differ (binary metrics)
    # per doc (binary metrics): -1 right only in the reference, +1 only in the cell, 0 the same or neither
    # has a value, staged.ONE_SIDED a value on one side only; what the staged rule counts at each look
    signed: pd.Series | None = None
    problem: str | None = None  # a disagreement no statistic is needed for (DIFFERENT, no interval printed)


# The kinds of comparison that gate: every cell against the reference, and the pairs asked with --compare.
GATING_KINDS = ("cross", "pair")

# Metrics lm-eval defines per doc as 0 or 1. A value outside {0, 1} for one of these is a disagreement between
# the cells, not a reason to treat the metric as continuous (which would take it out of the gate).
PROPORTION_METRICS = {"acc", "acc_norm", "acc_bytes", "acc_mutual_info", "exact_match", "em"}


def score_comparison(meta: dict, x_ref: np.ndarray, x_cell: np.ndarray, opts: StatsOptions,
                     clusters: np.ndarray | None = None, doc_keys: pd.Index | None = None) -> Pending:
    """A per-doc metric: binary scores through the paired binary tests, other metrics through paired t."""
    metric = meta["metric"]
    fin_r, fin_c = np.isfinite(x_ref), np.isfinite(x_cell)
    ok = fin_r & fin_c
    both = np.where(ok, np.sign(np.where(ok, x_cell, 0.0) - np.where(ok, x_ref, 0.0)), 0.0)
    signed_all = np.where(fin_r ^ fin_c, staged.ONE_SIDED, both).astype(np.int8)
    counts = {"n_nonfinite_reference": int(np.sum(~fin_r & fin_c)), "n_nonfinite_cell": int(np.sum(fin_r & ~fin_c)),
              "n_nonfinite_both": int(np.sum(~fin_r & ~fin_c))}
    x_ref, x_cell = x_ref[ok], x_cell[ok]
    clusters = clusters[ok] if clusters is not None else None
    n = int(x_ref.size)
    binary = n > 0 and bool(np.all(np.isin(x_ref, (0.0, 1.0))) and np.all(np.isin(x_cell, (0.0, 1.0))))
    known = metric in PROPORTION_METRICS
    proportion = binary or known or n == 0
    off = (int(np.sum(~np.isin(x_ref, (0.0, 1.0)))), int(np.sum(~np.isin(x_cell, (0.0, 1.0))))) if known else (0, 0)
    m = opts.margin_for(metric, proportion=proportion)
    unit = "pp" if proportion else ""
    margin = verdict.Margin.around_zero(m, opts.direction, unit) if m is not None else None
    base = dict(meta=meta, n=n, reference_score=float(x_ref.mean()) if n else math.nan,
                cell_score=float(x_cell.mean()) if n else math.nan, estimand=f"Δ {metric}", unit=unit,
                counts=counts)
    if n == 0:
        return Pending(**base, inf=None, margin=margin, tests=None, shift_test="", method="none")
    if known and not binary:
        return Pending(**base, inf=None, margin=margin, tests=None, shift_test="", method="none",
                       problem=f"{metric} is 0 or 1 per doc, but {off[0]} reference and {off[1]} cell values are "
                               "neither: the cells disagree on what the metric is")
    use_clusters = clusters if clusters is not None and len(np.unique(clusters)) > 1 else None
    d = x_cell - x_ref
    keys = doc_keys[ok] if doc_keys is not None else None
    if binary:
        r = paired.paired_binary(x_ref, x_cell, margin=m or opts.margin, alpha=opts.alpha, clusters=use_clusters)
        inf, psi = r.inference, r.discordant / n
        counts |= {"discordant": r.discordant, "reference_only": r.ref_only, "cell_only": r.cell_only}
        shift = ("McNemar exact" if opts.direction == "both" else "Tango score, one-sided (a drop)") \
            if use_clusters is None else "stricter of cluster score t and McNemar exact"
        mdd = power.minimum_detectable_difference(n, psi, alpha=opts.alpha)
        var = max(psi, 1.0 / n) - r.statistic ** 2
        method = f"{inf.method} ({'exact' if r.discordant == 0 else 'score'} CI)"
        disc = pd.Series((d != 0).astype(np.int8), index=keys) if keys is not None else None
        signed = pd.Series(signed_all, index=doc_keys) if doc_keys is not None else None
    else:
        unit_range = bool(np.all((x_ref >= 0) & (x_ref <= 1)) and np.all((x_cell >= 0) & (x_cell <= 1)))
        if n >= 2 and not np.any(d) and unit_range:
            # No doc changed on a metric in [0, 1]: |Δ| ≤ P(a doc changes), the exact bound binary scores use.
            inf = inference.ZeroDiscordance(n)
        elif use_clusters is not None:
            inf = inference.StricterOf(inference.cluster_inference(d, use_clusters, bounds=(-math.inf, math.inf)),
                                       inference.mean_inference(d))
        else:
            inf = inference.mean_inference(d)
        shift = "paired t" if use_clusters is None else "stricter of cluster score t and paired t"
        sd = float(d.std(ddof=1)) if n > 1 else math.nan
        spread = n > 1 and sd > 0  # without spread there is no variance to plan an n with
        mdd = power.minimum_detectable_shift(n, sd, alpha=opts.alpha) if spread else math.nan
        var = sd * sd if spread else math.nan
        method = inf.method
        counts |= {"discordant": int(np.sum(d != 0))}
        disc = signed = None
    p_shift = None
    if binary and use_clusters is None and margin is not None and margin.sides == 2:
        p_shift = paired.mcnemar_exact_pvalue(counts["reference_only"], counts["cell_only"])
    tests = verdict.tests(inf, margin, p_shift=p_shift) if margin is not None else None
    n_needed = n_at_zero = None
    if margin is not None and math.isfinite(var):
        low = margin.sides == 1  # --direction worse: only the distance above −m matters
        cc = inference.CONTINUITY if binary else 0.0
        n_needed = power.n_to_settle(margin.size, var, inf.estimate, alpha=opts.alpha, one_sided_low=low,
                                     continuity=cc)
        n_at_zero = power.n_to_settle(margin.size, var + inf.estimate ** 2 if binary else var, 0.0, alpha=opts.alpha,
                                      one_sided_low=low, continuity=cc)
    return Pending(**base, inf=inf, margin=margin, tests=tests, shift_test=shift, method=method, mdd=mdd,
                   n_needed=n_needed, n_needed_at_zero=n_at_zero, discordance=disc, signed=signed)


def loglikelihood_comparison(meta: dict, d: deltas.DeltaResult, ref_mean: float, cell_mean: float,
                             opts: StatsOptions) -> Pending:
    """Mean |Δ loglikelihood| per request against ``--ll-tolerance`` (see ``deltas``)."""
    margin = verdict.Margin.below(opts.ll_tolerance, "nats")
    counts = {"n_nonfinite_reference": d.n_nonfinite_ref, "n_nonfinite_cell": d.n_nonfinite_cell,
              "n_nonfinite_both": d.n_nonfinite_both, "discordant": d.n - d.n_exact_zero}
    base = dict(meta=meta, n=d.n, reference_score=ref_mean, cell_score=cell_mean,
                estimand="mean |Δ loglikelihood| per request", unit="nats", counts=counts)
    if d.n == 0:
        return Pending(**base, inf=None, margin=margin, tests=None, shift_test="", method="none")
    tests = verdict.tests(d.abs_inference, margin, p_shift=d.inference.pvalue_zero())
    return Pending(**base, inf=d.abs_inference, margin=margin, tests=tests,
                   shift_test=f"mean Δ ({d.inference.method})", method=d.abs_inference.method)


# ---------------------------------------------------------------- the family and the verdicts
def decide_all(pending: list[Pending], gating: np.ndarray, opts: StatsOptions) -> list[Comparison]:
    """Adjust each family (gating cross comparisons; the other comparisons with a margin) and decide."""
    k = len(pending)
    p_beyond = np.array([p.tests.p_beyond if p.tests else np.nan for p in pending])
    p_shift = np.array([p.tests.p_shift if p.tests else np.nan for p in pending])
    family = np.array([p.meta["kind"] != "noise_floor" and p.tests is not None for p in pending])
    adj_b, adj_s = np.full(k, np.nan), np.full(k, np.nan)
    thr_b, thr_s = np.full(k, np.nan), np.full(k, np.nan)
    for mask in (family & gating, family & ~gating):
        if mask.any():
            adj_b[mask] = multiplicity.adjust(p_beyond[mask], opts.multiple)
            adj_s[mask] = multiplicity.adjust(p_shift[mask], opts.multiple)
            thr_b[mask] = multiplicity.rejection_thresholds(p_beyond[mask], opts.alpha, opts.multiple)
            thr_s[mask] = multiplicity.rejection_thresholds(p_shift[mask], opts.alpha, opts.multiple)
    out = []
    for i, p in enumerate(pending):
        out.append(_finish(i, p, bool(gating[i]), adj_b[i], adj_s[i], thr_b[i], thr_s[i], opts))
    return out


def _finish(i: int, p: Pending, gating: bool, adj_b: float, adj_s: float, thr_b: float, thr_s: float,
            opts: StatsOptions) -> Comparison:
    nan = math.nan
    m = p.margin
    rec = dict(id=i, **p.meta, estimand=p.estimand, unit=p.unit, n=p.n, reference_score=p.reference_score,
               cell_score=p.cell_score, effect=p.inf.estimate if p.inf else nan, margin=m.size if m else None,
               margin_low=m.low if m else None, margin_high=m.high if m else None,
               direction=opts.direction if p.unit != "nats" else "below", p_equivalence=nan, p_beyond=nan,
               p_beyond_adjusted=adj_b, p_shift=nan, p_shift_adjusted=adj_s, shift_test=p.shift_test,
               method=p.method, gating=gating, mdd=p.mdd, n_needed=p.n_needed, **p.counts)
    if p.tests is not None:
        rec |= {"p_equivalence": p.tests.p_equivalence, "p_beyond": p.tests.p_beyond, "p_shift": p.tests.p_shift}
    one_sided = p.counts.get("n_nonfinite_reference", 0) + p.counts.get("n_nonfinite_cell", 0)
    if p.meta["kind"] == "noise_floor":
        level = 1 - opts.alpha
        ci = p.inf.confidence_interval(level) if p.inf else None
        v, why = "", "the backend's own run-to-run variation: no verdict, the yardstick for the cross comparisons"
    elif p.problem or one_sided:
        # A disagreement seen directly, not a statistical decision: no interval and no level is printed.
        level, ci = math.nan, None
        v = verdict.DIFFERENT
        why = p.problem or (
            f"non-finite values on one side only (reference {p.counts['n_nonfinite_reference']}, cell "
            f"{p.counts['n_nonfinite_cell']}): the two cells disagree on whether these samples have a value "
            "(a disagreement seen directly, not an α-level decision; no interval applies)")
    elif p.inf is None:
        level, ci = 1 - 2 * opts.alpha, None
        v, why = verdict.INCONCLUSIVE, "no paired samples to compare" + (
            f" ({p.counts['n_nonfinite_both']} non-finite on both sides)" if p.counts.get("n_nonfinite_both") else "")
    elif m is None:
        level = 1 - opts.alpha
        ci = p.inf.confidence_interval(level)
        v = verdict.NO_MARGIN
        why = (f"{p.meta['metric']} is not a proportion and has no margin: {p.estimand} = "
               f"{verdict.fmt(p.inf.estimate, '')}, {verdict.ci_str(ci, level, '')}; pass --margin "
               f"{p.meta['metric']}=VALUE (in its own unit) to gate on it")
    else:
        v = verdict.classify(p.tests.p_equivalence, np.isfinite(thr_b), np.isfinite(thr_s), opts.alpha)
        level = verdict.decisive_level(v, opts.alpha, thr_b, m.sides)
        ci = p.inf.confidence_interval(level)
        why = verdict.reason(verdict=v, estimate=p.inf.estimate, ci=ci, level=level, margin=m, t=p.tests,
                             p_beyond_adj=adj_b, p_shift_adj=adj_s, alpha=opts.alpha, multiple=opts.multiple,
                             n=p.n, estimand=p.estimand, shift_test=p.shift_test, mdd=p.mdd,
                             n_needed=p.n_needed, n_needed_at_zero=p.n_needed_at_zero)
        if p.counts.get("n_nonfinite_both"):
            why += f"; {p.counts['n_nonfinite_both']} samples non-finite on both sides left out"
    rec |= {"ci_low": ci.low if ci else nan, "ci_high": ci.high if ci else nan, "ci_level": level,
            "verdict": v, "reason": why}
    return Comparison(**rec)


# ---------------------------------------------------------------- the noise floor as a yardstick
def attach_noise_floor(rows: list[Comparison], pending: list[Pending], opts: StatsOptions) -> None:
    """For each cross comparison of a binary metric, test whether its discordance exceeds the run-to-run
    discordance of a noise-floor pair (a cell against its repeat) on the same docs: an exact one-sided
    McNemar test on the two discordance indicators, with the score interval on the difference of rates.
    Where several noise floors apply (the reference's and the cell's), the noisier one is the yardstick."""
    floors: dict[tuple, list[tuple[str, pd.Series]]] = {}
    for rec, p in zip(rows, pending):
        if rec.kind == "noise_floor" and p.discordance is not None:
            key = (rec.task, rec.level, rec.filter, rec.metric)
            floors.setdefault(key, []).append((rec.reference, rec.cell, p.discordance))
    for rec, p in zip(rows, pending):
        if rec.kind == "noise_floor" or p.discordance is None:
            continue
        cands = [(base, rep, s) for base, rep, s in floors.get((rec.task, rec.level, rec.filter, rec.metric), [])
                 if base in (rec.reference, rec.cell)]
        if not cands:
            continue
        best = None
        for base, rep, s in cands:
            x, nf = p.discordance.align(s, join="inner")
            if x.size == 0:
                continue
            x_only, nf_only = int(np.sum((x == 1) & (nf == 0))), int(np.sum((x == 0) & (nf == 1)))
            cand = (float(nf.mean()), f"{base} vs {rep}", x_only, nf_only, int(x.size))
            best = cand if best is None or cand[0] > best[0] else best
        if best is None:
            continue
        rate_nf, pair, x_only, nf_only, n = best
        inf = inference.binary_inference(nf_only, x_only, n)  # Δ = cross rate − noise rate
        ci = inf.confidence_interval(1 - 2 * opts.alpha)  # its lower end is the one-sided (1 − α) bound
        k = x_only + nf_only
        p_more = float(sps.binom.sf(x_only - 1, k, 0.5)) if k else 1.0
        rec.noise_floor_pair, rec.noise_discordance = pair, rate_nf
        rec.discordance_excess, rec.discordance_excess_ci = inf.estimate, [ci.low, ci.high]
        rec.p_beyond_noise, rec.beyond_noise = p_more, p_more < opts.alpha


@dataclass
class Extras:
    """The per-request tables the statistics stage writes beside the comparisons (``compute``)."""

    deltas: list = field(default_factory=list)
    flips: list = field(default_factory=list)
    flipped: list = field(default_factory=list)
    generations: list = field(default_factory=list)
    divergences: list = field(default_factory=list)
    histogram: list = field(default_factory=list)


def comparisons(tables: dict[str, pd.DataFrame], metas: dict[str, dict], opts: StatsOptions,
                extras: Extras | None = None) -> list[Pending]:
    """Every comparison of the run's pairs, tested but not yet decided (``decide_all``): per task and per
    group, every metric; with ``extras``, the loglikelihood and generation statistics too (a staged run's
    look needs only the metrics, ``staged_trace``)."""
    pending: list[Pending] = []
    for kind, ref_name, cell_name in _pairs(metas, opts.reference, opts.pairs):
        ref, cell = tables[ref_name], tables[cell_name]
        docs = _doc_frame(ref, cell)
        common = {"kind": kind, "reference": ref_name, "cell": cell_name,
                  "differs": variants.difference(metas[ref_name], metas[cell_name])}
        metrics = metric_union(ref, cell)
        for (task, filt), g in docs.groupby(["task", "filter"], sort=True):
            keys = pd.MultiIndex.from_arrays([g["task"], g["doc_id"]])
            for mc in metrics:
                if g[f"{mc}_ref"].isna().all() and g[f"{mc}_cell"].isna().all():
                    continue  # the metric is not this task's
                meta = common | {"task": task, "group": g["group"].iloc[0], "level": "task", "filter": filt,
                                 "metric": mc[len(samples_mod.METRIC_PREFIX):]}
                pending.append(score_comparison(meta, g[f"{mc}_ref"].to_numpy(float),
                                                g[f"{mc}_cell"].to_numpy(float), opts, doc_keys=keys))
        for (group, filt), g in docs.groupby(["group", "filter"], sort=True):
            if g["task"].nunique() < 2:
                continue
            keys = pd.MultiIndex.from_arrays([g["task"], g["doc_id"]])
            for mc in metrics:
                if g[f"{mc}_ref"].isna().all() and g[f"{mc}_cell"].isna().all():
                    continue
                meta = common | {"task": group, "group": group, "level": "group", "filter": filt,
                                 "metric": mc[len(samples_mod.METRIC_PREFIX):]}
                clusters = g["task"].to_numpy() if opts.cluster else None
                pending.append(score_comparison(meta, g[f"{mc}_ref"].to_numpy(float),
                                                g[f"{mc}_cell"].to_numpy(float), opts, clusters, doc_keys=keys))
        if extras is not None:
            _loglikelihood_stats(ref, cell, common, opts, pending, extras.deltas, extras.flips, extras.flipped,
                                 extras.histogram)
            _generation_stats(ref, cell, common, extras.generations, extras.divergences)
    return pending


# ---------------------------------------------------------------- a staged run's looks
def staged_trace(pending: list[Pending], gating: np.ndarray, plan, opts: StatsOptions,
                 where: str = "the cells' tables") -> staged.Trace:
    """The staged decisions (``stats.staged.replay``) over the gating comparisons; the rule is off (no
    early stop) where a gating comparison is not on a 0/1 metric, or is clustered."""
    rows, off = [], None
    for i in np.flatnonzero(gating):
        p = pending[int(i)]
        if p.signed is None and not p.problem:
            off = off or (f"{p.meta['task']} {p.meta['metric']} is not a 0/1 metric: the staged rule covers "
                          "0/1 metrics, so every task is scored to its end")
        if opts.cluster and p.meta["level"] == "group":
            off = off or "--cluster: clustered group comparisons are decided once, on every doc"
        rows.append(staged.GatingRow(int(i), p.meta["task"], p.margin.size if p.margin else opts.margin,
                                     p.signed, problem=bool(p.problem or p.counts.get("n_nonfinite_reference")
                                                            or p.counts.get("n_nonfinite_cell"))))
    return staged.replay(rows, plan, alpha=opts.alpha, direction=opts.direction, off=off, where=where)


def look(tables: dict[str, pd.DataFrame], metas: dict[str, dict], opts: StatsOptions, plan,
         where: str = "the cells' parts") -> staged.Trace:
    """A staged run's decisions on the rounds scored so far (its cells' parts, concatenated): which tasks
    have settled and which need their next look. The same comparisons and rule as the final statistics."""
    if opts.reference not in tables:
        raise EvalParityError(f"reference cell {opts.reference} has no parts to decide a staged run on: rerun it, "
                              "or pass --reference with another cell", exit_code=EXIT_CELL_FAILED)
    samples_mod.check_alignment({opts.reference: tables[opts.reference],
                                 **{k: v for k, v in tables.items() if k != opts.reference}})
    pending = comparisons(tables, metas, opts)
    return staged_trace(pending, _gating(pending, opts), plan, opts, where)


def apply_staged(rows: list[Comparison], trace: staged.Trace) -> None:
    """The gating verdicts the staged rule gave, with the interval at the level each was decided at; the
    comparisons it did not decide (noise floors, members of a group, non-gating metrics) keep theirs."""
    for t in trace.units.values():
        for i, res in t.results.items():
            rec = rows[i]
            if not (res.settled or res.final):
                continue  # a task still open: the sign-off is INCOMPLETE (``staged.incomplete_reason``)
            ci = res.confidence_interval()
            rec.verdict = res.verdict
            rec.ci_low, rec.ci_high = ci.low, ci.high
            rec.ci_level = 1 - 2 * (res.beyond_threshold if res.verdict == verdict.DIFFERENT else res.level)
            rec.p_equivalence, rec.p_beyond, rec.p_beyond_adjusted = res.p_equivalence, res.p_beyond, res.q_beyond
            rec.staged_look, rec.staged_looks = res.look + 1, len(t.looks)
            # the look it was decided at: a later look's docs (a report run with a looser margin than the
            # run's) do not change a verdict the design settled earlier
            rec.n, rec.effect = res.n, res.statistic
            rec.reference_only, rec.cell_only, rec.discordant = res.b, res.c, res.b + res.c
            rec.reason = staged.staged_reason(res, t, t.unit, rec.estimand)


# ---------------------------------------------------------------- the whole stage
def compute(run_dir: Path, opts: StatsOptions, source: Path | None = None) -> StatsSummary:
    """The statistics of the run folder ``source`` (default ``run_dir``), written to ``run_dir/stats``: the
    report stage passes its staging folder as ``run_dir`` and the run itself as ``source``, which is the
    folder that is verified (``records.verify_run``)."""
    tables, metas, missing = load_cells(source or run_dir)
    if opts.reference not in tables:
        have = ", ".join(tables) or "none"
        why = dict(missing).get(opts.reference)
        raise EvalParityError(f"reference cell {opts.reference} has no usable results in {run_dir}"
                              + (f" ({why})" if why else "") + f" (usable: {have}): rerun it, or pass "
                              "--reference with one of the usable cells", exit_code=EXIT_CELL_FAILED if why else 2)
    if len(tables) < 2:
        raise EvalParityError(f"only one usable cell in {run_dir}: a comparison needs two"
                              + (f" ({'; '.join(f'{c}: {w}' for c, w in missing)})" if missing else ""),
                              exit_code=EXIT_CELL_FAILED if missing else 2)
    for a, b in opts.pairs:  # the verbs checked them (signoff.check_pairs); a caller of its own gets one line
        variants.check_pair(a, b, [*tables, *dict(missing)])
    check_metric_names(opts, [m[len(samples_mod.METRIC_PREFIX):] for t in tables.values()
                              for m in samples_mod.metric_columns(t)])  # a --margin typo gates nothing: refused
    samples_mod.check_alignment({opts.reference: tables[opts.reference],
                                 **{k: v for k, v in tables.items() if k != opts.reference}})
    extras = Extras()
    pending = comparisons(tables, metas, opts, extras)
    if not pending:
        raise EvalParityError("no metric could be compared: the cells share no task with per-sample metrics")
    gating = _gating(pending, opts)
    rows = decide_all(pending, gating, opts)
    attach_noise_floor(rows, pending, opts)
    plan = staging_of(source or run_dir)
    trace = staged_trace(pending, gating, plan, opts) if plan is not None else None
    if trace is not None and trace.off is None:
        staged.check_multiple(opts.multiple)
    if trace is not None:
        apply_staged(rows, trace)
    comp = pd.DataFrame([asdict(r) for r in rows], columns=columns())
    status, reason = verdict.sign_off(comp.loc[comp["gating"], "verdict"].tolist())
    unfinished = staged.incomplete_reason(trace) if trace is not None else None
    if unfinished and not missing:
        status, reason = verdict.INCOMPLETE, f"{unfinished} (the verdicts so far: {reason})"
    if missing:
        status = verdict.INCOMPLETE
        reason = (f"{len(missing)} cell(s) of the run cannot be used ({'; '.join(f'{c}: {w}' for c, w in missing)}): "
                  f"rerun to finish them; the verdicts below are for the others only ({reason})")
    out = layout.stats_dir(run_dir)
    out.mkdir(exist_ok=True)
    samples_mod.write_table(comp, layout.stats_table(run_dir, "comparisons"))
    for name, data in (("deltas", extras.deltas), ("flips", extras.flips), ("generations", extras.generations),
                       ("delta_histogram", extras.histogram)):
        samples_mod.write_table(pd.DataFrame(data), layout.stats_table(run_dir, name))
    samples_mod.write_table(pd.concat(extras.flipped) if extras.flipped else pd.DataFrame(),
                            layout.stats_table(run_dir, "flipped_samples"))
    samples_mod.write_table(pd.DataFrame(extras.divergences, columns=["kind", "reference", "cell", "task", "position"]),
                            layout.stats_table(run_dir, "first_divergence"))
    summary = StatsSummary(status, reason, comp, tuple(missing), trace)
    write_json(layout.verdicts_file(run_dir), verdicts_document(run_dir, rows, opts, summary, metas))
    return summary


def _choice_chars(g: pd.DataFrame) -> np.ndarray:
    """Each choice's length in characters as lm-eval's acc_norm divides by: the choice without the target
    delimiter that lm-eval puts before it in the request's continuation."""
    if "choice_chars" in g and g["choice_chars"].notna().all():
        return g["choice_chars"].to_numpy(float)
    cont = g["continuation"].fillna("").astype(str)
    return cont.str.removeprefix(" ").str.len().to_numpy(float)


def _loglikelihood_stats(ref, cell, common, opts, pending, delta_rows, flip_rows, flipped, hist_rows) -> None:
    ll_types = ("multiple_choice", "loglikelihood", "loglikelihood_rolling")
    r = ref[ref["output_type"].isin(ll_types) & (ref["filter"] == "none")]
    c = cell[cell["output_type"].isin(ll_types) & (cell["filter"] == "none")]
    if r.empty:
        return
    # Numbers only through the merge and the per-task groups (string columns cost a third of the stage at
    # 10^6 requests); the text of the few flipped docs is looked up in ``r`` afterwards.
    num = r[["task", "group", "filter", "doc_id", "choice", "output_type", "loglikelihood", "gold"]].assign(
        choice_chars=_choice_chars(r))
    j = num.merge(c[["task", "filter", "doc_id", "choice", "loglikelihood"]],
                  on=["task", "filter", "doc_id", "choice"], suffixes=("_ref", "_cell"))
    hist_rows += _delta_histogram(j, common)
    metrics = {m[len(samples_mod.METRIC_PREFIX):] for m in samples_mod.metric_columns(ref)}
    for task, g in j.groupby("task", sort=True):
        lr, lc = g["loglikelihood_ref"].to_numpy(float), g["loglikelihood_cell"].to_numpy(float)
        d = deltas.loglikelihood_deltas(lr, lc, docs=g["doc_id"].to_numpy(), tolerance=opts.ll_tolerance,
                                        alpha=opts.alpha, n_resamples=opts.n_resamples, seed=opts.seed)
        group = g["group"].iloc[0]
        delta_rows.append(common | {"task": task, "group": group} | _delta_dict(d))
        meta = common | {"task": task, "group": group, "level": "task", "filter": "none", "metric": "loglikelihood"}
        fin = np.isfinite(lr) & np.isfinite(lc)
        pending.append(loglikelihood_comparison(meta, d, float(lr[fin].mean()) if fin.any() else math.nan,
                                                float(lc[fin].mean()) if fin.any() else math.nan, opts))
        if g["output_type"].iloc[0] != "multiple_choice":
            continue
        chars = g["choice_chars"].to_numpy(float)
        for metric, scale in (("acc", 1.0), ("acc_norm", chars)):
            if metric == "acc_norm" and "acc_norm" not in metrics:
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                choices = pd.DataFrame({"doc_id": g["doc_id"].to_numpy(), "choice": g["choice"].to_numpy(),
                                        "ref_score": lr / scale, "cell_score": lc / scale,
                                        "gold": g["gold"].to_numpy()})
            f = flips.decision_flips(choices, seed=opts.seed)
            flip_rows.append(common | {"task": task, "group": group, "metric": metric, "n_docs": f.n_docs,
                                       "observed": f.statistic, "expected": f.expected, "pvalue": f.pvalue,
                                       "method": f.method})
            if len(f.flipped):
                detail = f.flipped.copy()
                sub = r[(r["task"] == task) & r["doc_id"].isin(detail["doc_id"])]  # only the flipped docs' text
                ctx = sub[sub["choice"] == 0].set_index("doc_id")["context"]
                conts = sub.groupby("doc_id")["continuation"].agg(list)
                detail["context"] = detail["doc_id"].map(ctx)
                detail["choices"] = detail["doc_id"].map(conts)
                for k, v in common.items():
                    detail[k] = v
                detail["task"] = task
                detail["metric"] = metric
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
    out = {k: v for k, v in asdict(d).items() if k not in ("ci", "inference", "abs_inference")}
    out["mean"] = out.pop("statistic")
    out["wilcoxon_p"] = out.pop("pvalue")
    out["ci_low"], out["ci_high"] = d.ci.low, d.ci.high
    a = d.abs_inference.confidence_interval(0.95) if d.n else None
    out["abs_ci_low"], out["abs_ci_high"] = (a.low, a.high) if a else (math.nan, math.nan)
    out["method"] = d.inference.method if d.inference else "none"
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


def _gating(pending: list[Pending], opts: StatsOptions) -> np.ndarray:
    """Which comparisons gate: cross and ``--compare`` ones with a margin, a group's pooled row instead of
    its members, and loglikelihoods only with ``gate_logprobs``."""
    grouped = {p.meta["group"] for p in pending if p.meta["level"] == "group"}
    out = []
    for p in pending:
        m = p.meta
        member = m["level"] == "task" and m["group"] != m["task"] and m["group"] in grouped
        is_ll = m["metric"] == "loglikelihood"
        out.append(m["kind"] in GATING_KINDS and not member and (not is_ll or opts.gate_logprobs)
                   and p.margin is not None)
    return np.array(out, dtype=bool)


def verdicts_document(run_dir: Path, rows: list[Comparison], opts: StatsOptions, summary: StatsSummary,
                      metas: dict[str, dict]) -> dict:
    """The ``verdicts.json`` document (schema ``evalparity.verdicts/4``, shipped as ``verdicts.schema.json``
    and documented in the README): provenance, the sign-off with its counts and the comparisons that decided
    it, and one record per comparison. Proportions are fractions and say so (``unit: "fraction"``, shown as
    percentage points); counts are integers."""
    spec = read_json(layout.spec_file(run_dir)) or {}
    gating = [r for r in rows if r.gating]
    counts = {v: sum(r.verdict == v for r in gating) for v in verdict.VERDICTS if v != verdict.NO_MARGIN}
    staged_rule = summary.staging is not None and summary.staging.off is None
    family = "Holm (the staged rule's)" if staged_rule else opts.multiple
    return {
        "schema": SCHEMA,
        "model": spec.get("model"),
        "tasks": spec.get("tasks"),
        "cells": sorted(metas),
        "run": provenance(run_dir, spec, metas),
        "options": opts.as_dict(),
        "decision_rule": ("EQUIVALENT: the (1-2α) CI lies inside the margin (TOST at α, no adjustment: PASS is "
                          "an intersection-union test). DIFFERENT: the (1-2γ) CI lies outside the margin, γ the "
                          "family threshold (one-sided claims, each at α, plus the far end's tail where the CI is "
                          f"wide against the margin; {family} over the gating comparisons); one comparison: "
                          "the same (1-2α) CI. SHIFT: a change shown (McNemar or the mean's test, two-sided, same "
                          "family), within-margin not shown. INCONCLUSIVE: neither. A staged run: each verdict at "
                          "the look that settled it, α spent over the looks (staged_look, staging)."),
        "sign_off": {"status": summary.sign_off, "reason": summary.reason,
                     "exit_code": summary.exit_code(True),
                     "exit_code_if_inconclusive_allowed": summary.exit_code(False),
                     "gating": len(gating), "counts": counts, "decided_by": decided_by(summary.sign_off, gating),
                     "incomplete_cells": [{"cell": c, "why": w} for c, w in summary.incomplete],
                     "tasks_not_compared": records.tasks_not_compared(run_dir)},
        "staging": summary.staging.to_json() if summary.staging is not None else None,
        "comparisons": [verdict_record(r) for r in rows],
    }


def decided_by(status: str, gating: list[Comparison]) -> list[int]:
    """The ids of the gating comparisons the sign-off rests on: every DIFFERENT one for FAIL, every one for
    PASS, the unsettled ones (SHIFT, INCONCLUSIVE) for INCONCLUSIVE; none for INCOMPLETE (the cells decide)."""
    if status == verdict.FAIL:
        return [r.id for r in gating if r.verdict == verdict.DIFFERENT]
    if status == verdict.PASS:
        return [r.id for r in gating]
    if status == verdict.INCONCLUSIVE:
        return [r.id for r in gating if r.verdict != verdict.EQUIVALENT]
    return []


def verdict_record(r: Comparison) -> dict:
    """One comparison as ``verdicts.json`` holds it: a proportion's unit is ``fraction`` (0.012 is 1.2
    percentage points, ``shown_as: "pp"``), and ``n_needed`` is a whole number of docs."""
    out = r.to_json()
    if out.get("unit") == "pp":
        out["unit"], out["shown_as"] = "fraction", "pp"
    if out.get("n_needed") is not None:
        out["n_needed"] = int(math.ceil(out["n_needed"]))
    return out


def provenance(run_dir: Path, spec: dict, metas: dict[str, dict]) -> dict:
    """Where the verdicts come from: the run's id (its spec identity, or the comparison's), the model's
    digest, the software that made the cells, and per cell its device and attention backend."""
    from evalparity import __version__
    from evalparity.spec import RunSpec

    try:
        run_id = RunSpec.from_json(spec).identity() if spec.get("cells") is not None else None
    except (KeyError, TypeError, ValueError):
        run_id = None
    if run_id is None and layout.compare_file(run_dir).exists():
        run_id = records.read_compare(run_dir).identity
    cells = {}
    for name, m in sorted(metas.items()):
        prec = m.get("precision") or {}
        cells[name] = {"backend": m.get("backend"), "dtype": m.get("dtype"), "device_name": m.get("device_name"),
                       "attention_backend": prec.get("attention_backend"),
                       "versions": {k: str(v) for k, v in (m.get("versions") or {}).items()}}
        if isinstance(m.get("reused_from"), dict):  # a reference taken from an earlier run: where and when made
            cells[name]["reused_from"] = m["reused_from"]
    return {"id": run_id, "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "evalparity": __version__,
            "device": spec.get("device"), "model_digest": (spec.get("model_fingerprint") or {}).get("digest"),
            "software": {str(k): str(v) for k, v in spec.get("software") or []}, "cells": cells}
