"""The report stage: reads ``stats/`` and ``cells/*/cell.json``, writes ``report/report.md``,
``report/report.html`` (self-contained: CSS inline, figures embedded as data URIs) and ``report/figures/``.

Sections, in the order a reviewer reads them: sign-off and why; the verdict matrix (tasks x cells, group
members folded under their group); the run's setup; the paired statistics per comparison; figures;
loglikelihood drift, flips and generations; the noise floor; the most consequential flipped samples.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

import pandas as pd

from evalparity.cells import write_atomic
from evalparity.report import figures

COLORS = {"EQUIVALENT": "#1a7f37", "DIFFERENT": "#cf222e", "INCONCLUSIVE": "#bf8700", "SHIFT": "#9a6700",
          "PASS": "#1a7f37", "FAIL": "#cf222e", "INCOMPLETE": "#cf222e"}


def _read(run_dir: Path, name: str) -> pd.DataFrame:
    p = run_dir / "stats" / f"{name}.parquet"
    return pd.read_parquet(p) if p.exists() else pd.DataFrame()


def _f(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _pp(x) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{100 * x:+.2f}"


def md_escape(text: str) -> str:
    """Text for a markdown document: HTML and markdown's inline syntax escaped, so a task name, a model path
    or a prompt is shown as written and never rendered as HTML or as a link by a markdown viewer."""
    out = html.escape(str(text), quote=False)
    for ch in "\\`*_[]#|!":
        out = out.replace(ch, "\\" + ch)
    return out.replace("\n", " ")


def md_fence(text: str) -> str:
    """A fenced block longer than any run of backticks in ``text``, so the text cannot close it."""
    import re

    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}\n"


class Doc:
    """Builds markdown and HTML side by side, so the two reports never say different things."""

    def __init__(self):
        self.md: list[str] = []
        self.html: list[str] = []

    def h(self, level: int, text: str) -> None:
        self.md.append(f"\n{'#' * level} {md_escape(text)}\n")
        self.html.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def p(self, text: str, raw_html: str | None = None) -> None:
        self.md.append(md_escape(text) + "\n")
        self.html.append(f"<p>{raw_html if raw_html is not None else html.escape(text)}</p>")

    def table(self, header: list[str], rows: list[list[str]], colors: list[str | None] | None = None,
              fold: list[tuple[str, list[list[str]]]] | None = None) -> None:
        self.md.append("| " + " | ".join(md_escape(c) for c in header) + " |")
        self.md.append("|" + "---|" * len(header))
        for r in rows:
            self.md.append("| " + " | ".join(md_escape(c) for c in r) + " |")
        self.md.append("")
        h = ["<table><thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in header) + "</tr></thead><tbody>"]
        for _i, r in enumerate(rows):
            h.append("<tr>" + "".join(_cell_html(c) for c in r) + "</tr>")
        h.append("</tbody></table>")
        self.html.append("".join(h))

    def image(self, path: Path | None, alt: str, rel: str) -> None:
        if path is None or not path.exists():
            return
        self.md.append(f"![{md_escape(alt)}]({rel})\n")
        data = base64.b64encode(path.read_bytes()).decode()
        self.html.append(f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{html.escape(alt)}</figcaption></figure>")

    def raw(self, md: str, html_text: str) -> None:
        self.md.append(md)
        self.html.append(html_text)


def _cell_html(c: str) -> str:
    color = COLORS.get(c.split(" ")[0]) if c else None
    if color:
        return f'<td class="v" style="background:{color}1f;color:{color};font-weight:600">{html.escape(c)}</td>'
    return f"<td>{html.escape(c)}</td>"


CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1f2328;line-height:1.45}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:13px}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f6f8fa}
.signoff{font-size:1.5em;font-weight:700;padding:.5em .8em;border-radius:6px;display:inline-block}
details{margin:.2em 0 .8em 1em}summary{cursor:pointer;color:#0969da}img{max-width:100%}
figure{margin:1em 0}figcaption{font-size:12px;color:#57606a}code,pre{background:#f6f8fa;font-size:12px}
pre{padding:.5em;white-space:pre-wrap}"""


# The page checks itself once loaded: a figure that failed to decode is logged as a console error, which is
# what the headless-browser test (and anyone opening the developer console) sees.
SELF_CHECK = """<script>window.addEventListener('load',function(){document.querySelectorAll('img').forEach(
function(i){if(!(i.complete&&i.naturalWidth>0)){console.error('missing image: '+i.alt);}});});</script>"""


def write_report(run_dir: Path) -> dict[str, Path]:
    run_dir = Path(run_dir)
    v = json.loads((run_dir / "stats" / "verdicts.json").read_text())
    comp = _read(run_dir, "comparisons")
    out = run_dir / "report"
    figdir = out / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    metas = {}
    for d in sorted((run_dir / "cells").iterdir()):
        if (d / "cell.json").exists() and not d.name.startswith("."):
            metas[d.name] = json.loads((d / "cell.json").read_text())
    spec = json.loads((run_dir / "spec.json").read_text()) if (run_dir / "spec.json").exists() else {}
    doc = Doc()
    so = v["sign_off"]
    doc.h(1, f"evalparity sign-off: {v.get('model')}")
    color = COLORS.get(so["status"], "#bf8700")
    doc.raw(f"**Sign-off: {so['status']}** — {md_escape(so['reason'])}\n",
            f'<div class="signoff" style="background:{color}1f;color:{color}">Sign-off: {so["status"]}</div>'
            f"<p>{html.escape(so['reason'])}</p>")
    for item in so.get("incomplete_cells", []):
        doc.p(f"Incomplete: cell {item['cell']} cannot be used ({item['why']}). PASS is never given while a cell "
              "of the run is missing; rerun the same command to finish it.")
    opts = v["options"]
    a = opts["alpha"]
    worse = opts.get("direction") == "worse"
    doc.p(f"Every cell is compared with the reference cell {opts['reference']} on the same documents, with margin "
          f"{'a drop of ' if worse else '±'}{100 * opts['margin']:g} percentage points for proportion metrics"
          + "".join(f", {k} {val:g}" for k, val in (opts.get("metric_margins") or {}).items())
          + f" and {opts['ll_tolerance']:g} nats for mean |Δ loglikelihood|. "
          f"EQUIVALENT: the {100 * (1 - 2 * a):g}% CI lies inside the margin (TOST at α = {a:g}; PASS needs every "
          "gating comparison EQUIVALENT, an intersection-union test valid at α with no multiplicity adjustment). "
          f"DIFFERENT: the CI lies outside the margin at the {opts['multiple']} family threshold, and the level "
          "printed is that threshold's. SHIFT: a change is shown but within-margin is not. INCONCLUSIVE: neither, "
          "at this number of documents. Each verdict is printed beside the interval it was decided on.")

    _verdict_matrix(doc, comp)
    _setup(doc, spec, metas)
    _paired_stats(doc, comp)
    doc.h(2, "Figures")

    def kept(path: Path | None, name: str) -> Path | None:
        # A figure whose inputs are not here (a run directory copied without its per-sample tables) keeps
        # the PNG an earlier report stage drew, so the report can be rewritten from stats/ alone.
        return path if path is not None else (figdir / name if (figdir / name).exists() else None)

    doc.image(figures.score_differences(comp, figdir), "Score differences with paired confidence intervals",
              "figures/score_differences.png")
    doc.image(kept(figures.delta_distributions(_read(run_dir, "delta_histogram"), figdir), "delta_loglikelihood.png"),
              "Distribution of |Δ loglikelihood| per cell", "figures/delta_loglikelihood.png")
    flipped = _read(run_dir, "flipped_samples")
    doc.image(kept(figures.flips_vs_margin(flipped, figdir), "flips_vs_margin.png"),
              "Flipped decisions against the reference margin", "figures/flips_vs_margin.png")
    divs = _read(run_dir, "first_divergence")
    doc.image(kept(figures.first_divergence(divs, figdir), "first_divergence.png"),
              "First divergence of greedy generations", "figures/first_divergence.png")
    _deltas(doc, _read(run_dir, "deltas"))
    _flips(doc, _read(run_dir, "flips"))
    _generations(doc, _read(run_dir, "generations"))
    _noise_floor(doc, comp)
    _drift(doc, run_dir, figdir)
    _flipped_samples(doc, flipped)

    md_path, html_path = out / "report.md", out / "report.html"
    write_atomic(md_path, "\n".join(doc.md))
    write_atomic(html_path, "<!doctype html><html><head><meta charset='utf-8'><title>evalparity report</title>"
                       f"<style>{CSS}</style></head><body>" + "\n".join(doc.html) + SELF_CHECK + "</body></html>")
    return {"md": md_path, "html": html_path, "figures": figdir}


def _verdict_matrix(doc: Doc, comp: pd.DataFrame) -> None:
    doc.h(2, "Verdicts")
    c = comp[(comp["kind"] == "cross") & (comp["metric"] != "loglikelihood")]
    has_nf = comp["beyond_noise"].notna().any() if "beyond_noise" in comp else False
    if c.empty:
        doc.p("No score comparisons.")
        return
    cells = sorted(c["cell"].unique())
    header = ["task", "metric", *cells]

    def row(g: pd.DataFrame, label: str) -> list[str]:
        by_cell = {r.cell: r for r in g.itertuples()}
        return [label, g["metric"].iloc[0] + ("" if g["filter"].iloc[0] == "none" else f" ({g['filter'].iloc[0]})"),
                *[_verdict_cell(by_cell[x], has_nf) if x in by_cell else "–" for x in cells]]

    top = c[(c["level"] == "group") | (c["group"] == c["task"])]
    rows = [row(g, task) for (task, _m, _f), g in top.groupby(["task", "metric", "filter"], sort=True)]
    doc.table(header, rows)
    members = c[(c["level"] == "task") & (c["group"] != c["task"])]
    for group, gm in members.groupby("group", sort=True):
        mrows = [row(g, task) for (task, _m, _f), g in gm.groupby(["task", "metric", "filter"], sort=True)]
        doc.md.append(f"<details><summary>{html.escape(str(group))}: {gm['task'].nunique()} member tasks</summary>\n")
        doc.table(header, mrows)
        doc.md.append("</details>\n")
        last = doc.html.pop()
        doc.html.append(f"<details><summary>{html.escape(group)}: {gm['task'].nunique()} member tasks "
                        f"(the group's pooled verdict above gates)</summary>{last}</details>")
    doc.p("Cells show the verdict and the paired difference (cell − reference; percentage points for proportions)"
          + ("; '+noise' marks drift beyond the backend's own run-to-run noise, '≤noise' drift not shown to exceed "
             "it." if has_nf else "."))


def _effect(r) -> str:
    if r.unit == "pp":
        return _pp(r.effect)
    return _f(r.effect) + (f" {r.unit}" if r.unit else "")


def _verdict_cell(r, has_nf: bool) -> str:
    nf = "" if not has_nf or r.beyond_noise is None or pd.isna(r.beyond_noise) else (
        " +noise" if r.beyond_noise else " ≤noise")
    return f"{r.verdict} {_effect(r)}{nf}"


def _setup(doc: Doc, spec: dict, metas: dict[str, dict]) -> None:
    doc.h(2, "Setup")
    al = spec.get("alignment", {})
    doc.table(["setting", "value"], [
        ["model", str(spec.get("model"))], ["tasks", ", ".join(spec.get("tasks", []))],
        ["limit", str(spec.get("limit"))],
        ["per-task limits", ", ".join(f"{k}={v}" for k, v in spec.get("task_limits", [])) or "none"],
        ["num_fewshot", str(spec.get("num_fewshot"))],
        ["device", str(spec.get("device"))], ["seed", str(al.get("seed"))],
        ["HF log-softmax in fp32", str(al.get("softmax_fp32"))], ["BOS token", str(al.get("add_bos_token"))],
        ["max length (both)", str(al.get("max_length"))], ["vLLM prefix caching", str(al.get("prefix_caching"))],
        ["true fp32 (no TF32)", str(al.get("true_fp32"))],
        ["max generated tokens", str(al.get("max_gen_toks") or "each task's own")],
    ] if spec else [["run", "imported lm-eval outputs (evalparity compare)"]])
    rows = []
    for name, m in metas.items():
        ver = m.get("versions", {})
        prec = m.get("precision", {})
        rows.append([name, m.get("status", "?"), str(m.get("batch_size", "–")), m.get("device_name", "–"),
                     f"{_f(m.get('load_s'))} / {_f(m.get('eval_s'))}",
                     _f(m.get("peak_rss_gib")) + (f" / GPU {_f(m['peak_gpu_gib'])}" if "peak_gpu_gib" in m else ""),
                     f"torch {ver.get('torch', '?')}, transformers {ver.get('transformers', '?')}, "
                     f"vllm {ver.get('vllm', '?')}, lm_eval {ver.get('lm_eval', '?')}" if ver else m.get("source", "–"),
                     f"matmul {prec.get('float32_matmul_precision', '–')}, "
                     f"TF32 {prec.get('cuda_matmul_allow_tf32', '–')}, "
                     f"triton {prec.get('triton_f32_default', '–')}, attn {prec.get('attention_backend', '–')}"
                     if prec else "–"])
    doc.table(["cell", "status", "batch", "device", "load / eval s", "peak memory GiB", "versions", "precision"], rows)
    settings = {n: m.get("settings", {}) for n, m in metas.items() if m.get("settings")}
    for key in ("bos_added", "max_length", "max_gen_toks", "num_fewshot", "limit"):
        values = {str(s.get(key)) for s in settings.values() if key in s}
        if len(values) > 1:
            doc.p(f"Warning: cells differ in {key} ({', '.join(sorted(values))}): part of any difference below is "
                  "a setup difference, not drift.")
    if settings:
        keys = sorted({k for s in settings.values() for k in s if k not in ("seeds",)})
        doc.table(["setting", *settings], [[k, *[str(s.get(k, "–"))[:60] for s in settings.values()]] for k in keys])


def _ci(r) -> str:
    if r.unit == "pp":
        return f"{100 * r.ci_level:.3g}% [{_pp(r.ci_low)}, {_pp(r.ci_high)}]"
    return f"{100 * r.ci_level:.3g}% [{_f(r.ci_low)}, {_f(r.ci_high)}]"


def _paired_stats(doc: Doc, comp: pd.DataFrame) -> None:
    doc.h(2, "Paired statistics (gating comparisons)")
    c = comp[comp["gating"]]
    rows = [[r.task, r.metric + ("" if r.filter == "none" else f" ({r.filter})"), r.cell, str(int(r.n)),
             _f(r.reference_score), _f(r.cell_score), _effect(r), _ci(r), _f(r.p_equivalence),
             _f(r.p_beyond_adjusted), _f(r.p_shift_adjusted), _beyond_noise(r), r.verdict, r.reason]
            for r in c.itertuples()]
    doc.table(["task", "metric", "cell", "n", "ref", "cell", "Δ", "CI (the verdict's)", "p equiv", "p beyond (adj)",
               "p change (adj)", "beyond noise floor", "verdict", "reason"], rows)
    doc.p("p equiv: TOST against the margin (unadjusted; PASS is an intersection-union test). p beyond: the change "
          "exceeds the margin (family-adjusted). p change: a change at all (exact McNemar for binary scores; "
          "family-adjusted). Beyond noise floor: the cross-backend discordance against a noise-floor pair's on "
          "the same docs (exact one-sided McNemar).")


def _beyond_noise(r) -> str:
    if r.beyond_noise is None or pd.isna(r.beyond_noise):
        return "–"
    ci = r.discordance_excess_ci
    ci_s = f" [{_pp(ci[0])}, {_pp(ci[1])}]" if ci is not None and len(ci) == 2 else ""
    return (f"{'yes' if r.beyond_noise else 'no'} (excess {_pp(r.discordance_excess)} pp{ci_s} over "
            f"{r.noise_floor_pair}, p = {_f(r.p_beyond_noise)})")


def _deltas(doc: Doc, d: pd.DataFrame) -> None:
    if d.empty:
        return
    doc.h(2, "Loglikelihood drift per request")
    doc.p("mean |Δ|: how far apart the cells are per request (its verdict compares it with the tolerance). mean Δ: "
          "a systematic shift, with its 95% CI over docs. Wilcoxon p: symmetry of Δ about 0 (a test of location, "
          "not of the mean; reported only).")
    d = d[d["kind"] == "cross"]
    rows = [[r.task, r.cell, str(int(r.n)), _f(r.abs_mean), f"[{_f(r.abs_ci_low)}, {_f(r.abs_ci_high)}]",
             _f(r.mean), f"[{_f(r.ci_low)}, {_f(r.ci_high)}]", _f(r.abs_median), _f(r.abs_p95), _f(r.abs_p99),
             _f(r.abs_max), _f(r.wilcoxon_p), f"{int(r.n_nonfinite_ref)} / {int(r.n_nonfinite_cell)}"]
            for r in d.itertuples()]
    doc.table(["task", "cell", "requests", "mean |Δ|", "95% CI", "mean Δ", "95% CI", "median |Δ|", "p95 |Δ|",
               "p99 |Δ|", "max |Δ|", "Wilcoxon p", "non-finite ref / cell"], rows)


def _flips(doc: Doc, f: pd.DataFrame) -> None:
    if f.empty:
        return
    doc.h(2, "Decision flips")
    doc.p("Observed: docs whose chosen answer changed. Expected: flips that the measured Δ distribution would "
          "cause on these reference margins if Δ were noise unrelated to the doc. Many more observed than "
          "expected (small p) points to systematic drift.")
    rows = [[r.task, getattr(r, "metric", "acc"), r.cell, r.kind, str(int(r.n_docs)), str(int(r.observed)),
             _f(r.expected), _f(r.pvalue)] for r in f.itertuples()]
    doc.table(["task", "decision", "cell", "kind", "docs", "observed", "expected", "p (more than expected)"], rows)


def _generations(doc: Doc, g: pd.DataFrame) -> None:
    if g.empty:
        return
    doc.h(2, "Generations")
    rows = [[r.task, r.cell, r.kind, str(int(r.n)), f"{100 * r.identical_ids:.1f}%", f"{100 * r.identical_text:.1f}%",
             str(int(r.n_diverged)), _f(r.median_first_divergence), str(int(r.n_without_ids))]
            for r in g.itertuples()]
    doc.table(["task", "cell", "kind", "docs", "identical token ids", "identical text", "diverged",
               "median first divergence", "docs without ids"], rows)


def _noise_floor(doc: Doc, comp: pd.DataFrame) -> None:
    nf = comp[comp["kind"].isin(["noise_floor", "precision_mode"])]
    doc.h(2, "Noise floor and precision modes")
    if nf.empty:
        doc.p("No repeat or TF32 cells in this run. Add one with --repeat backend:dtype:batch_size to see each "
              "backend's own run-to-run variation next to the cross-backend drift, or --tf32 vllm,hf to measure "
              "TF32 as its own cell.")
        return
    rows = [[r.task, r.metric, r.kind.replace("_", " "), f"{r.reference} vs {r.cell}", str(int(r.n)),
             _effect(r), _ci(r), r.verdict or "– (yardstick)"] for r in nf.itertuples()]
    doc.table(["task", "metric", "kind", "pair", "n", "Δ", "CI", "verdict"], rows)


def load_drift(run_dir: Path) -> dict[str, dict]:
    d = run_dir / "drift"
    if not d.is_dir():
        return {}
    out = {}
    for p in sorted(d.glob("*.json")):
        if p.name in ("spec.json", "prompts.json"):
            continue
        out[p.stem] = json.loads(p.read_text())
    return out


def _drift(doc: Doc, run_dir: Path, figdir: Path) -> None:
    drift = load_drift(run_dir)
    if not drift:
        return
    doc.h(2, "Where the drift comes from")
    any_s = next(iter(drift.values()))
    doc.p(f"{any_s['n_prompts']} prompts, compared on identical token ids with {any_s['reference']}. Hidden-state "
          "entry 0 is the embedding output, entry i the residual stream after layer i, the last one the final "
          f"norm's output. Threshold for 'first layer over': relative error {any_s['threshold']:g}.")
    rows = []
    for cell, s in drift.items():
        lp = s["prompt_logprobs"]
        g = s.get("generations") or {}
        rows.append([cell, str(s["first_layer_over_threshold"]), _f(s["layers"][1]["rel_error"]) if len(s["layers"]) > 1
                     else "–", _f(s["layers"][-1]["rel_error"]), _f(s["layers"][-1]["cosine"], 8), _f(lp["abs_mean"]),
                     _f(lp["abs_p99"]), _f(lp["abs_max"]),
                     f"{100 * g['identical']:.0f}%" if g else "–", str(len(s["tokenization_mismatches"]))])
    doc.table(["cell", "first layer over", "rel err layer 1", "rel err final", "cos final", "mean |Δ lp|",
               "p99 |Δ lp|", "max |Δ lp|", "identical generations", "tokenization mismatches"], rows)
    doc.image(figures.drift_by_layer(drift, figdir), "Relative error and cosine distance by layer",
              "figures/drift_by_layer.png")
    doc.image(figures.drift_by_position(drift, figdir), "Final-layer drift by token position",
              "figures/drift_by_position.png")
    for cell, s in drift.items():
        worst = s.get("worst_tokens", [])[:5]
        if worst:
            text = "\n".join(f"|Δ| {_f(w['abs_delta'])} prompt {w['prompt']} pos {w['position']}: "
                             f"{w['context']!r} -> {w['token']!r}" for w in worst)
            doc.raw(f"Worst tokens, {md_escape(cell)}:\n{md_fence(text)}",
                    f"<p>Worst tokens, {html.escape(cell)}:</p><pre>{html.escape(text)}</pre>")


def _flipped_samples(doc: Doc, flipped: pd.DataFrame, k: int = 10) -> None:
    if flipped.empty:
        return
    doc.h(2, "Most consequential flipped samples")
    f = flipped[flipped["kind"] == "cross"].copy()
    if f.empty:
        return
    gold = pd.to_numeric(f["gold"], errors="coerce")
    f["consequence"] = (f["ref_choice"] == gold).astype(int) + (f["cell_choice"] == gold).astype(int)
    f = f.sort_values(["consequence", "ref_margin"], ascending=[False, False]).head(k)
    for r in f.itertuples():
        choices = list(r.choices) if r.choices is not None else []
        lines = []
        for i, ch in enumerate(choices):
            mark = " ".join(x for x, ok in (("gold", i == r.gold), ("ref", i == r.ref_choice),
                                            ("cell", i == r.cell_choice)) if ok)
            lines.append(f"  {i}: {str(ch)[:120]!r}" + (f"   <- {mark}" if mark else ""))
        text = (f"{r.task} doc {r.doc_id} · {r.cell}: reference margin {_f(r.ref_margin)}, max |Δ| "
                f"{_f(r.max_abs_delta)}\n  prompt: {str(r.context)[-300:]!r}\n" + "\n".join(lines))
        doc.raw(md_fence(text), f"<pre>{html.escape(text)}</pre>")
