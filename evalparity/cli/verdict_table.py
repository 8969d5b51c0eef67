"""The verdicts on the terminal: one row per gating comparison, the unsettled and the failed first, and a
headline that names the next step.

Why: the sign-off line says PASS, FAIL or INCONCLUSIVE; what to do about it (which comparisons, how many
docs would settle them) was only in report.html. This prints it where the command ran, readable at 80
columns and in a CI log: the numbers never truncated (the name columns wrap instead, and the per-row reason
is left to the report; the headline says the next step once).

What a cell changes against its reference (``differs``: "vllm, bf16, quantization=fp8") is said once per
compared pair, in the lines under the table, not in a column: repeated on every row of a cell it would take
the names' width at 80 columns, and it is the same on each of them.

It reads only these fields of ``verdicts.json``: ``sign_off.{status, reason}``, ``comparisons[*].{task,
level, filter, metric, cell, reference, verdict, gating, effect, ci_low, ci_high, n, n_needed, unit,
differs}`` (``differs`` optional: older files have none) and ``staging`` (optional), so that it prints the
same from a fresh run and from a verdicts.json kept elsewhere.
Task and cell names are user text: shown as ``Text`` (never read as markup), control characters written out.
"""

from __future__ import annotations

import math

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from evalparity.printable import visible
from evalparity.stats.next_step import SETTLED, next_step
from evalparity.stats.next_step import label as what

EQUIVALENT, DIFFERENT, SHIFT, INCONCLUSIVE = "EQUIVALENT", "DIFFERENT", "SHIFT", "INCONCLUSIVE"
ORDER = {DIFFERENT: 0, SHIFT: 1, INCONCLUSIVE: 2, EQUIVALENT: 4}  # anything else (NO MARGIN) before EQUIVALENT
STYLE = {DIFFERENT: "red", SHIFT: "yellow", INCONCLUSIVE: "yellow", EQUIVALENT: "green"}
PERCENT_UNITS = ("pp", "fraction")  # stored as a fraction of 1, shown in percentage points


def print_verdicts(console: Console, verdicts: dict) -> None:
    """Print the gating comparisons of ``verdicts`` (a parsed ``verdicts.json``), where each staged task
    stopped, and the headline with the next step."""
    rows = gating_rows(verdicts)
    if rows:
        console.print(table(rows))
    else:
        console.print(Text("no gating comparisons"), highlight=False)
    for line in staging_lines(verdicts.get("staging")):
        console.print(Text(line), highlight=False, soft_wrap=False)
    status, text = headline(verdicts, rows)
    style = {"PASS": "green", "FAIL": "red"}.get(status, "yellow")
    console.print(Text.assemble((f"{visible(status)}:", f"bold {style}"), " ", visible(text)), highlight=False)


def gating_rows(verdicts: dict) -> list[dict]:
    """The gating comparisons, the non-EQUIVALENT ones first (DIFFERENT, SHIFT, INCONCLUSIVE), each group
    in the file's order."""
    rows = [c for c in verdicts.get("comparisons") or [] if isinstance(c, dict) and c.get("gating")]
    return sorted(rows, key=lambda c: ORDER.get(c.get("verdict"), 3))


def table(rows: list[dict]) -> Table:
    """The rows as a table whose number columns never wrap nor shrink (the name columns wrap instead)."""
    refs = {c.get("reference") for c in rows}
    percent = all(c.get("unit") in PERCENT_UNITS for c in rows)
    changes = differences(rows, one_reference=len(refs) == 1)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
              title=Text(f"gating comparisons against {visible(next(iter(refs)))}") if len(refs) == 1 else None,
              caption=Text("\n".join(changes)) if changes else None, caption_justify="left")
    t.add_column("task / metric", overflow="fold", ratio=3)
    t.add_column("cell", overflow="fold", ratio=2)
    t.add_column("verdict", no_wrap=True)
    t.add_column("Δ pp [CI]" if percent else "Δ [CI]", no_wrap=True, justify="right")
    t.add_column("n", no_wrap=True, justify="right")
    t.add_column("to\nsettle", no_wrap=True, justify="right")  # two lines: 3 columns more for the names
    for c in rows:
        v = str(c.get("verdict") or "")
        cell = visible(c.get("cell", "")) + ("" if len(refs) == 1 else f" vs {visible(c.get('reference', ''))}")
        t.add_row(Text(what(c)), Text(cell), Text(visible(v), style=STYLE.get(v, "")),
                  Text(delta(c, with_unit=not percent)), Text(_count(c.get("n"))),
                  Text("" if v in SETTLED else _count(c.get("n_needed"))))
    return t


def differences(rows: list[dict], one_reference: bool) -> list[str]:
    """One line per compared pair whose cell changes something against its reference, in the rows' order:
    ``vllm-fp8 changes: vllm, bf16, quantization=fp8`` (``... vs REF changes`` when the table has several
    references)."""
    out: dict[tuple[str, str], str] = {}
    for c in rows:
        key = (visible(c.get("cell", "")), visible(c.get("reference", "")))
        text = c.get("differs")
        if key not in out and isinstance(text, str) and text:
            out[key] = f"{key[0]}{'' if one_reference else f' vs {key[1]}'} changes: {visible(text)}"
    return list(out.values())


def delta(c: dict, with_unit: bool = False) -> str:
    """``+0.13 [-0.32, 0.60]``: the effect and its CI, in pp for a proportion (stored as a fraction)."""
    unit = c.get("unit") or ""
    scale, unit_shown = (100.0, "pp") if unit in PERCENT_UNITS else (1.0, unit)
    fmt = "{:+.2f}" if scale == 100.0 else "{:+.4g}"

    def num(x, sign: bool = True) -> str:
        if not isinstance(x, (int, float)) or not math.isfinite(x):
            return "?"
        return (fmt if sign else fmt.replace("+", "")).format(x * scale)

    text = f"{num(c.get('effect'))} [{num(c.get('ci_low'), False)}, {num(c.get('ci_high'), False)}]"
    return f"{text} {visible(unit_shown)}".rstrip() if with_unit else text


def staging_lines(staging) -> list[str]:
    """One line per staged task: where it stopped and why; one line when the staged rule was off."""
    if not staging:
        return []
    if isinstance(staging, dict) and staging.get("off"):
        return [f"staging: off ({visible(staging['off'])})"]
    tasks = staging.get("tasks") if isinstance(staging, dict) else staging
    out = []
    for t in tasks or []:
        if not isinstance(t, dict):
            continue
        out.append(f"staging: {visible(t.get('task', '?'))} stopped at look {_count(t.get('stopped_at_look'))} of "
                   f"{_count(t.get('of_looks'))} ({_count(t.get('docs'))} of {_count(t.get('docs_available'))} "
                   f"docs): {visible(t.get('why') or 'no reason recorded')}")
    return out


def headline(verdicts: dict, rows: list[dict]) -> tuple[str, str]:
    """(status, what it means and what to do next), from the sign-off and the gating rows; the next step
    is ``stats.next_step``'s, the sentence the report prints too."""
    sign = verdicts.get("sign_off") or {}
    status = str(sign.get("status") or "")
    reason = str(sign.get("reason") or "")
    if status == "PASS":
        return status, f"all {len(rows)} EQUIVALENT"
    return status or "?", next_step(status, rows) or visible(reason)


def _count(x) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "-"
    return f"{int(math.ceil(x)):,}"

