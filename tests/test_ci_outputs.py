"""CI outputs (issue 27, item 4): ``--junit-xml`` and ``--summary-md`` of ``run``, ``report`` and ``compare``,
and the summary appended to ``$GITHUB_STEP_SUMMARY``. Made from ``verdicts.json`` only: most cases are
verdicts documents built here, with no model and no statistics; one ``compare`` of two synthetic lm-eval
outputs checks the whole path through the command line."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import evalparity, one_line_error
from synthetic import make_lm_eval_dir

from evalparity.cli.options import check_ci_outputs
from evalparity.errors import EvalParityError
from evalparity.report import ci
from evalparity.rundir import layout

junitparser = pytest.importorskip("junitparser")


# ---------------------------------------------------------------- verdicts documents, built here
def comparison(id_: int, verdict: str, *, task: str = "hellaswag", metric: str = "acc", cell: str = "vllm-bf16",
               gating: bool = True, effect: float = 0.001, ci_low: float = -0.004, ci_high: float = 0.006,
               unit: str = "fraction", level: str = "task", filter_: str = "none", n: int = 2000) -> dict:
    return {"id": id_, "task": task, "level": level, "filter": filter_, "metric": metric, "cell": cell,
            "reference": "hf-fp32", "verdict": verdict, "reason": f"{verdict} because of comparison {id_}",
            "gating": gating, "effect": effect, "ci_low": ci_low, "ci_high": ci_high, "ci_level": 0.9, "n": n,
            "unit": unit}


def document(comparisons: list[dict], status: str = "PASS", reason: str = "why", incomplete=(),
             staging: dict | None = None) -> dict:
    doc = {"schema": "evalparity.verdicts/2",
           "sign_off": {"status": status, "reason": reason,
                        "incomplete_cells": [{"cell": c, "why": w} for c, w in incomplete]},
           "comparisons": comparisons}
    if staging is not None:
        doc["staging"] = staging
    return doc


MIXED = [comparison(0, "EQUIVALENT"), comparison(1, "DIFFERENT", cell="vllm-fp16"),
         comparison(2, "INCONCLUSIVE", task="arc_easy"), comparison(3, "SHIFT", task="arc_easy", cell="hf-bf16"),
         comparison(4, "DIFFERENT", gating=False, task="mmlu_abstract_algebra"),  # a group member: not gating
         comparison(5, "EQUIVALENT", task="mmlu", level="group")]


def parse(text: str, tmp_path: Path) -> tuple[ET.Element, object]:
    """The document as ElementTree reads it (checked against the common JUnit structure) and as junitparser
    reads it."""
    root = ET.fromstring(text.encode("utf-8"))
    check_structure(root)
    path = tmp_path / "parsed.xml"
    path.write_text(text, encoding="utf-8")
    return root, junitparser.JUnitXml.fromfile(str(path))


def check_structure(root: ET.Element) -> None:
    """testsuites > testsuite > (properties, testcase*), each testcase at most one of failure, error or
    skipped, and every count attribute the count of its testcases."""
    assert root.tag == "testsuites"
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for suite in root:
        assert suite.tag == "testsuite" and suite.get("name")
        cases = suite.findall("testcase")
        assert {child.tag for child in suite} <= {"properties", "testcase"}
        counts = {"tests": len(cases), "failures": sum(c.find("failure") is not None for c in cases),
                  "errors": sum(c.find("error") is not None for c in cases),
                  "skipped": sum(c.find("skipped") is not None for c in cases)}
        for case in cases:
            assert case.get("name") and case.get("classname")
            assert sum(case.find(k) is not None for k in ("failure", "error", "skipped")) <= 1
        for k, v in counts.items():
            assert int(suite.get(k)) == v, (suite.get("name"), k)
            totals[k] += v
        props = {p.get("name"): p.get("value") for p in suite.iter("property")}
        assert props["evalparity.version"] and props["evalparity.sign_off"]
    for k, v in totals.items():
        assert int(root.get(k)) == v, k


def outcomes(xml: object) -> dict[str, str]:
    """testcase name -> passed | failure | error | skipped, as junitparser reads them."""
    out = {}
    for suite in xml:
        for case in suite:
            kinds = {type(r).__name__.lower() for r in case.result}
            out[case.name] = kinds.pop() if kinds else "passed"
    return out


# ---------------------------------------------------------------- JUnit
def test_one_testcase_per_gating_comparison_one_testsuite_per_task(tmp_path):
    root, xml = parse(ci.junit_document(document(MIXED, "FAIL")), tmp_path)
    gating = [c for c in MIXED if c["gating"]]
    assert [s.name for s in xml] == ["hellaswag", "arc_easy", "mmlu"]
    assert sum(len(list(s)) for s in xml) == len(gating)
    names = {case.name: case.classname for s in xml for case in s}
    assert names["hellaswag acc: vllm-bf16 vs hf-fp32"] == "evalparity.hellaswag"
    assert names["mmlu acc: vllm-bf16 vs hf-fp32"] == "evalparity.mmlu"
    assert not any("abstract_algebra" in n for n in names)
    props = {p.get("name"): p.get("value") for p in root.find("testsuite").iter("property")}
    assert props["evalparity.sign_off"] == "FAIL" and props["evalparity.sign_off_reason"] == "why"
    from evalparity import __version__
    assert props["evalparity.version"] == __version__
    assert "evalparity.staged_stop" not in props  # no staging section: tolerated, nothing said


@pytest.mark.parametrize("fail_on_inconclusive", [True, False])
def test_verdicts_become_passes_failures_or_skips(tmp_path, fail_on_inconclusive):
    text = ci.junit_document(document(MIXED, "FAIL"), fail_on_inconclusive=fail_on_inconclusive)
    root, xml = parse(text, tmp_path)
    got = outcomes(xml)
    unsettled = "failure" if fail_on_inconclusive else "skipped"
    assert got == {"hellaswag acc: vllm-bf16 vs hf-fp32": "passed",
                   "hellaswag acc: vllm-fp16 vs hf-fp32": "failure",
                   "arc_easy acc: vllm-bf16 vs hf-fp32": unsettled,
                   "arc_easy acc: hf-bf16 vs hf-fp32": unsettled,
                   "mmlu acc: vllm-bf16 vs hf-fp32": "passed"}
    different = root.find(".//testcase[@name='hellaswag acc: vllm-fp16 vs hf-fp32']/failure")
    assert different.get("type") == "DIFFERENT" and different.text == "DIFFERENT because of comparison 1"
    assert "+0.10 pp" in different.get("message") and "90% CI [-0.40, +0.60] pp" in different.get("message")
    if not fail_on_inconclusive:
        skipped = root.find(".//testcase[@name='arc_easy acc: vllm-bf16 vs hf-fp32']/skipped")
        assert "INCONCLUSIVE because of comparison 2" in skipped.get("message")
    assert int(root.get("tests")) == 5 and int(root.get("failures")) == (3 if fail_on_inconclusive else 1)


def test_incomplete_cells_are_errors(tmp_path):
    doc = document(MIXED[:2], "INCOMPLETE", "2 cell(s) of the run cannot be used",
                   incomplete=[("hf-bf16", "failed: CUDA out of memory"), ("vllm-fp16", "missing")])
    root, xml = parse(ci.junit_document(doc), tmp_path)
    got = outcomes(xml)
    assert got["cell hf-bf16"] == got["cell vllm-fp16"] == "error"
    assert int(root.get("errors")) == 2 and int(root.get("tests")) == 4
    err = root.find(".//testcase[@name='cell hf-bf16']/error")
    assert err.get("type") == "INCOMPLETE" and "CUDA out of memory" in err.get("message")


def test_a_sign_off_the_comparisons_do_not_show_is_a_testcase_of_its_own(tmp_path):
    """A staged run stopped between rounds (INCOMPLETE, no cell missing) and an INCONCLUSIVE sign-off with no
    gating comparison: the test view must not be greener than the exit code."""
    staged = document([comparison(0, "EQUIVALENT")], "INCOMPLETE", "hellaswag stopped between rounds")
    assert outcomes(parse(ci.junit_document(staged), tmp_path)[1])["sign-off"] == "error"
    empty = document([], "INCONCLUSIVE", "no gating comparisons were made")
    assert outcomes(parse(ci.junit_document(empty), tmp_path)[1]) == {"sign-off": "failure"}
    assert outcomes(parse(ci.junit_document(empty, fail_on_inconclusive=False), tmp_path)[1]) == {
        "sign-off": "skipped"}


def test_staged_stop_is_a_property_of_its_testsuite(tmp_path):
    staging = {"rule": "group-sequential", "off": None,
               "tasks": [{"task": "hellaswag", "looks": [500, 1000, 10042], "stopped_at_look": 2, "of_looks": 3,
                          "docs": 1000, "docs_available": 10042, "why": "every gating comparison settled"}]}
    root, _ = parse(ci.junit_document(document(MIXED, "FAIL", staging=staging)), tmp_path)
    props = {s.get("name"): {p.get("name"): p.get("value") for p in s.iter("property")} for s in root}
    assert props["hellaswag"]["evalparity.staged_stop"] == (
        "look 2 of 3 (1,000 of 10,042 docs): every gating comparison settled")
    assert "evalparity.staged_stop" not in props["arc_easy"]
    # a staging section of another shape (a later schema) is tolerated
    parse(ci.junit_document(document(MIXED, "FAIL", staging={"tasks": [{"task": "hellaswag"}, "x"]})), tmp_path)
    parse(ci.junit_document(document(MIXED, "FAIL", staging=None) | {"staging": None}), tmp_path)


def test_units_filters_and_hostile_names(tmp_path):
    rows = [comparison(0, "DIFFERENT", unit="pp", effect=-0.0123, ci_low=-0.02, ci_high=-0.005),
            comparison(1, "DIFFERENT", metric="perplexity", unit="", effect=0.25, ci_low=0.1, ci_high=0.4),
            comparison(2, "DIFFERENT", task="gsm8k", metric="exact_match", filter_="strict-match"),
            comparison(3, "DIFFERENT", task="evil\x1b[31m\ud800<&>\"", metric="acc", effect=None)]
    root, xml = parse(ci.junit_document(document(rows, "FAIL")), tmp_path)
    messages = {c.get("name"): c.find("failure").get("message") for c in root.iter("testcase")}
    assert "Δ acc = -1.23 pp, 90% CI [-2.00, -0.50] pp" in messages["hellaswag acc: vllm-bf16 vs hf-fp32"]
    assert "Δ perplexity = +0.25, 90% CI [+0.1, +0.4], n" in messages["hellaswag perplexity: vllm-bf16 vs hf-fp32"]
    assert "gsm8k exact_match (strict-match): vllm-bf16 vs hf-fp32" in messages
    evil = [n for n in messages if n.startswith("evil")][0]
    assert evil == 'evil\\x1b[31m\\ud800<&>" acc: vllm-bf16 vs hf-fp32' and "= n/a pp" in messages[evil]
    summary = ci.summary_document(document(rows, "FAIL"), report="out\udcff/report.html")
    summary.encode("utf-8")  # shown, never a UnicodeEncodeError when written
    assert "\x1b" not in summary and "evil\\\\x1b" in summary and "&lt;&amp;&gt;" in summary


# ---------------------------------------------------------------- the summary
def test_summary_lists_what_is_not_equivalent_first():
    text = ci.summary_document(document(MIXED, "FAIL", "1 of 5 DIFFERENT"), report="r/report/report.html")
    lines = text.splitlines()
    assert "**FAIL**: 1 of 5 DIFFERENT" in lines
    rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert [r.split(" | ")[3] for r in rows] == ["DIFFERENT", "SHIFT", "INCONCLUSIVE"]
    assert "+0.10 pp, 90% CI \\[-0.40, +0.60\\] pp" in rows[0] and rows[0].endswith("| 2,000 |")
    assert "2 of 5 gating comparisons EQUIVALENT." in lines
    assert "Report: r/report/report.html" in lines
    assert "abstract" not in text and "![" not in text  # not gating; no images


@pytest.mark.parametrize("name_chars", [10, 5000])
def test_summary_stays_short_with_a_thousand_comparisons(name_chars):
    rows = [comparison(i, ("DIFFERENT", "INCONCLUSIVE", "EQUIVALENT")[i % 3], task="t" * name_chars + str(i),
                       cell=f"cell-{i}&|`*") for i in range(1000)]
    text = ci.summary_document(document(rows, "FAIL", "r" * 100_000), report="x" * 10_000)
    assert len(text) <= ci.SUMMARY_LIMIT < 65_000
    assert "more not-EQUIVALENT comparisons left out" in text
    listed = sum(1 for line in text.splitlines() if line.startswith("| ") and "---" not in line) - 1
    left = int(text.split("… and ")[1].split(" more")[0].replace(",", ""))
    assert listed + left == 667 and listed <= ci.SUMMARY_ROWS
    assert "333 of 1,000 gating comparisons EQUIVALENT." in text


def test_github_step_summary_is_appended_never_truncated(tmp_path, monkeypatch):
    verdicts = tmp_path / "verdicts.json"
    verdicts.write_text(json.dumps(document(MIXED, "FAIL", "two runs")))
    step = tmp_path / "step_summary.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv(ci.STEP_SUMMARY_ENV, str(step))
    for _ in range(2):
        assert ci.write_ci_outputs(verdicts, step_summary=ci.step_summary_path()) == []
    text = step.read_text()
    assert text.startswith("earlier step\n") and text.count("### evalparity sign-off") == 2
    # a summary file that cannot be written: one warning, nothing raised; the other outputs are written
    monkeypatch.setenv(ci.STEP_SUMMARY_ENV, str(tmp_path / "no" / "such" / "file"))
    warnings = ci.write_ci_outputs(verdicts, junit_xml=tmp_path / "j.xml", summary_md=tmp_path / "s.md",
                                   step_summary=ci.step_summary_path())
    assert len(warnings) == 1 and "GITHUB_STEP_SUMMARY" in warnings[0]
    assert (tmp_path / "j.xml").is_file() and (tmp_path / "s.md").read_text().startswith("### evalparity")


def test_outputs_that_cannot_be_written_are_warnings(tmp_path):
    verdicts = tmp_path / "verdicts.json"
    verdicts.write_text(json.dumps(document(MIXED, "FAIL")))
    gone = tmp_path / "gone"
    warnings = ci.write_ci_outputs(verdicts, junit_xml=gone / "j.xml", summary_md=gone / "s.md")
    assert len(warnings) == 2 and warnings[0].startswith("--junit-xml") and warnings[1].startswith("--summary-md")
    assert "could not be read" in ci.write_ci_outputs(tmp_path / "none.json", junit_xml=tmp_path / "j.xml")[0]
    assert not (tmp_path / "j.xml").exists()


# ---------------------------------------------------------------- where they may go
def test_paths_are_checked_before_anything_runs(tmp_path):
    run = tmp_path / "run"
    for folder in (layout.cells_dir(run), layout.stages_dir(run)):
        folder.mkdir(parents=True)
    check_ci_outputs(run, tmp_path / "junit.xml", tmp_path / "summary.md")  # anywhere the user chooses
    check_ci_outputs(tmp_path / "new-run", tmp_path / "new-run" / "junit.xml", None)  # the run folder, made by the verb
    with pytest.raises(EvalParityError, match="the folder .*missing does not exist"):
        check_ci_outputs(run, tmp_path / "missing" / "junit.xml", None)
    with pytest.raises(EvalParityError, match=r"inside the run folder's cells/"):
        check_ci_outputs(run, None, layout.cells_dir(run) / "summary.md")
    with pytest.raises(EvalParityError, match=r"inside the run folder's stages/"):
        check_ci_outputs(run, layout.stages_dir(run) / "junit.xml", None)
    with pytest.raises(EvalParityError, match="is a folder"):
        check_ci_outputs(run, tmp_path, None)
    with pytest.raises(EvalParityError, match="writes too"):
        check_ci_outputs(run, tmp_path / "x", tmp_path / "x")
    layout.stats_dir(run).mkdir()
    for record in (layout.spec_file(run), layout.run_file(run), layout.plan_file(run), layout.stats_dir(run) / "j.xml"):
        with pytest.raises(EvalParityError, match="would overwrite what evalparity writes"):
            check_ci_outputs(run, record, None)


@pytest.mark.parametrize("verb", ["report", "compare", "run"])
def test_a_path_in_a_missing_folder_is_one_line_exit_2(tmp_path, verb):
    layout.cells_dir(tmp_path / "run").mkdir(parents=True)
    bad = str(tmp_path / "nowhere" / "junit.xml")
    args = {"report": ["report", str(tmp_path / "run")],
            "compare": ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out")],
            "run": ["run", "--model", str(tmp_path / "no-model"), "--tasks", "x", "--out", str(tmp_path / "out")]}
    proc = evalparity(*args[verb], "--junit-xml", bad)
    line = one_line_error(proc)
    assert proc.returncode == 2 and "--junit-xml" in line and "does not exist" in line
    assert not (tmp_path / "out").exists()


def test_compare_writes_junit_and_summary_after_the_sign_off(tmp_path):
    """The whole path: `compare` of two lm-eval outputs, one with two flipped docs of 30; then `report` on
    the same folder with the flag off, appending a second summary to $GITHUB_STEP_SUMMARY."""
    a = make_lm_eval_dir(tmp_path / "a", dtype="float32")
    b = make_lm_eval_dir(tmp_path / "b", dtype="bfloat16", flip=2, seed=1)
    out, step = tmp_path / "cmp", tmp_path / "step.md"
    env = {ci.STEP_SUMMARY_ENV: str(step)}
    proc = evalparity("compare", str(a), str(b), "--out", str(out), "--junit-xml", str(tmp_path / "junit.xml"),
                      "--summary-md", str(tmp_path / "summary.md"), env=env)
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]
    doc = json.loads(layout.verdicts_file(out).read_text())
    root, xml = parse((tmp_path / "junit.xml").read_text(encoding="utf-8"), tmp_path)
    assert int(root.get("tests")) == sum(c["gating"] for c in doc["comparisons"]) > 0
    status = doc["sign_off"]["status"]
    assert proc.stdout.startswith(f"{status}:")
    summary = (tmp_path / "summary.md").read_text()
    assert f"**{status}**" in summary and "report.html" in summary and step.read_text() == summary + "\n"
    assert not [line for line in proc.stderr.splitlines() if line.startswith("warning:")]

    proc2 = evalparity("report", str(out), "--no-fail-on-inconclusive", "--junit-xml", str(tmp_path / "j2.xml"),
                       env=env)
    assert proc2.returncode in (0, 3), proc2.stderr[-3000:]
    assert step.read_text().count("### evalparity sign-off") == 2
    root2, _ = parse((tmp_path / "j2.xml").read_text(encoding="utf-8"), tmp_path)
    assert int(root2.get("tests")) == int(root.get("tests"))
    assert int(root2.get("failures")) + int(root2.get("skipped")) == int(root.get("failures"))


def test_an_unwritable_output_does_not_change_the_exit_code(tmp_path):
    a = make_lm_eval_dir(tmp_path / "a", dtype="float32")
    b = make_lm_eval_dir(tmp_path / "b", dtype="bfloat16", seed=1)
    out = tmp_path / "cmp"
    proc = evalparity("compare", str(a), str(b), "--out", str(out), env={ci.STEP_SUMMARY_ENV: str(tmp_path)})
    doc = json.loads(layout.verdicts_file(out).read_text())
    assert proc.returncode == doc["sign_off"]["exit_code"], proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "GITHUB_STEP_SUMMARY" in warnings[0]


def test_the_step_summary_is_never_appended_to_the_runs_own_files(tmp_path):
    """Session 32's review: ``$GITHUB_STEP_SUMMARY`` had none of ``--summary-md``'s checks, so pointed at a
    cell's sealed table (or spec.json) it appended markdown to it, and the next command refused the run. Now
    the same rule holds for it: a warning line, the exit code and every file of the run as they were."""
    a = make_lm_eval_dir(tmp_path / "a", dtype="float32")
    b = make_lm_eval_dir(tmp_path / "b", dtype="bfloat16", flip=2, seed=1)
    out = tmp_path / "cmp"
    first = evalparity("compare", str(a), str(b), "--out", str(out))
    code = json.loads(layout.verdicts_file(out).read_text())["sign_off"]["exit_code"]
    assert first.returncode == code, first.stderr[-2000:]
    cell = next(p for p in layout.cells_dir(out).iterdir() if p.is_dir())
    from evalparity.cli.options import ci_output_problem

    for target in (layout.cell_record(cell), layout.cells_dir(out) / "summary.md"):  # the rule, without a report
        assert ci_output_problem(out, "$GITHUB_STEP_SUMMARY", target) is not None, target
    for target in (layout.table(cell), out / "compare.json"):  # the whole path, through the command line
        before = target.read_bytes() if target.exists() else None
        proc = evalparity("report", str(out), env={ci.STEP_SUMMARY_ENV: str(target)})
        assert proc.returncode == code, (target, proc.stderr[-2000:])
        warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1 and "GITHUB_STEP_SUMMARY" in warnings[0] and "not appended" in warnings[0]
        assert (target.read_bytes() if target.exists() else None) == before, target
    assert evalparity("report", str(out)).returncode == code  # the run verifies as before


def test_a_fifo_or_a_device_is_written_into_not_replaced(tmp_path):
    """``--junit-xml`` or ``--summary-md`` at a named pipe (or ``/dev/stdout``): written into, so its reader
    gets the document; renamed over (the atomic write) it became a plain file, and as root ``/dev/full``
    was replaced so."""
    import os
    import stat
    import threading

    from evalparity.files import write_output

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    write_output(fifo, "<testsuites/>\n")
    reader.join(timeout=30)
    assert got == ["<testsuites/>\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(OSError):  # a device that refuses the write: an error (a warning for the verbs), kept
        write_output(Path("/dev/full"), "x")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    plain = tmp_path / "j.xml"
    write_output(plain, "a")
    write_output(plain, "b")
    assert plain.read_text() == "b"
