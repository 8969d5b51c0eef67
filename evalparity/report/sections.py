"""One builder per report section: statistics tables in, formatted ``context`` values out.

Pure functions of DataFrames and dicts (no files, no figures; ``build`` reads and draws), named after the
section they fill. Which rows each section shows and how each column is formatted is decided here; the
wording around them is in the templates.
"""

from __future__ import annotations

import pandas as pd

from evalparity.report.context import (
    Drift,
    Figure,
    Fold,
    Method,
    SettingDifference,
    Setup,
    SignOff,
    Table,
    VerdictMatrix,
    WorstTokens,
)
from evalparity.report.formatting import beyond_noise, ci, effect, num, verdict_cell

# How many flipped samples the last section prints, the most consequential first.
FLIPPED_SHOWN = 10

# Settings whose values must agree between cells for a difference to be drift and not setup.
MUST_AGREE = ("bos_added", "max_length", "max_gen_toks", "num_fewshot", "limit")


def sign_off(verdicts: dict) -> SignOff:
    so = verdicts["sign_off"]
    staging = verdicts.get("staging") or {}
    staged = [(t["task"], f"stopped at look {t['stopped_at_look']} of {t['of_looks']}, {t['docs']:,} of "
                          f"{t['docs_available']:,} docs scored ({t['why']})") for t in staging.get("tasks", [])]
    return SignOff(so["status"], so["reason"], [(i["cell"], i["why"]) for i in so.get("incomplete_cells", [])],
                   [(i["task"], ", ".join(i["missing_from"])) for i in so.get("tasks_not_compared", [])],
                   staged, staging.get("off"))


def method(options: dict) -> Method:
    a = options["alpha"]
    return Method(
        reference=options["reference"], worse=options.get("direction") == "worse",
        margin=f"{100 * options['margin']:g}",
        metric_margins=[(k, f"{v:g}") for k, v in (options.get("metric_margins") or {}).items()],
        ll_tolerance=f"{options['ll_tolerance']:g}", ci_percent=f"{100 * (1 - 2 * a):g}", alpha=f"{a:g}",
        multiple=options["multiple"])


def _metric_label(metric: str, filt: str) -> str:
    return metric + ("" if filt == "none" else f" ({filt})")


def verdict_matrix(comp: pd.DataFrame) -> VerdictMatrix | None:
    """Cross-backend score comparisons, tasks x cells; None when there are none."""
    c = comp[(comp["kind"] == "cross") & (comp["metric"] != "loglikelihood")]
    noise_marked = bool(comp["beyond_noise"].notna().any()) if "beyond_noise" in comp else False
    if c.empty:
        return None
    cells = sorted(c["cell"].unique())
    header = ["task", "metric", *cells]

    def rows(part: pd.DataFrame) -> list[list[str]]:
        out = []
        for (task, _m, _f), g in part.groupby(["task", "metric", "filter"], sort=True):
            by_cell = {r.cell: r for r in g.itertuples()}
            out.append([task, _metric_label(g["metric"].iloc[0], g["filter"].iloc[0]),
                        *[verdict_cell(by_cell[x], noise_marked) if x in by_cell else "–" for x in cells]])
        return out

    top = c[(c["level"] == "group") | (c["group"] == c["task"])]
    members = c[(c["level"] == "task") & (c["group"] != c["task"])]
    folds = [Fold(str(group), gm["task"].nunique(), Table(header, rows(gm)))
             for group, gm in members.groupby("group", sort=True)]
    return VerdictMatrix(Table(header, rows(top)), folds, noise_marked)


def _run_table(spec: dict) -> Table:
    if not spec:
        return Table(["setting", "value"], [["run", "imported lm-eval outputs (evalparity compare)"]])
    al = spec.get("alignment", {})
    return Table(["setting", "value"], [
        ["model", str(spec.get("model"))], ["tasks", ", ".join(spec.get("tasks", []))],
        ["limit", str(spec.get("limit"))],
        ["per-task limits", ", ".join(f"{k}={v}" for k, v in spec.get("task_limits", [])) or "none"],
        ["num_fewshot", str(spec.get("num_fewshot"))],
        ["device", str(spec.get("device"))], ["seed", str(al.get("seed"))],
        ["HF log-softmax in fp32", str(al.get("softmax_fp32"))], ["BOS token", str(al.get("add_bos_token"))],
        ["max length (both)", str(al.get("max_length"))], ["vLLM prefix caching", str(al.get("prefix_caching"))],
        ["true fp32 (no TF32)", str(al.get("true_fp32"))],
        ["max generated tokens", str(al.get("max_gen_toks") or "each task's own")],
    ])


# cell.json's versions that the cells table leaves out; the rest are the common stack (below) and what each
# backend records of its own (``Backend.versions``, e.g. vllm), in between
_VERSIONS_LEFT_OUT = ("python", "evalparity", "datasets", "numpy")
_VERSIONS_FIRST, _VERSIONS_LAST = ("torch", "transformers"), ("lm_eval",)


def _versions(ver: dict) -> str:
    own = [k for k in ver if k not in (*_VERSIONS_LEFT_OUT, *_VERSIONS_FIRST, *_VERSIONS_LAST)]
    return ", ".join(f"{k} {ver.get(k, '?')}" for k in (*_VERSIONS_FIRST, *own, *_VERSIONS_LAST))


def _cell_row(name: str, m: dict) -> list[str]:
    ver = m.get("versions", {})
    prec = m.get("precision", {})
    return [name, m.get("status", "?"), str(m.get("batch_size", "–")), m.get("device_name", "–"),
            f"{num(m.get('load_s'))} / {num(m.get('eval_s'))}",
            num(m.get("peak_rss_gib")) + (f" / GPU {num(m['peak_gpu_gib'])}" if "peak_gpu_gib" in m else ""),
            _versions(ver) if ver else m.get("source", "–"),
            f"matmul {prec.get('float32_matmul_precision', '–')}, TF32 {prec.get('cuda_matmul_allow_tf32', '–')}, "
            f"triton {prec.get('triton_f32_default', '–')}, attn {prec.get('attention_backend', '–')}"
            if prec else "–"]


def setup(spec: dict, metas: dict[str, dict]) -> Setup:
    """The run's spec, each cell's environment (``cell.json``) and the cells' effective settings."""
    cells = Table(["cell", "status", "batch", "device", "load / eval s", "peak memory GiB", "versions", "precision"],
                  [_cell_row(name, m) for name, m in metas.items()])
    settings = {n: m.get("settings", {}) for n, m in metas.items() if m.get("settings")}
    differences = []
    for key in MUST_AGREE:
        values = {str(s.get(key)) for s in settings.values() if key in s}
        if len(values) > 1:
            differences.append(SettingDifference(key, ", ".join(sorted(values))))
    table = None
    if settings:
        keys = sorted({k for s in settings.values() for k in s if k != "seeds"})
        table = Table(["setting", *settings], [[k, *[str(s.get(k, "–"))[:60] for s in settings.values()]]
                                               for k in keys])
    envs = {n: m.get("environment") for n, m in metas.items() if isinstance(m.get("environment"), dict)}
    environment = None
    if envs:
        keys = sorted({k for e in envs.values() for k in e})
        environment = Table(["environment", *envs], [[k, *[str(e.get(k, "–")) for e in envs.values()]] for k in keys])
    return Setup(_run_table(spec), cells, differences, table, environment)


def paired(comp: pd.DataFrame) -> Table:
    """Every gating comparison with its estimate, interval, p-values and verdict."""
    rows = [[r.task, _metric_label(r.metric, r.filter), r.cell, str(int(r.n)), num(r.reference_score),
             num(r.cell_score), effect(r), ci(r), num(r.p_equivalence), num(r.p_beyond_adjusted),
             num(r.p_shift_adjusted), beyond_noise(r), r.verdict, r.reason]
            for r in comp[comp["gating"]].itertuples()]
    return Table(["task", "metric", "cell", "n", "ref", "cell", "Δ", "CI (the verdict's)", "p equiv",
                  "p beyond (adj)", "p change (adj)", "beyond noise floor", "verdict", "reason"], rows)


def deltas(d: pd.DataFrame) -> Table | None:
    """Loglikelihood drift per request, cross-backend pairs; None when the run scored no loglikelihoods."""
    if d.empty:
        return None
    rows = [[r.task, r.cell, str(int(r.n)), num(r.abs_mean), f"[{num(r.abs_ci_low)}, {num(r.abs_ci_high)}]",
             num(r.mean), f"[{num(r.ci_low)}, {num(r.ci_high)}]", num(r.abs_median), num(r.abs_p95),
             num(r.abs_p99), num(r.abs_max), num(r.wilcoxon_p), f"{int(r.n_nonfinite_ref)} / {int(r.n_nonfinite_cell)}"]
            for r in d[d["kind"] == "cross"].itertuples()]
    return Table(["task", "cell", "requests", "mean |Δ|", "95% CI", "mean Δ", "95% CI", "median |Δ|", "p95 |Δ|",
                  "p99 |Δ|", "max |Δ|", "Wilcoxon p", "non-finite ref / cell"], rows)


def flips(f: pd.DataFrame) -> Table | None:
    if f.empty:
        return None
    rows = [[r.task, getattr(r, "metric", "acc"), r.cell, r.kind, str(int(r.n_docs)), str(int(r.observed)),
             num(r.expected), num(r.pvalue)] for r in f.itertuples()]
    return Table(["task", "decision", "cell", "kind", "docs", "observed", "expected", "p (more than expected)"], rows)


def generations(g: pd.DataFrame) -> Table | None:
    if g.empty:
        return None
    rows = [[r.task, r.cell, r.kind, str(int(r.n)), f"{100 * r.identical_ids:.1f}%", f"{100 * r.identical_text:.1f}%",
             str(int(r.n_diverged)), num(r.median_first_divergence), str(int(r.n_without_ids))]
            for r in g.itertuples()]
    return Table(["task", "cell", "kind", "docs", "identical token ids", "identical text", "diverged",
                  "median first divergence", "docs without ids"], rows)


def noise_floor(comp: pd.DataFrame) -> Table | None:
    """Repeat pairs (the noise floor) and TF32 cells against their base cell; None when the run has none."""
    nf = comp[comp["kind"].isin(["noise_floor", "precision_mode"])]
    if nf.empty:
        return None
    rows = [[r.task, r.metric, r.kind.replace("_", " "), f"{r.reference} vs {r.cell}", str(int(r.n)),
             effect(r), ci(r), r.verdict or "– (yardstick)"] for r in nf.itertuples()]
    return Table(["task", "metric", "kind", "pair", "n", "Δ", "CI", "verdict"], rows)


def _drift_row(cell: str, s: dict) -> list[str]:
    lp = s["prompt_logprobs"]
    g = s.get("generations") or {}
    layers = s["layers"]
    return [cell, str(s["first_layer_over_threshold"]), num(layers[1]["rel_error"]) if len(layers) > 1 else "–",
            num(layers[-1]["rel_error"]), num(layers[-1]["cosine"], 8), num(lp["abs_mean"]), num(lp["abs_p99"]),
            num(lp["abs_max"]), f"{100 * g['identical']:.0f}%" if g else "–", str(len(s["tokenization_mismatches"]))]


def _worst_tokens(s: dict) -> str:
    return "\n".join(f"|Δ| {num(w['abs_delta'])} prompt {w['prompt']} pos {w['position']}: "
                     f"{w['context']!r} -> {w['token']!r}" for w in s.get("worst_tokens", [])[:5])


def drift(summaries: dict[str, dict], figures: list[Figure]) -> Drift | None:
    """``evalparity drift``'s summaries, one per cell; None when the run has none."""
    if not summaries:
        return None
    any_s = next(iter(summaries.values()))
    table = Table(["cell", "first layer over", "rel err layer 1", "rel err final", "cos final", "mean |Δ lp|",
                   "p99 |Δ lp|", "max |Δ lp|", "identical generations", "tokenization mismatches"],
                  [_drift_row(cell, s) for cell, s in summaries.items()])
    worst = [WorstTokens(cell, _worst_tokens(s)) for cell, s in summaries.items() if s.get("worst_tokens", [])[:5]]
    return Drift(str(any_s["n_prompts"]), str(any_s["reference"]), f"{any_s['threshold']:g}", table, figures, worst)


def _flipped_text(r) -> str:
    choices = list(r.choices) if r.choices is not None else []
    lines = []
    for i, ch in enumerate(choices):
        mark = " ".join(x for x, ok in (("gold", i == r.gold), ("ref", i == r.ref_choice),
                                        ("cell", i == r.cell_choice)) if ok)
        lines.append(f"  {i}: {str(ch)[:120]!r}" + (f"   <- {mark}" if mark else ""))
    return (f"{r.task} doc {r.doc_id} · {r.cell}: reference margin {num(r.ref_margin)}, max |Δ| "
            f"{num(r.max_abs_delta)}\n  prompt: {str(r.context)[-300:]!r}\n" + "\n".join(lines))


def flipped_samples(flipped: pd.DataFrame) -> list[str] | None:
    """The cross-backend flips that matter most: a right answer lost (or won) first, then the clearest
    reference preference; None when the run has no flipped-samples table."""
    if flipped.empty:
        return None
    f = flipped[flipped["kind"] == "cross"].copy()
    if f.empty:
        return []
    gold = pd.to_numeric(f["gold"], errors="coerce")
    f["consequence"] = (f["ref_choice"] == gold).astype(int) + (f["cell_choice"] == gold).astype(int)
    f = f.sort_values(["consequence", "ref_margin"], ascending=[False, False]).head(FLIPPED_SHOWN)
    return [_flipped_text(r) for r in f.itertuples()]
