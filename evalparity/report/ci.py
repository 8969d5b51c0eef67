"""What a CI pipeline reads besides the exit code: a JUnit XML file and a short markdown summary of a sign-off.

Both are made from ``stats/verdicts.json`` as the statistics stage wrote it (read back with ``json``), never
from the in-memory results, so that they say exactly what the run's record says; and only from these fields:
``sign_off.{status, reason, incomplete_cells[{cell, why}]}``, ``comparisons[*].{id, task, level, filter,
metric, cell, reference, verdict, reason, gating, effect, ci_low, ci_high, ci_level, n, unit, differs}`` and,
where present, ``staging.tasks[*]`` (where a staged task stopped). ``differs`` (what the cell changes
against its reference, schema 4) is optional: a file without it reads as nothing said. ``effect`` and
``ci_*`` of a proportion (``unit`` "pp" or "fraction") are fractions: shown ×100, in pp.

JUnit (``junit_document``): one testsuite per task (or group), one testcase per *gating* comparison, named
``<task> <metric>: <cell> vs <reference>`` (the filter in parentheses when there is one), classname
``evalparity.<task>``. EQUIVALENT passes; DIFFERENT is a ``<failure>``; INCONCLUSIVE and SHIFT are a
``<failure>`` with ``--fail-on-inconclusive`` (the default), ``<skipped>`` without. An INCOMPLETE sign-off
adds one ``<error>`` testcase per cell that could not be used (testsuite ``evalparity sign-off``); where the
comparisons alone would look greener than the sign-off (an INCOMPLETE staged run with no cell missing, an
INCONCLUSIVE sign-off with no gating comparison), that testsuite holds one ``sign-off`` testcase saying so,
so a pipeline's test view never passes what the exit code fails. Every testsuite has the sign-off status
and reason and the evalparity version as properties, and a staged task where it stopped. A testcase whose
cell changes something against its reference has it as the property ``evalparity.differs`` and in its text
(``<cell> changes: <differs>``: a failure's text and the system-out).

Summary (``summary_document``): the sign-off line and reason, the gating comparisons that are not
EQUIVALENT (DIFFERENT first), how many are EQUIVALENT, what each compared cell changes against its
reference (one line per pair, ``PAIRS_SHOWN`` and ``PAIRS_CHARS`` at most), and the report's path; bounded
in length
(``SUMMARY_LIMIT``, far below GitHub's 65,536-character limit on a comment or a step summary) whatever the
number or the names of the comparisons: rows beyond the bound are counted in one line, not shown.

Text that users control (task, metric, cell names, reasons) is written out as ``printable.visible`` shows
it (XML 1.0 cannot hold most control characters at all), and escaped for markdown by ``md_escape``.
"""

from __future__ import annotations

import json
import math
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

from evalparity.files import write_output
from evalparity.printable import visible
from evalparity.report.markdown import md_escape

PROPORTION_UNITS = ("pp", "fraction")  # effect and CI stored as fractions, shown in percentage points
EQUIVALENT, DIFFERENT, SHIFT, INCONCLUSIVE = "EQUIVALENT", "DIFFERENT", "SHIFT", "INCONCLUSIVE"
UNSETTLED = (SHIFT, INCONCLUSIVE)
INCOMPLETE = "INCOMPLETE"
SIGN_OFF_SUITE = "evalparity sign-off"
STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"

SUMMARY_LIMIT = 20_000  # characters: a summary is at most this long (GitHub takes 65,536 in a comment)
SUMMARY_ROWS = 50  # not-EQUIVALENT comparisons listed at most; the rest are counted
FIELD_CHARS = 80  # a name in a summary row, cut to this many characters (the report has it whole)
REASON_CHARS = 600  # the sign-off's reason, likewise
INCOMPLETE_SHOWN = 5  # incomplete cells named in the summary
PAIRS_SHOWN = 20  # compared pairs whose difference the summary lists; the rest are counted
DIFFERS_CHARS = 200  # a difference in the summary, cut to this many characters
PAIRS_CHARS = 6_000  # the list of compared pairs takes at most this much of the summary

_NOT_XML = re.compile("[\ud800-\udfff\ufffe\uffff]")  # surrogates and non-characters: no XML 1.0 document holds them


# ---------------------------------------------------------------- reading verdicts.json
def read_verdicts(path: Path) -> dict:
    """The verdicts document at ``path``; ValueError when it is not a JSON object (OSError when unreadable)."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path} is not a verdicts document (not a JSON object)")
    return doc


def _sign_off(doc: dict) -> tuple[str, str, list[tuple[str, str]]]:
    """(status, reason, [(cell, why)]) of the document's sign-off, tolerating missing fields."""
    s = doc.get("sign_off") if isinstance(doc.get("sign_off"), dict) else {}
    cells = [(str(c.get("cell", "?")), str(c.get("why", ""))) for c in s.get("incomplete_cells") or []
             if isinstance(c, dict)]
    return str(s.get("status") or "UNKNOWN"), str(s.get("reason") or ""), cells


def gating_comparisons(doc: dict) -> list[dict]:
    """The gating comparisons, in the document's order."""
    return [c for c in doc.get("comparisons") or [] if isinstance(c, dict) and c.get("gating") is True]


def _staged_stops(doc: dict) -> dict[str, str]:
    """Task -> where a staged run stopped it ("look 4 of 5 (4,000 of 10,042 docs): why"); {} for a run
    without a ``staging`` section (every doc scored) or an older one."""
    staging = doc.get("staging")
    out = {}
    for t in (staging.get("tasks") or []) if isinstance(staging, dict) else []:
        if not isinstance(t, dict) or "task" not in t:
            continue
        parts = []
        if t.get("stopped_at_look") is not None:
            parts.append(f"look {t['stopped_at_look']}" + (f" of {t['of_looks']}" if t.get("of_looks") else ""))
        if _is_number(t.get("docs")):
            avail = f" of {t['docs_available']:,}" if _is_number(t.get("docs_available")) else ""
            parts.append(f"({t['docs']:,}{avail} docs)")
        text = " ".join(parts) or "staged"
        out[str(t["task"])] = text + (f": {t['why']}" if t.get("why") else "")
    return out


# ---------------------------------------------------------------- numbers as shown
def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _unit(c: dict) -> str:
    return "pp" if c.get("unit") in PROPORTION_UNITS else str(c.get("unit") or "")


def _value(c: dict, key: str) -> str:
    x = c.get(key)
    if not _is_number(x):
        return "n/a"
    return f"{x * 100:+.2f}" if c.get("unit") in PROPORTION_UNITS else f"{x:+.4g}"


def _level(c: dict) -> str:
    x = c.get("ci_level")
    return f"{x * 100:.6g}% " if _is_number(x) and 0 < x < 1 else ""


def _n(c: dict) -> str:
    return f"{c['n']:,}" if _is_number(c.get("n")) else "n/a"


def effect_text(c: dict) -> str:
    """``Δ acc = -1.20 pp, 95% CI [-1.90, -0.50] pp, n = 2,000`` (a proportion's fractions shown in pp)."""
    u = _unit(c)
    u = f" {u}" if u else ""
    return (f"Δ {c.get('metric', '?')} = {_value(c, 'effect')}{u}, {_level(c)}CI [{_value(c, 'ci_low')}, "
            f"{_value(c, 'ci_high')}]{u}, n = {_n(c)}")


def differs(c: dict) -> str:
    """What the comparison's cell changes against its reference ("" when nothing, or not recorded)."""
    text = c.get("differs")
    return text if isinstance(text, str) else ""


def changes_text(c: dict) -> str:
    """``vllm-fp8 changes: vllm, bf16, quantization=fp8`` ("" when the cell changes nothing)."""
    return f"{c.get('cell', '?')} changes: {differs(c)}" if differs(c) else ""


def testcase_name(c: dict) -> str:
    filt = c.get("filter")
    shown = f" ({filt})" if filt not in (None, "", "none") else ""
    return f"{c.get('task', '?')} {c.get('metric', '?')}{shown}: {c.get('cell', '?')} vs {c.get('reference', '?')}"


# ---------------------------------------------------------------- JUnit
def _xml(text: object) -> str:
    """Text an XML 1.0 document can hold, shown as written: control characters written out (as the console
    and the report show them), surrogates and non-characters as ``\\uXXXX``."""
    return _NOT_XML.sub(lambda m: f"\\u{ord(m.group(0)):04x}", visible(text, keep_newlines=True))


def junit_document(doc: dict, *, fail_on_inconclusive: bool = True, version: str | None = None) -> str:
    """The JUnit XML of a verdicts document (see the module's docstring), as text with its declaration."""
    if version is None:
        from evalparity import __version__ as version
    status, reason, incomplete = _sign_off(doc)
    stops = _staged_stops(doc)
    suites: dict[str, list[ET.Element]] = {}
    seen: set[tuple[str, str]] = set()
    for c in gating_comparisons(doc):
        task = str(c.get("task", "?"))
        name = testcase_name(c)
        if (task, name) in seen:  # the same name twice in a suite: told apart by the comparison's id
            name = f"{name} #{c.get('id')}"
        seen.add((task, name))
        suites.setdefault(task, []).append(_comparison_case(c, name, fail_on_inconclusive))
    extra = [_case(f"cell {cell}", "evalparity.cells", "error", f"{INCOMPLETE}: cell {cell} cannot be used: {why}",
                   why or reason, INCOMPLETE) for cell, why in incomplete]
    if status == INCOMPLETE and not incomplete:
        extra.append(_case("sign-off", "evalparity", "error", f"{INCOMPLETE}: {reason}", reason, INCOMPLETE))
    elif status in (INCONCLUSIVE, "FAIL") and not suites:
        kind = "failure" if status == "FAIL" or fail_on_inconclusive else "skipped"
        extra.append(_case("sign-off", "evalparity", kind, f"{status}: {reason}", reason, status))
    if extra:
        suites[SIGN_OFF_SUITE] = extra

    root = ET.Element("testsuites", name="evalparity")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for task, cases in suites.items():
        counts = {"tests": len(cases), "failures": _count(cases, "failure"), "errors": _count(cases, "error"),
                  "skipped": _count(cases, "skipped")}
        suite = ET.SubElement(root, "testsuite", name=_xml(task), **{k: str(v) for k, v in counts.items()},
                              time="0")
        props = ET.SubElement(suite, "properties")
        for key, value in (("evalparity.sign_off", status), ("evalparity.sign_off_reason", reason),
                           ("evalparity.version", version), ("evalparity.staged_stop", stops.get(task))):
            if value is not None:
                ET.SubElement(props, "property", name=key, value=_xml(value))
        suite.extend(cases)
        for k, v in counts.items():
            totals[k] += v
    root.attrib.update({k: str(v) for k, v in totals.items()} | {"time": "0"})
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _comparison_case(c: dict, name: str, fail_on_inconclusive: bool) -> ET.Element:
    v = str(c.get("verdict") or "")
    changes = changes_text(c)
    reason = "\n".join(x for x in (str(c.get("reason") or ""), changes) if x)
    classname = f"evalparity.{c.get('task', '?')}"
    if v == EQUIVALENT:
        case = _case(name, classname, None, "", "", v)
    elif v == DIFFERENT or (v in UNSETTLED and fail_on_inconclusive):
        case = _case(name, classname, "failure", f"{v}: {effect_text(c)}", reason, v)
    elif v in UNSETTLED:
        case = _case(name, classname, "skipped", f"{v} (--no-fail-on-inconclusive): {reason}", "", v)
    else:  # a gating comparison without a verdict this module knows: never a silent pass
        case = _case(name, classname, "error", f"verdict {v or '(none)'}: {reason}", reason, "unknown verdict")
    if differs(c):  # before the outcome: JUnit readers expect a testcase's properties first
        props = ET.Element("properties")
        ET.SubElement(props, "property", name="evalparity.differs", value=_xml(differs(c)))
        case.insert(0, props)
    out = ET.SubElement(case, "system-out")
    out.text = _xml(f"{v or '(no verdict)'}: {effect_text(c)}" + (f"\n{reason}" if reason else ""))
    return case


def _case(name: str, classname: str, kind: str | None, message: str, text: str, type_: str) -> ET.Element:
    case = ET.Element("testcase", name=_xml(name), classname=_xml(classname), time="0")
    if kind is not None:
        el = ET.SubElement(case, kind, message=_xml(message))
        if kind != "skipped":
            el.set("type", _xml(type_))
        if text:
            el.text = _xml(text)
    return case


def _count(cases: Iterable[ET.Element], kind: str) -> int:
    return sum(1 for c in cases if c.find(kind) is not None)


# ---------------------------------------------------------------- the markdown summary
def _clip(text: object, limit: int) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis where it was cut), then escaped for markdown:
    cut first, so no escape is cut in half."""
    s = _NOT_XML.sub(lambda m: f"\\u{ord(m.group(0)):04x}", str(text))  # a lone surrogate cannot be UTF-8
    return md_escape(s if len(s) <= limit else s[:limit - 1] + "…")


def _row(c: dict) -> str:
    u = _unit(c)
    u = f" {u}" if u else ""
    delta = f"{_value(c, 'effect')}{u}, {_level(c)}CI [{_value(c, 'ci_low')}, {_value(c, 'ci_high')}]{u}"
    cells = (c.get("task", "?"), c.get("metric", "?") if c.get("filter") in (None, "", "none")
             else f"{c.get('metric', '?')} ({c.get('filter')})",
             f"{c.get('cell', '?')} vs {c.get('reference', '?')}", c.get("verdict") or "(none)")
    return "| " + " | ".join(_clip(x, FIELD_CHARS) for x in cells) + f" | {md_escape(delta)} | {_n(c)} |"


def summary_document(doc: dict, *, report: object = None, fail_on_inconclusive: bool = True) -> str:
    """The markdown summary of a verdicts document (see the module's docstring); at most ``SUMMARY_LIMIT``
    characters."""
    status, reason, incomplete = _sign_off(doc)
    gating = gating_comparisons(doc)
    order = {DIFFERENT: 0, SHIFT: 1, INCONCLUSIVE: 2}
    flagged = sorted((c for c in gating if c.get("verdict") != EQUIVALENT),
                     key=lambda c: (order.get(c.get("verdict"), 3), c.get("id") if _is_number(c.get("id")) else 0))
    n_equivalent = len(gating) - len(flagged)

    head = ["### evalparity sign-off", "", f"**{_clip(status, FIELD_CHARS)}**: {_clip(reason, REASON_CHARS)}", ""]
    if not fail_on_inconclusive and any(c.get("verdict") in UNSETTLED for c in flagged):
        head += ["SHIFT and INCONCLUSIVE comparisons do not fail this job (`--no-fail-on-inconclusive`).", ""]
    tail = [f"{n_equivalent:,} of {len(gating):,} gating comparisons EQUIVALENT.", ""]
    if incomplete:
        shown = "; ".join(f"{_clip(cell, FIELD_CHARS)} ({_clip(why, FIELD_CHARS)})"
                          for cell, why in incomplete[:INCOMPLETE_SHOWN])
        more = f"; and {len(incomplete) - INCOMPLETE_SHOWN:,} more" if len(incomplete) > INCOMPLETE_SHOWN else ""
        tail += [f"Incomplete cells: {shown}{more}.", ""]
    tail += _pair_lines(gating)
    if report is not None:
        tail += [f"Report: {_clip(report, 4 * FIELD_CHARS)}", ""]

    table: list[str] = []
    if flagged:
        table = ["| task | metric | cell | verdict | Δ (CI) | n |", "|---|---|---|---|---|---|"]
        budget = SUMMARY_LIMIT - len("\n".join(head + tail)) - 400  # the table's share, and the left-out line's
        used = sum(len(x) + 1 for x in table)
        listed = 0
        for c in flagged[:SUMMARY_ROWS]:
            row = _row(c)
            if used + len(row) + 1 > budget:
                break
            table.append(row)
            used += len(row) + 1
            listed += 1
        table.append("")
        if listed < len(flagged):
            table += [f"… and {len(flagged) - listed:,} more not-EQUIVALENT comparisons left out here "
                      "(the report lists every one).", ""]
    text = "\n".join(head + table + tail).rstrip("\n") + "\n"
    if len(text) > SUMMARY_LIMIT:  # only for names far beyond any real run's; the report has them whole
        text = text[:SUMMARY_LIMIT - 80].rsplit("\n", 1)[0] + "\n\n… (summary cut here: see the report)\n"
    return text


def _pair_lines(gating: list[dict]) -> list[str]:
    """What each compared cell changes against its reference, one list item per pair of the gating
    comparisons (``PAIRS_SHOWN`` at most, and ``PAIRS_CHARS`` of text: the rest counted); [] when no cell
    changes anything."""
    pairs: dict[tuple[str, str], str] = {}
    for c in gating:
        if differs(c):
            pairs.setdefault((str(c.get("cell", "?")), str(c.get("reference", "?"))), differs(c))
    if not pairs:
        return []
    lines: list[str] = []
    used = 0
    for (cell, ref), text in list(pairs.items())[:PAIRS_SHOWN]:
        line = f"- {_clip(cell, FIELD_CHARS)} vs {_clip(ref, FIELD_CHARS)} changes: {_clip(text, DIFFERS_CHARS)}"
        if used + len(line) > PAIRS_CHARS:
            break
        lines.append(line)
        used += len(line) + 1
    if len(lines) < len(pairs):
        lines.append(f"- and {len(pairs) - len(lines):,} more pairs (the report lists every one)")
    return ["Compared cells:", "", *lines, ""]


# ---------------------------------------------------------------- writing them
def write_ci_outputs(verdicts: Path, *, junit_xml: Path | None = None, summary_md: Path | None = None,
                     report: object = None, fail_on_inconclusive: bool = True,
                     step_summary: str | None = None) -> list[str]:
    """Write the JUnit file and the summary the user asked for (each atomically), and append the summary
    to ``step_summary`` (``$GITHUB_STEP_SUMMARY``: appended, never truncated) when that is set. Returns one
    warning line per output that could not be written; raises nothing for a file that cannot be written,
    since the sign-off stands whatever happens here."""
    warnings: list[str] = []
    if junit_xml is None and summary_md is None and not step_summary:
        return warnings
    try:
        doc = read_verdicts(verdicts)
    except (OSError, ValueError) as err:
        return [f"no CI outputs written: {verdicts} could not be read ({_why(err)})"]
    if junit_xml is not None:
        try:
            write_output(Path(junit_xml), junit_document(doc, fail_on_inconclusive=fail_on_inconclusive))
        except (OSError, ValueError) as err:
            warnings.append(f"--junit-xml {junit_xml} was not written ({_why(err)}); the sign-off above stands")
    summary = None
    if summary_md is not None or step_summary:
        summary = summary_document(doc, report=report, fail_on_inconclusive=fail_on_inconclusive)
    if summary_md is not None:
        try:
            write_output(Path(summary_md), summary)
        except (OSError, ValueError) as err:
            warnings.append(f"--summary-md {summary_md} was not written ({_why(err)}); the sign-off above stands")
    if step_summary:
        try:
            with open(step_summary, "a", encoding="utf-8") as f:
                f.write(summary + "\n")
        except (OSError, ValueError) as err:
            warnings.append(f"{STEP_SUMMARY_ENV} {step_summary}: the summary was not appended ({_why(err)})")
    return warnings


def step_summary_path() -> str | None:
    """``$GITHUB_STEP_SUMMARY`` (None when unset or empty)."""
    return os.environ.get(STEP_SUMMARY_ENV) or None


def _why(err: Exception) -> str:
    return (err.strerror if isinstance(err, OSError) and err.strerror else str(err)) or type(err).__name__
