"""``evalparity plan``: from a pilot (or any earlier) run folder, the docs each task needs to settle its gating
comparisons EQUIVALENT under the staged rule, and each cell's GPU time for them (``evalparity/plan.py`` does
the work; this prints it and writes the JSON)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from evalparity import rundir, signoff
from evalparity.cli.options import Statistics, verb
from evalparity.cli.output import console, print_table, safe
from evalparity.errors import EvalParityError
from evalparity.files import json_text, read_json, write_output
from evalparity.printable import visible
from evalparity.rundir import layout


@verb
def plan(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (a pilot, or any earlier run) written by `evalparity run` or `compare`.")],
    power: Annotated[str, typer.Option(help="Power targets, comma-separated: the chance that a comparison with no true difference settles EQUIVALENT. The first is the summary's.")] = "0.8,0.9",
    json_path: Annotated[Path | None, typer.Option("--json", help="Where to write the plan as JSON (default: RUN_DIR/plan.json).")] = None,
    *,
    stats: Statistics,
) -> None:
    """Plan a sign-off from a run: the docs per task (N, and the docs expected with early stopping) that settle
    every gating comparison EQUIVALENT under the staged rule at each power, planned at the run's discordance
    and Δ = 0, and each cell's time for them at the rates it measured."""
    from evalparity import plan as planning  # heavy: pandas, scipy (the statistics)

    opts = stats.options()
    powers = planning.parse_powers(power)
    planning.check_is_run(run_dir)
    if opts.pairs:  # --compare names cells of this run folder, checked before anything is computed
        signoff.check_pairs(opts, signoff.run_cells(run_dir))
    target = json_path if json_path is not None else layout.plan_file(run_dir)
    inside = _check_target(run_dir, target, planning.PLAN_FILE, planning.SCHEMA)
    if inside:  # writing into the run folder: one command at a time in it, as report
        if not os.access(run_dir, os.W_OK):
            raise EvalParityError(f"run directory {run_dir} is not writable: plan writes {target.name} into it; "
                                  "pass --json PATH to write the plan elsewhere")
        with rundir.acquire(run_dir, create=False, flag="run directory"):
            result = planning.build_plan(run_dir, opts, powers)
            _write(target, result.to_json())
    else:
        result = planning.build_plan(run_dir, opts, powers)
        _write(target, result.to_json())
    show(result)
    console.print(f"plan: {safe(target)}", highlight=False)
    print(visible(result.summary()["line"]), flush=True)  # the line a script reads, on stdout


def _check_target(run_dir: Path, target: Path, default_name: str, schema: str) -> bool:
    """Refuse, before anything is computed, a --json path that cannot be written or would damage the run;
    returns whether it lies in the run folder (then at its top, and not one of its records)."""
    if target.is_dir():
        raise EvalParityError(f"--json {target} is a directory: give a file path, e.g. --json {target / default_name}")
    parent = target.parent
    if not parent.is_dir():
        raise EvalParityError(f"--json {target}: its folder {parent} does not exist (or is not a folder): create it "
                              "or give another path")
    if not os.access(parent, os.W_OK):
        raise EvalParityError(f"--json {target}: its folder {parent} is not writable: give a writable path")
    run_real, parent_real = run_dir.resolve(), parent.resolve()
    if parent_real != run_real and run_real not in parent_real.parents:
        return False
    if parent_real != run_real:
        raise EvalParityError(f"--json {target} is inside the run's folders, where every file is the run's own: "
                              f"write it at the run's top ({run_dir / default_name}) or outside the run")
    if target.is_symlink() or (target.exists() and (read_json(target) or {}).get("schema") != schema):
        raise EvalParityError(f"--json {target} is a file of the run that is not a plan: give another name, e.g. "
                              f"--json {run_dir / default_name}")
    return True


def _write(target: Path, data: dict) -> None:
    try:
        write_output(target, json_text(data))
    except OSError as err:
        raise EvalParityError(f"could not write the plan to {target} ({err.strerror or err}): free space or give "
                              "--json a writable path") from None


def _docs(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


def show(result) -> None:
    """The plan as tables on the console: comparisons, tasks, cells; then its notes."""
    pcts = [f"{100 * p:g}%" for p in result.powers]
    t = Table(title=f"docs to settle EQUIVALENT (staged rule, α {result.alpha:g}, planned at Δ = 0)",
              title_justify="left")
    for col in ("task", "metric", "cell", "n", "ψ", "Δ", "margin"):
        t.add_column(col, justify="right" if col in ("n", "ψ", "Δ", "margin") else "left", overflow="fold")
    for p in pcts:
        t.add_column(f"N @{p}", justify="right")
        t.add_column(safe(f"E[docs] @{p}"), justify="right")
    t.add_column("available", justify="right")
    t.add_column("note", min_width=24)
    for c in result.comparisons:
        metric = c.metric if c.filter in ("none", "") else f"{c.metric} ({c.filter})"
        psi = f"{100 * c.discordance:.2f}%" + ("*" if c.discordance_assumed else "")
        row = [safe(c.task) + (" (group)" if c.level == "group" else ""), safe(metric), safe(c.cell), f"{c.n:,}",
               psi, f"{100 * c.difference:+.2f}pp", f"{100 * c.margin:g}pp"]
        for pp in c.plans:
            approx = "≈" if pp.approximate else ""
            row += [approx + _docs(pp.docs), approx + _docs(pp.expected_docs)]
        row += [_docs(c.docs_available), safe(_comparison_note(c))]
        t.add_row(*row)
    print_table(t)
    if any(c.discordance_assumed for c in result.comparisons):
        console.print("* no discordant doc seen: planned at ψ = 1/n", highlight=False)

    if len(result.tasks) > 1 or any(x.comparisons > 1 for x in result.tasks):
        tt = Table(title="per task: the largest N of its comparisons (each cell scores a task's docs together)",
                   title_justify="left")
        for col in ("task", "comparisons", "available", "in task"):
            tt.add_column(col, justify="left" if col == "task" else "right")
        for p in pcts:
            tt.add_column(f"N @{p}", justify="right")
            tt.add_column(safe(f"E[docs] @{p}"), justify="right")
        for x in result.tasks:
            row = [safe(x.task), str(x.comparisons), _docs(x.docs_available), _docs(x.docs_in_task)]
            for n, e in zip(x.docs, x.expected_docs):
                row += [_docs(n), _docs(e)]
            tt.add_row(*row)
        print_table(tt)

    ct = Table(title="GPU time per cell (all planned tasks in one process)", title_justify="left",
               caption=safe(result.rates_note()), caption_justify="left")
    for col in ("cell", "docs scored", "eval s", "load s", "docs/s"):
        ct.add_column(col, justify="left" if col == "cell" else "right")
    for p in pcts:
        ct.add_column(safe(f"s for E[docs] @{p}"), justify="right")
        ct.add_column(f"s for N @{p}", justify="right")
    for c in result.cells:
        row = [safe(c.cell), f"{c.docs_scored:,}", _secs(c.eval_s), _secs(c.load_s),
               "—" if c.rate is None else f"{c.rate:,.1f}"]
        for s, es in zip(c.seconds, c.expected_seconds):
            row += [_secs(es), _secs(s)]
        ct.add_row(*row)
    print_table(ct)
    for d in result.not_planned:
        console.print(f"not planned: {safe(d['task'])} {safe(d['metric'])} {safe(d['cell'])}: {safe(d['why'])}",
                      highlight=False)
    for cell, why in result.incomplete:
        console.print(f"[yellow]cell {safe(cell)} could not be used ({safe(why)}): the plan covers the others"
                      "[/yellow]", highlight=False)
    for note in result.notes:
        console.print(f"note: {safe(note)}", highlight=False)


def _secs(s: float | None) -> str:
    return "—" if s is None else f"{s:,.0f}" if s >= 10 else f"{s:.1f}"


def _comparison_note(c) -> str:
    """Why a plan does not fit (or cannot be made), in a few words."""
    parts = []
    have, whole = c.docs_available, c.docs_in_task
    if have is not None and any(pp.docs is None or pp.docs > have for pp in c.plans):
        reach = f" (power {c.power_with_available:.2f} with them)" if c.power_with_available is not None else ""
        if whole is not None and whole > have:
            parts.append(f"more than this run's {have:,}{reach}; the task has {whole:,}")
            if any(pp.docs is None or pp.docs > whole for pp in c.plans) and c.power_with_task is not None:
                parts.append(f"power {c.power_with_task:.2f} with all of them")
        else:
            parts.append(f"more than the task's {have:,}{reach}")
    if any(pp.docs is None for pp in c.plans):
        parts.append("no size reaches it")
    if any(pp.approximate for pp in c.plans):
        parts.append("≈ single-look n")
    if c.verdict == "DIFFERENT":
        parts.append("DIFFERENT in this run: this sizes the run for a true Δ of 0")
    return "; ".join(parts)
