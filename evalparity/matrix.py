"""Expand a spec into cells, decide what is done, run the rest one process per cell, show progress.

Resume is by files: a cell whose ``cells/<name>/cell.json`` says ``ok`` (and whose table exists) is
skipped unless ``force``; everything else runs. A run directory belongs to one spec: a rerun with other
tasks, limits or settings into the same directory is refused rather than mixed in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evalparity import cells
from evalparity.errors import EvalParityError
from evalparity.spec import RunSpec


@dataclass
class CellOutcome:
    name: str
    status: str  # ok | failed | skipped
    wall_s: float
    meta: dict


def prepare_run_dir(run_dir: Path, spec: RunSpec) -> None:
    """Create the run directory and its spec.json, or check that an existing one is the same spec."""
    path = run_dir / "spec.json"
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError:
            raise EvalParityError(f"{path} is corrupt: remove it or use another --out") from None
        old_spec = RunSpec.from_json(old)
        if old_spec.identity() != spec.identity():
            a, b = old_spec.to_json(), spec.to_json()
            diff = next((k for k in a if k != "cells" and a[k] != b.get(k)), "settings")
            raise EvalParityError(
                f"{run_dir} holds a run of a different spec ({diff}: {a.get(diff)!r} there, {b.get(diff)!r} now): "
                "use another --out, or remove that directory")
        # Keep the union of cells, so that adding a cell to a run keeps the earlier ones in the spec.
        names = {c.name for c in spec.cells}
        merged = spec.to_json()
        merged["cells"] = [c for c in old["cells"] if c["name"] not in names] + merged["cells"]
        cells.write_json(path, merged)
        return
    if run_dir.exists() and any(p for p in run_dir.iterdir() if p.name != ".gitkeep"):
        raise EvalParityError(f"{run_dir} exists and is not an evalparity run directory: use another --out")
    (run_dir / "cells").mkdir(parents=True, exist_ok=True)
    cells.write_json(path, spec.to_json())


def cell_environment(spec: RunSpec, backend_env: dict[str, str], offline: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update(backend_env)
    env.update({"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "TQDM_MININTERVAL": "1"})
    if offline:
        env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    return env


def run_matrix(spec: RunSpec, run_dir: Path, model_path: str, *, force: bool = False, offline: bool = False,
               console: Console | None = None) -> list[CellOutcome]:
    """Run every cell not yet done; return one outcome per cell of the spec."""
    from evalparity import backends

    console = console or Console(stderr=True)
    prepare_run_dir(run_dir, spec)
    outcomes: dict[str, CellOutcome] = {}
    pending = []
    for cell in spec.cells:
        if cells.is_done(run_dir, cell.name) and not force:
            meta = cells.read_cell_json(run_dir / "cells" / cell.name) or {}
            outcomes[cell.name] = CellOutcome(cell.name, "skipped", 0.0, meta)
        else:
            pending.append(cell)
    if outcomes:
        console.print(f"[dim]{len(outcomes)} cell(s) already done, skipped: {', '.join(outcomes)} "
                      "(--force reruns them)[/dim]")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        overall = bar.add_task("cells", total=len(spec.cells), completed=len(outcomes))
        for cell in pending:
            inner = bar.add_task(f"  {cell.name}: starting", total=None)
            t0 = time.perf_counter()
            backend = backends.get(cell.backend)
            env = cell_environment(spec, backend.environment(spec, cell), offline)
            cmd = [sys.executable, "-m", "evalparity.cells", str(run_dir), cell.name, model_path]
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=False)
            progress_file = cells.tmp_dir(run_dir, cell.name) / "progress.json"
            try:
                while proc.poll() is None:
                    _show(bar, inner, cell.name, progress_file)
                    time.sleep(0.5)
            except KeyboardInterrupt:
                proc.terminate()
                proc.wait()
                raise
            wall = time.perf_counter() - t0
            if cells.tmp_dir(run_dir, cell.name).exists():
                _record_crash(run_dir, cell, proc.returncode, wall)
            final = run_dir / "cells" / cell.name
            meta = cells.read_cell_json(final) or {}
            failed_meta = cells.read_cell_json(run_dir / "cells" / f"{cell.name}.failed")
            if failed_meta and failed_meta.get("finished", "") > meta.get("finished", ""):
                meta = failed_meta
            status = meta.get("status", "failed")
            outcomes[cell.name] = CellOutcome(cell.name, status, wall, meta)
            bar.update(inner, description=f"  {cell.name}: {status} in {wall:.0f}s", total=1, completed=1)
            bar.update(overall, advance=1)
    return [outcomes[c.name] for c in spec.cells]


def _show(bar: Progress, task_id, name: str, progress_file: Path) -> None:
    try:
        st = json.loads(progress_file.read_text())
    except (OSError, json.JSONDecodeError):
        return
    desc = st.get("desc") or st.get("phase", "")
    total = st.get("total") or None
    bar.update(task_id, description=f"  {name}: {st.get('phase', '')} {desc}".rstrip()[:70],
               total=total, completed=st.get("n", 0) if total else 0)


def _record_crash(run_dir: Path, cell, returncode: int, wall: float) -> None:
    """The worker died before publishing (killed, out of memory): record that for this cell."""
    tmp = cells.tmp_dir(run_dir, cell.name)
    why = f"the cell process exited with code {returncode}"
    if returncode is not None and returncode < 0:
        why = f"the cell process was killed by signal {-returncode} (out of memory?)"
    meta = {"cell": cell.name, "backend": cell.backend, "dtype": cell.dtype, "batch_size": cell.batch_size,
            "tag": cell.tag, "base_cell": cell.base_name, "status": cells.STATUS_FAILED, "error": why,
            "wall_s": wall, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        cells.write_json(tmp / "cell.json", meta)
        (tmp / "progress.json").unlink(missing_ok=True)
        cells.publish(run_dir, cell.name, cells.STATUS_FAILED)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def summary_table(outcomes: list[CellOutcome]) -> Table:
    t = Table(title="cells")
    for col in ("cell", "status", "load s", "eval s", "wall s", "peak RSS GiB", "aggregate"):
        t.add_column(col)
    for o in outcomes:
        m = o.meta
        agg = []
        for task, vals in (m.get("aggregate") or {}).items():
            for k, v in vals.items():
                metric, _, filt = k.partition(",")
                if metric in ("acc", "acc_norm", "exact_match") and isinstance(v, float):
                    agg.append(f"{task} {metric}{'' if filt in ('', 'none') else '/' + filt}={v:.3f}")
        status = o.status if o.status != "failed" else f"[red]failed[/red]: {m.get('error', '')[:60]}"
        t.add_row(o.name, status, _num(m.get("load_s")), _num(m.get("eval_s")), _num(m.get("wall_s")),
                  _num(m.get("peak_rss_gib"), 2), "\n".join(agg[:6]) + ("\n..." if len(agg) > 6 else ""))
    return t


def _num(x, digits: int = 1) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "-"
