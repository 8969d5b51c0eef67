"""What to do after a sign-off that is not a PASS, said once: the terminal's headline
(``cli/verdict_table.py``) and the report's sign-off box (``report/sections.py``) print this sentence.

Rows are ``verdicts.json`` comparisons (dicts with ``verdict``, ``n_needed``, ``task``, ``metric``, ``filter``,
``level``, ``cell``; ``kind`` and ``reference`` for a ``--compare`` pair), the gating ones."""

from __future__ import annotations

import math
from numbers import Real

from evalparity.printable import visible

SETTLED = ("EQUIVALENT", "DIFFERENT")
NAMED = 5  # the DIFFERENT comparisons a FAIL's next step names before "and k more"


def label(row: dict) -> str:
    """``task metric``, with the filter when it is not lm-eval's ``none`` and ``(group)`` for a group."""
    task = visible(row.get("task", "")) + (" (group)" if row.get("level") == "group" else "")
    metric = visible(row.get("metric", ""))
    filt = row.get("filter")
    if filt and filt != "none":
        metric += f"/{visible(filt)}"
    return f"{task} {metric}"


def compared(row: dict) -> str:
    """The comparison's cell, and ``vs REFERENCE`` for a ``--compare`` pair (whose reference is not the
    run's): the same cell is in both kinds of comparison."""
    cell = visible(row.get("cell", ""))
    return f"{cell} vs {visible(row.get('reference', ''))}" if row.get("kind") == "pair" else cell


def next_step(status: str, rows: list[dict]) -> str | None:
    """FAIL: the DIFFERENT comparisons and how to localise the drift. INCONCLUSIVE: how many are unsettled
    and the docs per task that would settle them all (the largest ``n_needed``). None for a PASS, or when
    no comparison explains the status (its reason says it)."""
    n = len(rows)
    if status == "FAIL":
        bad = [r for r in rows if r.get("verdict") == "DIFFERENT"]
        if not bad:
            return None
        names = "; ".join(f"{label(r)} {compared(r)}" for r in bad[:NAMED])
        more = f" and {len(bad) - NAMED} more" if len(bad) > NAMED else ""
        return (f"{len(bad)} of {n} comparisons DIFFERENT ({names}{more}): the drift is beyond the margin there; "
                "`evalparity drift --run-dir RUN` localises it")
    if status != "INCONCLUSIVE":
        return None
    open_ = [r for r in rows if r.get("verdict") not in SETTLED]
    if not open_:
        return None
    kinds = sorted({str(r.get("verdict")) for r in open_})
    head = f"{len(open_)} of {n} comparisons unsettled" + (f" ({', '.join(kinds)})" if len(kinds) > 1 else "")
    needed = [float(r["n_needed"]) for r in open_ if isinstance(r.get("n_needed"), Real)
              and not isinstance(r["n_needed"], bool) and math.isfinite(r["n_needed"])]
    if not needed:
        return f"{head}; no number of docs is known to settle them: see their reasons in the report"
    return f"{head}; about {int(math.ceil(max(needed))):,} docs per task would settle them: raise --limit or drop it"
