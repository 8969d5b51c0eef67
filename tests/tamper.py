"""Ways to damage a finished run folder, as careless or hostile hands would, for the tamper fuzzer
(``tests/test_tamper.py``, ``benchmarks/tamper_fuzz.py``).

Each mutation is ``(name, args)``: plain data, so hypothesis can draw, shrink and print it. ``apply`` carries
one out on a copy of a run folder. None of them forges a record (a new seal, a recomputed identity): the
product's promise is about ordinary mistakes and careless copies, which never write a matching sha256.

The invariant every mutation is held to (``check``): ``evalparity report`` either prints the untouched
folder's sign-off line with its exit code, or refuses (exit 2, an ``error:`` line) or calls the run
incomplete (exit 5); it never prints another verdict, never changes or deletes a finished cell, and never
touches a path outside the run folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import sys
from pathlib import Path

import pandas as pd

from evalparity.samples import read_table, write_table

CELL_KEYS = ["cell", "status", "backend", "dtype", "batch_size", "tag", "base_cell", "tf32", "spec_identity",
             "model_fingerprint", "table", "settings", "versions", "aggregate", "error", "n_rows", "finished",
             "run_cells", "model_args", "device_name", "source"]
SPEC_KEYS = ["model", "tasks", "cells", "limit", "num_fewshot", "device", "alignment", "task_limits", "leaf_docs",
             "model_fingerprint", "task_configs", "software", "task_aliases", "memory_plan", "staging"]
COMPARE_KEYS = ["inputs", "names", "schema", "tasks_not_in_every_input"]
VALUES = [None, 0, 1, -1, 3.5, True, "", "x", "ok", "failed", "hf-fp32", "../x", "[bold]x[/]", "\x1b[31mred",
          [], {}, ["hf-fp32"], {"sha256": "0" * 64, "bytes": 1, "n_rows": 1}]

# name -> how many integer arguments it draws (each taken modulo what it indexes)
MUTATIONS: dict[str, int] = {
    "table_edit_value": 3,      # cell, row, column: a value changed
    "table_drop_rows": 2,       # cell, how many
    "table_duplicate_rows": 2,  # cell, times
    "table_reorder": 2,         # cell, seed
    "table_copy_from": 2,       # cell, other cell: one cell's table copied over another's
    "table_from_other_run": 1,  # cell: the same cell's table from another model's run
    "cell_copy_from": 2,        # a cell folder copied over another (record too)
    "cell_swap": 2,             # two cells' folders swapped
    "cell_symlink": 2,          # a cell folder replaced by a link to another's
    "cell_from_other_run": 1,   # a cell folder from another model's run
    "cell_link_other_run": 1,   # a cell folder replaced by a link to another model's run's
    "cell_extra": 2,            # a copy of a cell under a new name in cells/
    "cell_delete": 1,           # a cell folder removed
    "cell_json_edit": 3,        # cell, key, value
    "cell_json_drop": 2,        # cell, key
    "cell_json_delete": 1,      # cell.json removed
    "table_delete": 1,          # samples.parquet removed
    "spec_edit": 2,             # key, value
    "spec_drop": 1,             # key
    "spec_delete": 0,           # spec.json removed
    "spec_from_other_run": 0,   # spec.json of another model's run
    "spec_drop_cell": 1,        # one cell's entry taken out of spec.json
    "forge_stage": 2,           # a staging folder with .committed naming cells/stats, plus a forged lock
    "forge_trash": 1,           # a folder named like a moved-aside one, in cells/
    "outputs_symlink_out": 1,   # stats/ or report/ made a link to a folder outside the run
    "cells_symlink": 0,         # cells/ itself a link to a copy outside the run
    "cell_redeclare": 2,        # cell, how: its spec entry and cell.json edited to agree on another identity
    "attempts_symlink_out": 1,  # attempts/ a link outside the run, and an old history for the report to move
    "json_nest": 1,             # spec.json, a cell.json or the lock: JSON nested deeper than Python parses
    "cell_vanish": 1,           # a cell taken out of spec.json and its folder removed: a run without it
    "drift_junk": 2,            # cell, how: a hand-written drift/<cell>.json of another shape
}


def _cells(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "cells").iterdir() if not p.name.startswith(".")) \
        if (run / "cells").is_dir() else []


def _pick(items: list, i: int):
    return items[i % len(items)] if items else None


def _load(p: Path):
    return json.loads(p.read_text())


def _dump(p: Path, data) -> None:
    p.write_text(json.dumps(data))


def _rm(p: Path) -> None:
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)


def apply(run: Path, mutation: tuple[str, tuple[int, ...]], other: Path, outside: Path) -> None:
    """Carry out one mutation on ``run``; ``other`` is a run of another model with the same cell names and
    documents (so its cells align with these: only their records can tell them apart);
    ``outside`` a folder beside the run that no command may touch (links may point into a copy there)."""
    name, args = mutation
    a = list(args) + [0, 0, 0]
    names = _cells(run)
    cell = _pick(names, a[0])
    if name.startswith(("table_", "cell_")) and cell is None:
        return
    d = run / "cells" / cell if cell else None
    table = d / "samples.parquet" if d else None
    if d is not None and d.is_symlink() and name.startswith(("table_", "cell_json", "cell_extra")):
        return  # writing through a link would damage the folder it points to (another run), not this one
    if name.startswith("table_") and name not in ("table_delete", "table_copy_from", "table_from_other_run"):
        if not table.is_file() or table.is_symlink():
            return
        t = read_table(table)
        if not len(t):
            return
        if name == "table_edit_value":
            cols = [c for c in t.columns if c.startswith("m:") or c in ("loglikelihood", "doc_id", "task", "cell")]
            col = _pick(cols, a[2])
            row = a[1] % len(t)
            v = t.at[row, col]
            t.at[row, col] = (1 - v) if col.startswith("m:") else (v + 1 if col in ("loglikelihood", "doc_id")
                                                                    else f"{v}x")
        elif name == "table_drop_rows":
            t = t.drop(index=t.index[: 1 + a[1] % len(t)])
        elif name == "table_duplicate_rows":
            t = pd.concat([t] * (2 + a[1] % 30), ignore_index=True)
        elif name == "table_reorder":
            t = t.sample(frac=1.0, random_state=a[1]).reset_index(drop=True)
        write_table(t, table)
    elif name == "table_copy_from":
        src = run / "cells" / _pick(names, a[1]) / "samples.parquet"
        if src.is_file() and table != src:
            shutil.copyfile(src, table)
    elif name == "table_from_other_run":
        src = other / "cells" / cell / "samples.parquet"
        if src.is_file():
            shutil.copyfile(src, table)
    elif name == "table_delete":
        _rm(table)
    elif name in ("cell_copy_from", "cell_swap", "cell_symlink"):
        src = run / "cells" / _pick(names, a[1])
        if src == d or not src.is_dir() or not d.exists():  # gone, or a dangling link, after earlier damage
            return
        if name == "cell_copy_from":
            _rm(d)
            shutil.copytree(src, d, symlinks=True)
        elif name == "cell_swap":
            tmp = run / "cells" / "swap-tmp-x"
            d.rename(tmp)
            src.rename(d)
            tmp.rename(src)
        else:
            _rm(d)
            d.symlink_to(src.resolve())
    elif name in ("cell_from_other_run", "cell_link_other_run"):
        src = other / "cells" / cell
        if not src.is_dir():  # a cell the other run does not have (one this run's damage added)
            return
        _rm(d)
        if name == "cell_from_other_run":
            shutil.copytree(src, d)
        else:
            d.symlink_to(src.resolve())
    elif name == "cell_extra":
        shutil.copytree(d, run / "cells" / f"{cell}-copy{a[1] % 3}", dirs_exist_ok=True)
    elif name == "cell_delete":
        _rm(d)
    elif name in ("cell_json_edit", "cell_json_drop"):
        p = d / "cell.json"
        if not p.is_file():
            return
        data = _load(p)
        key = _pick(CELL_KEYS, a[1])
        if name == "cell_json_edit":
            data[key] = _pick(VALUES, a[2])
        else:
            data.pop(key, None)
        _dump(p, data)
    elif name == "cell_json_delete":
        _rm(d / "cell.json")
    elif name in ("spec_edit", "spec_drop", "spec_delete", "spec_from_other_run", "spec_drop_cell"):
        p = run / "spec.json" if (run / "spec.json").exists() else run / "compare.json"
        if name == "spec_delete":
            _rm(p)
            return
        if name == "spec_from_other_run":
            src = other / p.name
            if src.is_file():
                shutil.copyfile(src, p)
            return
        if not p.is_file():
            return
        data = _load(p)
        keys = SPEC_KEYS if p.name == "spec.json" else COMPARE_KEYS
        if name == "spec_edit":
            data[_pick(keys, a[0])] = _pick(VALUES, a[1])
        elif name == "spec_drop":
            data.pop(_pick(keys, a[0]), None)
        else:
            lst = data.get("cells") if p.name == "spec.json" else data.get("names")
            if isinstance(lst, list) and lst:
                del lst[a[0] % len(lst)]
                if p.name == "compare.json" and isinstance(data.get("inputs"), list) and data["inputs"]:
                    del data["inputs"][a[0] % len(data["inputs"])]
        _dump(p, data)
    elif name == "forge_stage":
        stage = run / f".tmp-outputs-{99999 + a[0] % 5}-forged"
        target = _pick(["cells", "stats", "report", "spec.json"], a[1])
        (stage / target).mkdir(parents=True, exist_ok=True)
        (stage / target / "forged.txt").write_text("forged")
        _dump(stage / ".committed", {"names": [target]})
        # a lock of a process that is gone (pid 2**22 + n is never alive here), naming the forged stage
        import platform

        _dump(run / ".evalparity.lock", {"host": platform.node(), "pid": 4194304 + a[0] % 7, "pid_start": None,
                                         "started": "2026-01-01T00:00:00+0000", "argv": ["report"],
                                         "stages": [stage.name]})
    elif name == "forge_trash":
        (run / "cells" / f".trash-{cell or 'x'}-1").mkdir(parents=True, exist_ok=True)
    elif name == "outputs_symlink_out":
        target = run / _pick(["stats", "report"], a[0])
        dest = outside / f"linked-{target.name}"
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "keep.txt").write_text("outside")
        _rm(target)
        target.symlink_to(dest)
    elif name == "cell_redeclare":
        # No hash is forged: the spec entry (the cells are not in the spec's identity) and the record are
        # edited to agree. how 0: the cell re-declared a repeat (label = its backend, tag = its dtype: the same
        # name) of a base cell that does not exist, which no comparison pairs; how 1: a named cell (label = its
        # name) that claims another dtype than its model was loaded in.
        sp, cj = run / "spec.json", d / "cell.json"
        if not (sp.is_file() and cj.is_file()):
            return
        spec, rec = _load(sp), _load(cj)
        entry = next((c for c in spec.get("cells", []) if isinstance(c, dict) and c.get("name") == cell), None)
        if entry is None or not isinstance(rec, dict) or not {"backend", "dtype"} <= set(entry):
            return
        if a[1] % 2 == 0:
            short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(entry["dtype"], "x")
            entry.update(label=entry["backend"], tag=short)
            rec.update(tag=short, base_cell=entry["backend"])
        else:
            other_dtype = "float32" if entry["dtype"] != "float32" else "bfloat16"
            entry.update(label=cell, dtype=other_dtype)
            rec.update(dtype=other_dtype, base_cell=cell)
        _dump(sp, spec)
        _dump(cj, rec)
    elif name == "drift_junk":
        body = _pick([{}, {"layers": "x"}, {"layers": [{"a": 1}]}, {"layers": [], "logprobs": 3}], a[1])
        (run / "drift").mkdir(exist_ok=True)
        _dump(run / "drift" / f"{cell or 'x'}.json", {"cell": cell or "x", "reference": "hf-fp32"} | body)
    elif name == "cell_vanish":
        sp = run / "spec.json"
        if sp.is_file() and d is not None:
            spec = _load(sp)
            if isinstance(spec.get("cells"), list):
                spec["cells"] = [c for c in spec["cells"] if not (isinstance(c, dict) and c.get("name") == cell)]
                _dump(sp, spec)
            _rm(d)
    elif name == "attempts_symlink_out":
        dest = outside / "attempts-dest"
        dest.mkdir(exist_ok=True)
        _rm(run / "attempts")
        (run / "attempts").symlink_to(dest)
        old = run / "cells" / f"{cell or 'x'}-old.attempts"
        old.mkdir(parents=True, exist_ok=True)
        (old / "log.txt").write_text("an attempt")
    elif name == "json_nest":
        target = _pick([run / "spec.json", d / "cell.json" if d else run / "spec.json", run / ".evalparity.lock"],
                       a[0])
        if target.parent.is_dir() and not target.parent.is_symlink():
            target.write_text("[" * 200000 + "]" * 200000)
    elif name == "cells_symlink":
        copy = outside / "cells-copy"
        if not copy.exists() and (run / "cells").is_dir():
            shutil.copytree(run / "cells", copy, symlinks=True)
        if copy.exists():
            _rm(run / "cells")
            (run / "cells").symlink_to(copy)


# ---------------------------------------------------------------- running `report` and the invariant
def tree_digest(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every path under ``root`` (not following links) with its content hash, link target or 'dir'."""
    out = {}
    if not root.exists() and not root.is_symlink():
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        rel = str(base.relative_to(root))
        if rel.startswith(skip) and rel != ".":
            continue
        for n in dirnames + filenames:
            p = base / n
            key = str(p.relative_to(root))
            if key.startswith(skip):
                continue
            if p.is_symlink():
                out[key] = "-> " + os.readlink(p)
            elif p.is_dir():
                out[key] = "dir"
            else:
                out[key] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def finished_cells(run: Path) -> dict[str, dict[str, str]]:
    """The finished cells in ``run`` (real folders holding an ok record), each with its files' digests."""
    out = {}
    cells = run / "cells"
    if cells.is_symlink() or not cells.is_dir():
        return out
    for d in cells.iterdir():
        if d.is_symlink() or not d.is_dir() or d.name.startswith("."):
            continue
        try:
            ok = _load(d / "cell.json").get("status") == "ok"
        except Exception:  # noqa: BLE001 - a damaged record: not a finished cell
            ok = False
        if ok:
            out[d.name] = tree_digest(d)
    return out


def run_cli(args: list[str]) -> tuple[int, str, str]:
    """``evalparity ARGS`` in this process (as the console script runs it): (exit code, stdout, stderr).

    What a command changes in the process is put back afterwards, so that the next test finds it as it was:
    the sign-off's state, ``sys.argv``, the SIGINT, SIGTERM and SIGHUP handlers (``main`` sets its own; SIGINT is
    ignored once a sign-off is printed) and the
    ``evalparity`` logger (``configure_logging`` gives it the console's handler and stops propagation, which
    would hide its records from pytest's caplog in a later test)."""
    import logging
    import signal

    from evalparity import cli
    from evalparity.cli import output

    output._signed_off = None  # one command per process in use; this runs many
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    handlers_before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    log = logging.getLogger("evalparity")
    handlers, level, propagate = list(log.handlers), log.level, log.propagate
    sys.argv = ["evalparity", *args]
    code: int | None = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
        for sig, handler in handlers_before.items():
            signal.signal(sig, handler)
        log.handlers[:] = handlers
        log.setLevel(level)
        log.propagate = propagate
        output._signed_off = None
    return int(code or 0), out.getvalue(), err.getvalue()


def sign_off_line(stdout: str) -> str | None:
    lines = [ln for ln in stdout.splitlines() if ln.split(":", 1)[0] in ("PASS", "FAIL", "INCONCLUSIVE", "INCOMPLETE")]
    return lines[-1] if lines else None


def check(run: Path, baseline: tuple[int, str], mutations: list, outside: Path, extra_args=()) -> str:
    """Run ``report`` on the mutated ``run`` and hold it to the invariant; returns what happened, in words
    (for the benchmark's tally). Raises AssertionError, naming the mutations, where the invariant fails."""
    before_cells = finished_cells(run)
    before_outside = tree_digest(outside)
    parent_before = sorted(p.name for p in run.parent.iterdir())
    code, out, err = run_cli(["report", str(run), *extra_args])
    line = sign_off_line(out)
    where = f"mutations {mutations}: exit {code}, stdout {out.strip()[-300:]!r}, stderr {err.strip()[-500:]!r}"
    assert "Traceback" not in err, where
    if code == 2:
        assert "error:" in err and line is None, where
        outcome = "refused (2)"
    elif code == 5:
        assert line is None or line.startswith("INCOMPLETE"), where
        outcome = "incomplete (5)"
    else:
        assert (code, line) == baseline, f"another verdict than the untouched folder's {baseline}: {where}"
        outcome = "same verdict"
    after_cells = finished_cells(run)
    for name, files in before_cells.items():
        assert after_cells.get(name) == files, f"finished cell {name} changed or was deleted: {where}"
    assert tree_digest(outside) == before_outside, f"a path outside the run was touched: {where}"
    assert sorted(p.name for p in run.parent.iterdir()) == parent_before, f"the run's parent changed: {where}"
    return outcome


def random_mutations(rng: random.Random, k: int) -> list[tuple[str, tuple[int, ...]]]:
    names = sorted(MUTATIONS)
    return [(n, tuple(rng.randrange(1000) for _ in range(MUTATIONS[n]))) for n in
            (rng.choice(names) for _ in range(k))]
