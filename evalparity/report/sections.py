"""One builder per report section: statistics tables in, formatted ``context`` values out.

Pure functions of DataFrames and dicts (no files, no figures; ``build`` reads and draws), named after the
section they fill. Which rows each section shows and how each column is formatted is decided here; the
wording around them is in the templates.
"""

from __future__ import annotations

import pandas as pd

from evalparity.report.context import (
    Compared,
    Drift,
    Figure,
    Fold,
    LegendEntry,
    Matrix,
    MatrixCell,
    MatrixRow,
    Method,
    Paired,
    PairedRow,
    SettingDifference,
    Setup,
    SideBySide,
    SignOff,
    Table,
    VerdictMatrix,
    WorstTokens,
)
from evalparity.report.formatting import (
    MEANING,
    TONES,
    beyond_noise,
    ci,
    count,
    effect,
    interval,
    level,
    metric_label,
    noise_mark,
    num,
)
from evalparity.stats.next_step import next_step as shared_next_step

# How many flipped samples the last section prints, the most consequential first.
FLIPPED_SHOWN = 10

# Settings whose values must agree between cells for a difference to be drift and not setup.
MUST_AGREE = ("bos_added", "max_length", "max_gen_toks", "num_fewshot", "limit")

# Verdicts that settle a comparison; any other leaves it open, and the sign-off's next step is more docs.


def sign_off(verdicts: dict, comp: pd.DataFrame) -> SignOff:
    """The sign-off as ``verdicts.json`` records it, the gating comparisons counted per verdict, and the next
    step that the comparisons' own reasons would otherwise each repeat."""
    so = verdicts["sign_off"]
    staging = verdicts.get("staging") or {}
    staged = [(t["task"], f"stopped at look {t['stopped_at_look']} of {t['of_looks']}, {t['docs']:,} of "
                          f"{t['docs_available']:,} docs scored ({t['why']})") for t in staging.get("tasks", [])]
    gating = comp[comp["gating"]] if "gating" in comp else comp
    counts = so.get("counts") or (gating["verdict"].value_counts().to_dict() if "verdict" in gating else {})
    return SignOff(so["status"], so["reason"], [(i["cell"], i["why"]) for i in so.get("incomplete_cells", [])],
                   [(i["task"], ", ".join(i["missing_from"])) for i in so.get("tasks_not_compared", [])],
                   staged, staging.get("off"), [(v, int(n)) for v, n in counts.items() if n],
                   next_step(so["status"], gating))


def next_step(status: str, gating: pd.DataFrame) -> str | None:
    """What to do about a sign-off that is not a PASS (``stats.next_step``: the sentence the terminal prints)."""
    return shared_next_step(status, gating.to_dict("records")) if not gating.empty else None


def method(options: dict) -> Method:
    a = options["alpha"]
    return Method(
        reference=options["reference"], worse=options.get("direction") == "worse",
        margin=f"{100 * options['margin']:g}",
        metric_margins=[(k, f"{v:g}") for k, v in (options.get("metric_margins") or {}).items()],
        ll_tolerance=f"{options['ll_tolerance']:g}", ci_percent=f"{100 * (1 - 2 * a):g}", alpha=f"{a:g}",
        multiple=options["multiple"])


def matrix_cell(r, noise_marked: bool) -> MatrixCell:
    """A comparison as the matrix shows it: verdict, Δ with its interval, n and the interval's level."""
    bounds = interval(r)
    lvl = level(r)
    return MatrixCell(str(r.verdict), effect(r) + ("" if bounds == "–" else f" {bounds}"),
                      f"n = {count(r.n)}" + (f" · {lvl} CI" if lvl else ""), noise_mark(r, noise_marked))


def column(r) -> str:
    """A comparison's column in the matrix and its name elsewhere: the cell, or ``B vs A`` for a pair whose
    reference is not the run's (``--compare A:B``)."""
    return str(r.cell) if r.kind != "pair" else f"{r.cell} vs {r.reference}"


def changes(r) -> str:
    """What the comparison's cell changes against its reference (``differs``), "" when nothing or not
    recorded (statistics written before the field existed)."""
    text = getattr(r, "differs", "")
    return text if isinstance(text, str) else ""


def verdict_matrix(comp: pd.DataFrame) -> VerdictMatrix | None:
    """Score comparisons against the reference and ``--compare`` pairs, tasks x columns; None when there
    are none."""
    c = comp[comp["kind"].isin(["cross", "pair"]) & (comp["metric"] != "loglikelihood")]
    noise_marked = bool(comp["beyond_noise"].notna().any()) if "beyond_noise" in comp else False
    if c.empty:
        return None
    c = c.assign(column=[column(r) for r in c.itertuples()])
    cross = sorted(c.loc[c["kind"] == "cross", "column"].unique())
    cells = cross + sorted(set(c["column"]) - set(cross))

    def matrix(part: pd.DataFrame) -> Matrix:
        rows = []
        for (task, metric, filt), g in part.groupby(["task", "metric", "filter"], sort=True):
            by_cell = {r.column: r for r in g.itertuples()}
            rows.append(MatrixRow(str(task), metric_label(metric, filt),
                                  [matrix_cell(by_cell[x], noise_marked) if x in by_cell else None for x in cells]))
        return Matrix(cells, rows)

    top = c[(c["level"] == "group") | (c["group"] == c["task"])]
    members = c[(c["level"] == "task") & (c["group"] != c["task"])]
    folds = [Fold(str(group), gm["task"].nunique(), matrix(gm)) for group, gm in members.groupby("group", sort=True)]
    shown = set(c["verdict"])
    legend = [LegendEntry(v, MEANING[v]) for v in TONES if v != "NO MARGIN" or v in shown]
    said = {r.column: changes(r) for r in c.itertuples() if changes(r)}
    return VerdictMatrix(matrix(top), folds, noise_marked, legend, [(x, said[x]) for x in cells if x in said],
                         bool((c["kind"] == "pair").any()))


def _bos(al: dict, metas: dict[str, dict]) -> str:
    """The BOS policy asked for and, read back from each loaded model, whether requests did start with BOS:
    'tokenizer default' alone would not say what was used."""
    asked = {True: "added", False: "not added", None: "tokenizer default"}.get(al.get("add_bos_token"),
                                                                              str(al.get("add_bos_token")))
    read = {n: (m.get("settings") or {}).get("bos_added") for n, m in metas.items()
            if "bos_added" in (m.get("settings") or {})}
    if not read:
        return asked
    kinds = set(read.values())
    if len(kinds) == 1:
        value = kinds.pop()
        used = "not read back" if value is None else f"{'added' if value else 'not added'} in every cell"
    else:
        used = "; ".join(f"{label} in {', '.join(n for n, v in read.items() if v is value)}"
                         for value, label in ((True, "added"), (False, "not added"), (None, "not read back"))
                         if value in kinds)
    return f"{asked}; used: {used}"


def _chat(al: dict) -> str:
    if not al.get("apply_chat_template"):
        return "off (lm-eval's plain prompts)"
    extra = [f"system instruction {al['system_instruction']!r}"] if al.get("system_instruction") else []
    if al.get("fewshot_as_multiturn") is not None:
        extra.append(f"few-shot as multi-turn {al['fewshot_as_multiturn']}")
    return "the tokenizer's chat template" + (f" ({', '.join(extra)})" if extra else "")


def _run_table(spec: dict, metas: dict[str, dict]) -> Table:
    if not spec:
        return Table(["setting", "value"], [["run", "imported lm-eval outputs (evalparity compare)"]])
    al = spec.get("alignment", {})
    return Table(["setting", "value"], [
        ["model", str(spec.get("model"))], ["tasks", ", ".join(spec.get("tasks", []))],
        ["limit", "none: every doc" if spec.get("limit") is None else str(spec.get("limit"))],
        ["per-task limits", ", ".join(f"{k}={v}" for k, v in spec.get("task_limits", [])) or "none"],
        ["num_fewshot", "each task's own" if spec.get("num_fewshot") is None else str(spec.get("num_fewshot"))],
        ["device", str(spec.get("device"))], ["seed", str(al.get("seed"))],
        ["HF log-softmax in fp32", str(al.get("softmax_fp32"))], ["BOS token", _bos(al, metas)],
        ["max length (both)", str(al.get("max_length"))], ["vLLM prefix caching", str(al.get("prefix_caching"))],
        ["true fp32 (no TF32)", str(al.get("true_fp32"))],
        ["max generated tokens", str(al.get("max_gen_toks") or "each task's own")],
        ["chat template", _chat(al)],
    ])


# cell.json's versions that the cells table leaves out; the rest are the common stack (below) and what each
# backend records of its own (``Backend.versions``, e.g. vllm), in between
_VERSIONS_LEFT_OUT = ("python", "evalparity", "datasets", "numpy")
_VERSIONS_FIRST, _VERSIONS_LAST = ("torch", "transformers"), ("lm_eval",)
# Attention backends a record names without saying which kernel ran (vLLM's "auto" is its config, not its pick).
_ATTENTION_UNKNOWN = ("auto", "see cell.log", "unknown", "None", "")
# Precision switches of CUDA and Triton: they mean nothing on a CPU cell, whose record still holds them.
_GPU_ONLY = ("cuda_", "cudnn_", "triton_")


def _versions(ver: dict) -> str:
    own = [k for k in ver if k not in (*_VERSIONS_LEFT_OUT, *_VERSIONS_FIRST, *_VERSIONS_LAST)]
    return ", ".join(f"{k} {ver.get(k, '?')}" for k in (*_VERSIONS_FIRST, *own, *_VERSIONS_LAST))


def _attention(m: dict) -> str:
    """The attention backend the loaded model reports (``precision.attention_backend``), and plainly when the
    record does not say which kernel ran."""
    used = str((m.get("precision") or {}).get("attention_backend", ""))
    return f"not recorded ({used or 'no record'}: see the cell's log)" if used in _ATTENTION_UNKNOWN else used


def _cell_row(name: str, m: dict) -> list[str]:
    ver = m.get("versions", {})
    # device_name and source are free text of the record (unverified): text whatever was written there
    return [name, m.get("status", "?"), str(m.get("batch_size", "–")), str(m.get("device_name") or "–"),
            f"{num(m.get('load_s'))} / {num(m.get('eval_s'))}",
            num(m.get("peak_rss_gib")) + (f" / GPU {num(m['peak_gpu_gib'])}" if "peak_gpu_gib" in m else ""),
            _attention(m) if m.get("precision") else "–", _versions(ver) if ver else str(m.get("source") or "–")]


def setting_text(value) -> str:
    """A recorded setting as text, whole (the page wraps it): a mapping as 'key=value' pairs."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={setting_text(v)}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(setting_text(v) for v in value) or "none"
    return str(value)


def _unset(key: str, value) -> bool:
    """Whether a recorded value means "not set": None, or the text "None" that older records and torch's CPU
    build (``torch.version.cuda``) wrote for one. Not for an environment variable (``$NAME``,
    ``hostenv.steering_variables``): its value is the text it was set to, "None" included, so that a cell where
    it was set to "None" and one where it was unset show as different."""
    return value is None or (value == "None" and not key.startswith("$"))


def side_by_side(records: dict[str, dict], label: str) -> SideBySide | None:
    """``records`` (cell -> key -> value) as what every cell shares and what differs; keys unset in every
    cell are only named."""
    if not records:
        return None
    keys = sorted({k for r in records.values() for k in r})
    shared, differing, unset = [], [], []
    for k in keys:
        values = [None if _unset(k, r.get(k)) else setting_text(r[k]) for r in records.values()]
        if all(v is None for v in values):
            unset.append(k)
        elif len(records) > 1 and len(set(values)) == 1:
            shared.append([k, values[0]])
        else:
            differing.append([k, *["–" if v is None else v for v in values]])
    return SideBySide(Table([label, "every cell"], shared) if shared else None,
                      Table([label, *records], differing) if differing else None, unset)


def _settings(m: dict) -> dict:
    """A cell's effective settings and its precision switches (those of CUDA and Triton only on a GPU)."""
    gpu = m.get("device") not in ("cpu",)
    prec = {f"precision: {k}": v for k, v in (m.get("precision") or {}).items()
            if k != "attention_backend" and (gpu or not k.startswith(_GPU_ONLY))}
    return {k: v for k, v in (m.get("settings") or {}).items() if k != "seeds"} | prec


def setup(spec: dict, metas: dict[str, dict]) -> Setup:
    """The run's spec, each cell's environment (``cell.json``) and the cells' effective settings."""
    cells = Table(["cell", "status", "batch", "device", "load / eval s", "peak memory GiB", "attention backend",
                   "versions"], [_cell_row(name, m) for name, m in metas.items()])
    settings = {n: m.get("settings", {}) for n, m in metas.items() if m.get("settings")}
    differences = []
    for key in MUST_AGREE:
        values = {str(s.get(key)) for s in settings.values() if key in s}
        if len(values) > 1:
            differences.append(SettingDifference(key, ", ".join(sorted(values))))
    envs = {n: m["environment"] for n, m in metas.items() if isinstance(m.get("environment"), dict)}
    return Setup(_run_table(spec, metas), cells, differences,
                 side_by_side({n: _settings(m) for n, m in metas.items() if m.get("settings")}, "setting"),
                 side_by_side(envs, "environment"))


def paired(comp: pd.DataFrame) -> Paired:
    """Every gating comparison with its estimate, interval, p-values, verdict and reason, and what its cell
    changes against its reference."""
    noise_marked = bool(comp["beyond_noise"].notna().any()) if "beyond_noise" in comp else False
    rows = [PairedRow(str(r.task), metric_label(r.metric, r.filter), column(r), count(r.n),
                      f"{num(r.reference_score)} → {num(r.cell_score)}", effect(r), ci(r), num(r.p_equivalence),
                      num(r.p_beyond_adjusted), num(r.p_shift_adjusted), beyond_noise(r), str(r.verdict),
                      str(r.reason), f"changes: {changes(r)}" if changes(r) else "")
            for r in comp[comp["gating"]].itertuples()]
    return Paired(rows, noise_marked)


KIND_SHOWN = {"cross": "against the reference", "pair": "--compare", "noise_floor": "noise floor",
              "precision_mode": "precision mode"}


def version_changes(reference: dict, cell: dict) -> str:
    """The software versions recorded by both cells that differ (``transformers 4.56.0 → 4.57.1``), or
    "none"; a package only one cell records (a backend's own) is no difference between the two."""
    a, b = reference.get("versions") or {}, cell.get("versions") or {}
    if not a or not b:
        return "not recorded"
    out = [f"{k} {a[k]} → {b[k]}" for k in sorted(set(a) & set(b)) if str(a[k]) != str(b[k])]
    return ", ".join(out) or "none"


def reused_text(name: str, meta: dict) -> str | None:
    """Where and when a cell not made in this run was made (``reused_from`` in its record: run_dir, cell,
    made), as one sentence; None for a cell made here."""
    src = meta.get("reused_from")
    if not isinstance(src, dict):
        return None
    where = f"cell {src.get('cell') or name} of {src.get('run_dir') or 'an earlier run'}"
    return f"{name} was not scored in this run: it is {where}, made {src.get('made') or 'at a time not recorded'}."


def compared(comp: pd.DataFrame, metas: dict[str, dict]) -> Compared | None:
    """Each pair of compared cells once, in the comparisons' order: its kind, what the cell changes, the
    versions that differ; and a sentence for each of their cells made elsewhere (``reused_from``)."""
    if comp.empty:
        return None
    rows, names = [], []
    for r in comp.drop_duplicates(["kind", "reference", "cell"]).itertuples():
        ref, cell = metas.get(str(r.reference)) or {}, metas.get(str(r.cell)) or {}
        rows.append([str(r.cell), str(r.reference), KIND_SHOWN.get(r.kind, str(r.kind)), changes(r) or "nothing",
                     version_changes(ref, cell)])
        names += [n for n in (str(r.reference), str(r.cell)) if n not in names]
    reused = [t for t in (reused_text(n, metas.get(n) or {}) for n in names) if t]
    return Compared(Table(["cell", "against", "comparison", "what the cell changes", "versions that differ"], rows),
                    reused)


def deltas(d: pd.DataFrame) -> Table | None:
    """Loglikelihood drift per request, each cell against the reference and the ``--compare`` pairs; None
    when the run scored no loglikelihoods."""
    if d.empty:
        return None
    rows = [[r.task, column(r), count(r.n), f"{num(r.abs_mean)} [{num(r.abs_ci_low)}, {num(r.abs_ci_high)}]",
             f"{num(r.mean)} [{num(r.ci_low)}, {num(r.ci_high)}]",
             " / ".join(num(x) for x in (r.abs_median, r.abs_p95, r.abs_p99, r.abs_max)), num(r.wilcoxon_p),
             f"{int(r.n_nonfinite_ref)} / {int(r.n_nonfinite_cell)}"]
            for r in d[d["kind"].isin(["cross", "pair"])].itertuples()]
    return Table(["task", "cell", "requests", "mean |Δ| [95% CI]", "mean Δ [95% CI]",
                  "|Δ| median / p95 / p99 / max", "Wilcoxon p", "non-finite ref / cell"], rows)


def flips(f: pd.DataFrame) -> Table | None:
    if f.empty:
        return None
    rows = [[r.task, getattr(r, "metric", "acc"), column(r), r.kind, str(int(r.n_docs)), str(int(r.observed)),
             num(r.expected), num(r.pvalue)] for r in f.itertuples()]
    return Table(["task", "decision", "cell", "kind", "docs", "observed", "expected", "p (more than expected)"], rows)


def generations(g: pd.DataFrame) -> Table | None:
    """Greedy generations against the reference: how many are identical (token ids, then text) and where the
    others first part."""
    if g.empty:
        return None
    rows = [[r.task, column(r), r.kind, count(r.n), f"{100 * r.identical_ids:.1f}% / {100 * r.identical_text:.1f}%",
             count(r.n_diverged), num(r.median_first_divergence), count(r.n_without_ids)]
            for r in g.itertuples()]
    return Table(["task", "cell", "kind", "docs", "identical token ids / text", "diverged",
                  "median first divergence", "docs without ids"], rows)


def noise_floor(comp: pd.DataFrame) -> Table | None:
    """Repeat pairs (the noise floor) and TF32 cells against their base cell; None when the run has none."""
    nf = comp[comp["kind"].isin(["noise_floor", "precision_mode"])]
    if nf.empty:
        return None
    rows = [[r.task, metric_label(r.metric, r.filter), r.kind.replace("_", " "), f"{r.reference} vs {r.cell}",
             count(r.n), effect(r), ci(r), r.verdict or "– (yardstick)"] for r in nf.itertuples()]
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
    return (f"{r.task} doc {r.doc_id} · {column(r)}: reference margin {num(r.ref_margin)}, max |Δ| "
            f"{num(r.max_abs_delta)}\n  prompt: {str(r.context)[-300:]!r}\n" + "\n".join(lines))


def flipped_samples(flipped: pd.DataFrame) -> list[str] | None:
    """The cross-backend flips that matter most: a right answer lost (or won) first, then the clearest
    reference preference; None when the run has no flipped-samples table."""
    if flipped.empty:
        return None
    f = flipped[flipped["kind"].isin(["cross", "pair"])].copy()
    if f.empty:
        return []
    gold = pd.to_numeric(f["gold"], errors="coerce")
    f["consequence"] = (f["ref_choice"] == gold).astype(int) + (f["cell_choice"] == gold).astype(int)
    f = f.sort_values(["consequence", "ref_margin"], ascending=[False, False]).head(FLIPPED_SHOWN)
    return [_flipped_text(r) for r in f.itertuples()]
