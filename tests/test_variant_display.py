"""A variant's difference wherever its verdict is, and ``--compare A:B`` (issue 29, item 1's display).

Synthetic run folders (no engines, ``tests/synthetic.py``): a reference ``hf-fp32``, a plain ``vllm-bf16`` and a
named variant ``vllm-fp8`` (``quantization=fp8`` and an environment variable, other software versions, made in
an earlier run). Each place a verdict is shown must say what the cell changes against its reference: the
terminal table, report.md and report.html, the JUnit file, verdicts.json and the markdown summary; the report
also names the versions that differ and where a reused cell was made. ``--compare`` adds gating "pair" rows
(staged runs included), and refuses unknown names, self-pairs and repeats of a cross comparison in one line.
"""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from conftest import evalparity_here, one_line_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console
from synthetic import add_variant, make_lm_eval_dir, make_run, reseal, write_cell_record
from verdict_schema import check_verdicts

from evalparity import signoff, variants
from evalparity.cli.verdict_table import print_verdicts
from evalparity.errors import EvalParityError
from evalparity.printable import visible
from evalparity.report import ci, md_escape
from evalparity.rundir import layout
from evalparity.samples import read_table, write_table
from evalparity.spec import RunSpec
from evalparity.stats.options import StatsOptions, parse_compare

REF, PLAIN, FP8 = "hf-fp32", "vllm-bf16", "vllm-fp8"
FP8_ARGS = {"quantization": "fp8"}
FP8_ENV = {"VLLM_BATCH_INVARIANT": "1"}
VERSIONS = {REF: {"torch": "2.8.0", "transformers": "4.56.0", "lm_eval": "0.4.9"},
            PLAIN: {"torch": "2.8.0", "transformers": "4.56.0", "lm_eval": "0.4.9", "vllm": "0.10.1"},
            FP8: {"torch": "2.8.0", "transformers": "4.57.1", "lm_eval": "0.4.9", "vllm": "0.11.0"}}
REUSED = {"run_dir": "/runs/2026-01-01-reference", "cell": "vllm-fp8-old", "made": "2026-01-01T10:00:00+0000"}


def variant_run(root: Path, *, docs: int = 80, fp8_drift: float = 0.05) -> Path:
    """The synthetic run of the module's docstring: versions in every record, the variant reused."""
    make_run(root, n_tasks=2, cells=[REF, PLAIN], docs_per_task=docs, group="syn", drift={PLAIN: 0.02})
    add_variant(root, FP8, PLAIN, args=FP8_ARGS, env=FP8_ENV, drift=fp8_drift, versions=VERSIONS[FP8],
                reused_from=REUSED)
    spec = RunSpec.from_json(json.loads(layout.spec_file(root).read_text()))
    for name in (REF, PLAIN):
        folder = layout.cell_dir(root, name)
        write_cell_record(folder, spec, name, len(read_table(layout.table(folder))), versions=VERSIONS[name])
    return root


def cli(root: Path, *args: str) -> tuple[int, str, str]:
    proc = evalparity_here("report", str(root), "--no-fail-on-inconclusive", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """``evalparity report --compare vllm-bf16:vllm-fp8`` with JUnit and summary: the run, its verdicts.json,
    report.md, report.html, the JUnit and summary texts, and the terminal's output."""
    tmp = tmp_path_factory.mktemp("variant")
    root = variant_run(tmp / "run")
    junit, summary = tmp / "junit.xml", tmp / "summary.md"
    code, out, err = cli(root, "--compare", f"{PLAIN}:{FP8}", "--junit-xml", str(junit), "--summary-md", str(summary))
    assert code in (0, 3, 4), err[-3000:]
    doc = check_verdicts(layout.verdicts_file(root))
    md = (root / "report" / "report.md").read_text()
    html = (root / "report" / "report.html").read_text()
    return root, doc, md, html, junit.read_text(), summary.read_text(), out + err


def expected(reference: str, cell: str, root: Path) -> str:
    """``variants.difference`` of the two cells' records as written: what every place must show."""
    recs = {n: json.loads(layout.cell_record(layout.cell_dir(root, n)).read_text()) for n in (reference, cell)}
    return variants.difference(recs[reference], recs[cell])


# ---------------------------------------------------------------- verdicts.json
def test_every_comparison_record_says_what_its_cell_changes(reported):
    root, doc, *_ = reported
    assert doc["schema"] == "evalparity.verdicts/4"
    pairs = {(c["kind"], c["reference"], c["cell"]): c["differs"] for c in doc["comparisons"]}
    assert pairs[("cross", REF, FP8)] == expected(REF, FP8, root) == (
        "vllm, bf16, quantization=fp8, env.VLLM_BATCH_INVARIANT=1")
    assert pairs[("cross", REF, PLAIN)] == expected(REF, PLAIN, root) == "vllm, bf16"
    assert pairs[("pair", PLAIN, FP8)] == expected(PLAIN, FP8, root) == "quantization=fp8, env.VLLM_BATCH_INVARIANT=1"
    assert doc["options"]["compare"] == [[PLAIN, FP8]]


def test_compare_adds_gating_pair_rows_in_the_family(reported):
    _, doc, *_ = reported
    rows = [c for c in doc["comparisons"] if c["kind"] == "pair"]
    assert rows and all((c["reference"], c["cell"]) == (PLAIN, FP8) for c in rows)
    gating = [c for c in rows if c["gating"]]
    # the group's pooled acc gates (its members are shown under it), as for the cross comparisons
    assert [(c["task"], c["level"], c["metric"]) for c in gating] == [("syn", "group", "acc")]
    assert doc["sign_off"]["gating"] == 3  # two cells against the reference, and the pair
    cross = next(c for c in doc["comparisons"] if c["kind"] == "cross" and c["cell"] == FP8 and c["gating"])
    assert gating[0]["p_beyond_adjusted"] >= gating[0]["p_beyond"]  # adjusted with the others (holm)
    assert cross["n"] == gating[0]["n"]


def test_without_compare_there_are_no_pair_rows_and_the_same_cross_verdicts(reported, tmp_path):
    root, doc, *_ = reported
    other = variant_run(tmp_path / "run")
    code, _, err = cli(other)
    assert code in (0, 3, 4), err[-3000:]
    plain = check_verdicts(layout.verdicts_file(other))
    assert not [c for c in plain["comparisons"] if c["kind"] == "pair"]
    key = lambda c: (c["kind"], c["cell"], c["task"], c["metric"])  # noqa: E731
    with_pair = {key(c): (c["effect"], c["differs"]) for c in doc["comparisons"] if c["kind"] == "cross"}
    assert {key(c): (c["effect"], c["differs"]) for c in plain["comparisons"]} == with_pair


# ---------------------------------------------------------------- the terminal
def test_the_terminal_table_says_each_pairs_difference_once(reported):
    root, doc, *_, terminal = reported
    for cell, ref in ((FP8, REF), (PLAIN, REF), (FP8, PLAIN)):
        line = f"{cell} vs {ref} changes: {expected(ref, cell, root)}"
        assert " ".join(line.split()) in " ".join(terminal.split()), terminal
    assert terminal.count(f"{FP8} vs {PLAIN} changes:") == 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=40), st.text(max_size=200)), min_size=1, max_size=6,
                unique_by=lambda x: visible(x[0])))
def test_the_terminal_table_stays_in_80_columns(cells):
    rows = [{"task": "hellaswag", "level": "task", "filter": "none", "metric": "acc", "cell": name,
             "reference": REF, "verdict": "EQUIVALENT", "gating": True, "effect": 0.001, "ci_low": -0.004,
             "ci_high": 0.006, "n": 4000, "n_needed": None, "unit": "fraction", "differs": differs}
            for name, differs in cells]
    out = io.StringIO()
    print_verdicts(Console(file=out, width=80, force_terminal=False), {"sign_off": {"status": "PASS"},
                                                                       "comparisons": rows})
    text = out.getvalue()
    assert max(cell_len(line) for line in text.splitlines()) <= 80  # terminal cells: a combining mark takes none
    flat = "".join(text.split())
    for name, differs in cells:
        if differs:  # shown as written, control characters written out; wrapped where the line is long
            assert "".join(f"{visible(name)} changes: {visible(differs)}".split()) in flat


# ---------------------------------------------------------------- the report
def test_report_md_shows_the_difference_at_each_verdict(reported):
    root, _, md, *_ = reported
    flat = " ".join(md.split())
    for ref, cell in ((REF, FP8), (REF, PLAIN), (PLAIN, FP8)):
        text = md_escape(expected(ref, cell, root))
        column = cell if ref == REF else f"{cell} vs {ref}"
        assert f"- {md_escape(column)}: {text}" in md  # under the verdict matrix
        assert f"/ {md_escape(column)} (changes: {text}):" in flat  # each gating verdict's reason
        assert f"| {md_escape(cell)} | {md_escape(ref)} |" in md  # the compared cells' table
    head = next(line for line in md.splitlines() if line.startswith("| task | metric |"))
    assert head.endswith(f"| {md_escape(FP8)} vs {md_escape(PLAIN)} |")  # the pair's column, after the cells


def test_report_names_versions_that_differ_and_where_a_reused_cell_was_made(reported):
    _, _, md, html, *_ = reported
    section = md.split("## Compared cells")[1].split("\n## ")[0]
    rows = {tuple(x.strip() for x in line.strip("|").split("|")[:3]): line for line in section.splitlines()
            if line.startswith("| vllm")}
    assert "transformers 4.56.0 → 4.57.1, vllm 0.10.1 → 0.11.0" in rows[(FP8, PLAIN, "--compare")]
    assert "transformers 4.56.0 → 4.57.1 |" in rows[(FP8, REF, "against the reference")]  # vllm: one side only
    assert rows[(PLAIN, REF, "against the reference")].rstrip().endswith("| none |")
    said = (f"{FP8} was not scored in this run: it is cell {REUSED['cell']} of {REUSED['run_dir']}, made "
            f"{REUSED['made']}.")
    assert md_escape(said) in " ".join(section.split())
    assert said in html and f"cell {REUSED['cell']}" not in md.split("## Compared cells")[0]


def test_report_html_shows_it_too(reported):
    root, _, _, html, *_ = reported
    for ref, cell in ((REF, FP8), (PLAIN, FP8)):
        text = expected(ref, cell, root)
        assert f'<span class="changes">changes: {text}</span>' in html
        assert f"<li>{cell if ref == REF else f'{cell} vs {ref}'}: {text}</li>" in html


def test_markdown_and_html_say_the_same(reported):
    """The check tests/test_report_markdown.py makes of the hostile report, on this one."""
    from html import escape as html_escape

    from test_report_markdown import Page

    _, _, md, html, *_ = reported
    page, flat = Page(html), " ".join(md.split())
    for tag in ("h1", "h2", "h3", "p", "th", "td", "span", "li"):
        for text in page.text.get(tag, []):
            fold = text.removesuffix(" (the group's pooled verdict above gates)")
            shown = html_escape(fold, quote=False) if fold != text else md_escape(text)
            assert " ".join(shown.split()) in flat, (tag, text)


# ---------------------------------------------------------------- JUnit and the summary
def test_junit_has_the_difference_as_a_property_and_in_its_text(reported):
    root, doc, _, _, junit, *_ = reported
    cases = {c.get("name"): c for c in ET.fromstring(junit).iter("testcase")}
    gating = [c for c in doc["comparisons"] if c["gating"]]
    assert len(cases) == len(gating)
    for c in gating:
        case = cases[ci.testcase_name(c)]
        assert case[0].tag == "properties"
        assert {p.get("name"): p.get("value") for p in case.iter("property")} == {"evalparity.differs": c["differs"]}
        assert f"{c['cell']} changes: {c['differs']}" in case.find("system-out").text
        outcome = next((case.find(k) for k in ("failure", "skipped") if case.find(k) is not None), None)
        if outcome is not None:
            assert c["differs"] in (outcome.text or "") + outcome.get("message", "")


def test_junit_without_a_difference_has_no_property():
    doc = {"sign_off": {"status": "PASS", "reason": "ok"},
           "comparisons": [{"id": 0, "task": "t", "metric": "acc", "cell": "b", "reference": "a", "gating": True,
                            "verdict": "EQUIVALENT", "reason": "r", "effect": 0.0, "ci_low": 0.0, "ci_high": 0.0,
                            "n": 10, "unit": "fraction"}]}  # a schema-3 file: no differs at all
    root = ET.fromstring(ci.junit_document(doc, version="x"))
    assert not list(root.find("testsuite").find("testcase").iter("property"))
    assert "changes:" not in ci.junit_document(doc, version="x") and "Compared cells" not in ci.summary_document(doc)


def test_the_summary_lists_each_compared_pair(reported):
    root, *_, summary, _ = reported
    for ref, cell in ((REF, FP8), (REF, PLAIN), (PLAIN, FP8)):
        assert f"- {md_escape(cell)} vs {md_escape(ref)} changes: {md_escape(expected(ref, cell, root))}" in summary


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(max_size=300), min_size=1, max_size=40))
def test_hostile_and_many_differences_keep_junit_valid_and_the_summary_short(texts):
    comps = [{"id": i, "task": "t", "metric": "acc", "cell": f"c{i}", "reference": "r", "gating": True,
              "verdict": "DIFFERENT", "reason": "far", "effect": 0.1, "ci_low": 0.05, "ci_high": 0.15, "n": 100,
              "unit": "fraction", "differs": t} for i, t in enumerate(texts)]
    doc = {"sign_off": {"status": "FAIL", "reason": "x"}, "comparisons": comps}
    root = ET.fromstring(ci.junit_document(doc, version="x").encode("utf-8"))
    values = [p.get("value") for p in root.iter("property") if p.get("name") == "evalparity.differs"]
    assert len(values) == sum(1 for t in texts if t)
    summary = ci.summary_document(doc)
    assert len(summary) <= ci.SUMMARY_LIMIT
    listed = [line for line in summary.splitlines() if line.startswith("- c")]
    more = [line for line in summary.splitlines() if line.startswith("- and ")]
    n = sum(1 for t in texts if t)
    assert 0 < len(listed) <= min(n, ci.PAIRS_SHOWN) or n == 0
    assert (more == [f"- and {n - len(listed):,} more pairs (the report lists every one)"]) == (len(listed) < n)


# ---------------------------------------------------------------- --compare: what is refused, in one line
def test_report_refuses_a_pair_naming_no_cell_of_the_run(reported):
    root = reported[0]
    for pair, words in ((f"{PLAIN}:nope", ["nope is not a cell of this run", REF, PLAIN, FP8]),
                        (f"{FP8}:{FP8}", ["compared with itself"]),
                        (f"{REF}:{FP8}", ["already compared with the reference", "drop this --compare"]),
                        (f"{FP8}:{REF}", ["already compared with the reference"]),
                        (PLAIN, ["write REFERENCE:CELL"])):
        proc = evalparity_here("report", str(root), "--compare", pair)
        line = one_line_error(proc)
        assert proc.returncode == 2 and all(w in line for w in words), line


def test_a_pair_given_twice_is_refused():
    with pytest.raises(EvalParityError, match="given twice"):
        parse_compare([f"{PLAIN}:{FP8}", f" {PLAIN} : {FP8} "])


@given(st.text(max_size=30))
def test_compare_is_two_names_or_one_line(text):
    try:
        pairs = parse_compare([text])
    except EvalParityError as err:
        assert "\n" not in str(err) and "--compare" in str(err)
        return
    (a, b), = pairs
    assert a and b and a != b and f"{a}:{b}" == ":".join(x.strip() for x in text.split(":"))


def test_run_checks_the_pairs_before_any_cell_starts():
    """``run`` calls ``choose_reference`` with its cells before it starts any: the pairs are checked there,
    against the reference it falls back to as well."""
    opts = StatsOptions.from_cli(compare=[f"{PLAIN}:{FP8}"])
    assert signoff.choose_reference(opts, [REF, PLAIN, FP8], fallback=True).pairs == ((PLAIN, FP8),)
    with pytest.raises(EvalParityError, match=f"{FP8} is not a cell of this run: use one of {REF}, {PLAIN}$"):
        signoff.choose_reference(opts, [REF, PLAIN], fallback=True)
    with pytest.raises(EvalParityError, match="already compared with the reference vllm-bf16"):
        signoff.choose_reference(opts, [PLAIN, FP8], fallback=True)  # hf-fp32 absent: vllm-bf16 is the reference


def test_compare_of_lm_eval_outputs_takes_pairs_too(tmp_path):
    """``evalparity compare`` checks its pairs against the cells it imported (``choose_reference``)."""
    paths = [make_lm_eval_dir(tmp_path / x, model=m, dtype=d, flip=f, seed=i)
             for i, (x, m, d, f) in enumerate((("a", "hf", "float32", 0), ("b", "vllm", "bfloat16", 2),
                                               ("c", "vllm", "float16", 5)))]
    proc = evalparity_here("compare", *map(str, paths), "--out", str(tmp_path / "o"),
                           "--compare", "vllm-bf16:vllm-fp16")
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]
    doc = check_verdicts(layout.verdicts_file(tmp_path / "o"))
    assert [(c["reference"], c["cell"]) for c in doc["comparisons"] if c["kind"] == "pair" and c["gating"]] == [
        ("vllm-bf16", "vllm-fp16")]
    line = one_line_error(evalparity_here("compare", *map(str, paths), "--out", str(tmp_path / "o2"), "--compare",
                                          "vllm-bf16:x"))
    assert "x is not a cell of this run: use one of hf-fp32, vllm-bf16, vllm-fp16" in line


def test_plan_takes_compare_and_plans_the_pair(reported, tmp_path):
    root = reported[0]
    proc = evalparity_here("plan", str(root), "--compare", f"{PLAIN}:{FP8}", "--json", str(tmp_path / "p.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    planned = json.loads((tmp_path / "p.json").read_text())["comparisons"]
    assert {(c["reference"], c["cell"]) for c in planned} >= {(PLAIN, FP8), (REF, FP8)}
    one_line_error(evalparity_here("plan", str(root), "--compare", f"{PLAIN}:nope", "--json", str(tmp_path / "q.json")))


# ---------------------------------------------------------------- a staged run decides on pairs too
def staged_run(root: Path, docs: int, fp8_drift: float) -> Path:
    """The variant run as a staged run after its first look: a plan of one task of ``docs`` docs (looks
    from 500), and every cell's table cut to the first look's docs in the staged order."""
    from evalparity.staging import make_plan

    make_run(root, n_tasks=1, cells=[REF, PLAIN], docs_per_task=docs, group="syn", drift={})
    add_variant(root, FP8, PLAIN, args=FP8_ARGS, drift=fp8_drift, seed=3)
    task = "syn_subject_00"
    plan = make_plan({task: [(task, docs)]}, seed=1, first=500)
    first = set(plan.look_docs(task, 0)[task])
    spec = json.loads(layout.spec_file(root).read_text())
    layout.spec_file(root).write_text(json.dumps(spec | {"staging": plan.to_json()}))
    for name in (REF, PLAIN, FP8):
        path = layout.table(layout.cell_dir(root, name))
        table = read_table(path)
        write_table(table[table["doc_id"].isin(first)].reset_index(drop=True), path)
    reseal(root)
    return root


def test_a_staged_runs_look_decides_on_the_pairs_too(tmp_path):
    from evalparity.staging import staging_of
    from evalparity.stats.compare import compute, load_cells, look

    root = staged_run(tmp_path / "run", docs=4000, fp8_drift=0.9)
    opts = StatsOptions.from_cli(compare=[f"{PLAIN}:{FP8}"], margin="2pp")
    tables, metas, _ = load_cells(root)
    trace = look(tables, metas, opts, staging_of(root))
    plain = look(tables, metas, StatsOptions.from_cli(margin="2pp"), staging_of(root))
    (unit,) = trace.units.values()
    (unit_plain,) = plain.units.values()
    assert len(unit.results) == len(unit_plain.results) + 1  # one gating row more: the pair's acc
    summary = compute(root, opts)
    rows = summary.comparisons
    pair = rows[(rows["kind"] == "pair") & rows["gating"]].iloc[0]
    # decided by the staged rule at the first look: a right answer lost on 90 % of the docs is DIFFERENT at once
    assert pair["verdict"] == "DIFFERENT" and pair["staged_look"] == 1 and pair["staged_looks"] > 1
    assert pair["differs"] == "quantization=fp8" and pair["n"] == 500
    assert np.isclose(pair["effect"], -(tables[PLAIN]["m:acc"].sum() - tables[FP8]["m:acc"].sum()) / 4 / 500)
