"""Synthetic run directories (no engines): per-sample tables with planted drift, for report-scale tests."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from evalparity.rundir import records
from evalparity.samples import write_table
from evalparity.spec import Alignment, CellSpec, RunSpec, parse_dtype


def make_run(root: Path, *, n_tasks: int, cells: list[str], docs_per_task: int = 40, group: str = "mmlu",
             seed: int = 0, drift: dict[str, float] | None = None, model: str = "synthetic") -> Path:
    """A run directory whose tasks are members of one group; ``drift[cell]`` is the share of docs on which
    that cell's answer moves to a wrong choice."""
    rng = np.random.default_rng(seed)
    drift = drift or {}
    root.mkdir(parents=True, exist_ok=True)
    spec = synthetic_spec(cells, tasks=(group,), model=model)
    (root / "spec.json").write_text(json.dumps(spec.to_json()))
    base = []
    for t in range(n_tasks):
        for d in range(docs_per_task):
            lls = rng.normal(-8, 2, 4)
            gold = int(rng.integers(4))
            for c in range(4):
                base.append({"task": f"{group}_subject_{t:02d}", "group": group, "filter": "none", "doc_id": d,
                             "choice": c, "output_type": "multiple_choice", "doc_hash": f"{t}-{d}",
                             "prompt_hash": f"p{t}-{d}", "target_hash": str(gold), "target": str(gold),
                             "context": f"Question {d} of subject {t}?", "continuation": f" answer {c}",
                             "loglikelihood": lls[c], "is_greedy": False, "gold": gold})
    base = pd.DataFrame(base)
    for name in cells:
        t = base.copy()
        noise = rng.normal(0, 0.01 if name != cells[0] else 0.0, len(t))
        t["loglikelihood"] = t["loglikelihood"] + noise
        rate = drift.get(name, 0.0)
        if rate:
            docs = t[["task", "doc_id"]].drop_duplicates()
            hit = docs.sample(frac=rate, random_state=seed)
            wrong = (t["gold"].astype(int) + 1) % 4
            mask = t.set_index(["task", "doc_id"]).index.isin(pd.MultiIndex.from_frame(hit)) & (t["choice"] == wrong)
            t.loc[mask, "loglikelihood"] += 6.0
        pred = t.loc[t.groupby(["task", "doc_id"])["loglikelihood"].idxmax(), ["task", "doc_id", "choice"]]
        acc = t.merge(pred, on=["task", "doc_id"], suffixes=("", "_pred"))
        t["m:acc"] = (acc["choice_pred"] == acc["gold"]).astype(float).to_numpy()
        d = root / "cells" / name
        d.mkdir(parents=True, exist_ok=True)
        t.insert(0, "cell", name)
        write_table(t, d / "samples.parquet")
        write_cell_record(d, spec, name, len(t))
    return root


def synthetic_spec(cells: list[str], tasks: tuple[str, ...] = ("syn",), model: str = "synthetic") -> RunSpec:
    """The spec of a synthetic run whose cells are named ``<backend>-<fp32|bf16|fp16>``, as a run writes it."""
    specs = []
    for name in cells:
        backend, _, dtype = name.partition("-")
        specs.append(CellSpec(backend, parse_dtype(dtype), 8))
    assert [c.name for c in specs] == list(cells), cells
    return RunSpec(model=model, tasks=tuple(tasks), cells=tuple(specs), alignment=Alignment(seed=1))


def write_cell_record(folder: Path, spec: RunSpec, name: str, n_rows: int, **extra) -> None:
    """The sealed ``cell.json`` a finished cell of ``spec`` has (``records.write_cell``)."""
    cell = next(c for c in spec.cells if c.name == name)
    records.write_cell(folder, {"cell": name, "status": "ok", "tag": cell.tag, "base_cell": cell.base_name,
                                "backend": cell.backend, "dtype": cell.dtype, "batch_size": cell.batch_size,
                                "tf32": cell.tf32, "variant": cell.variant(), "spec_identity": spec.identity(),
                                "model_fingerprint": None, "table": records.seal_table(folder, n_rows).to_json(),
                                # as a real cell records lm-eval's model arguments (records.verify_cell reads the dtype)
                                "model_args": {"pretrained": spec.model, "dtype": cell.dtype},
                                "run_cells": [c.name for c in spec.cells]}
                       | extra)


def make_lm_eval_dir(root: Path, *, model: str = "hf", dtype: str = "float32", task: str = "syn_mc",
                     n_docs: int = 30, flip: int = 0, seed: int = 0, sub: str = "model__x",
                     as_text: bool = False, bad: dict[int, object] | None = None,
                     date: str = "2025-01-01T00-00-00.000000") -> Path:
    """What ``lm_eval --log_samples --output_path ROOT`` writes for a 4-choice task, without lm-eval: a
    ``results_<date>.json`` and a ``samples_<task>_<date>.jsonl`` under ``ROOT/<sub>``. The first ``flip``
    documents answer wrongly (acc 0) where the others answer right. ``as_text``: every doc's acc written
    as a string ("1.0"), as some harnesses do; ``bad``: doc -> the acc value written for that doc instead;
    ``date``: the run's start stamp in the file names: a second call with the same date adds a task to that
    run, one with another date is a second run into the same --output_path."""
    import hashlib

    rng = np.random.default_rng(seed)
    d = root / sub
    d.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n_docs):
        ctx = f"Question {i}?"
        conts = [f" answer {c}" for c in range(4)]
        lls = list(rng.normal(-8, 1, 4))
        gold = i % 4
        lls[gold] = -1.0 if i >= flip else -20.0
        acc = float(i >= flip)
        value = (bad or {}).get(i, str(acc) if as_text else acc)
        h = lambda s: hashlib.sha256(s.encode()).hexdigest()  # noqa: E731
        lines.append({"doc_id": i, "doc": {"q": ctx}, "target": gold,
                      "arguments": {f"gen_args_{c}": {"arg_0": ctx, "arg_1": conts[c]} for c in range(4)},
                      "resps": [[[ll, False]] for ll in lls], "filtered_resps": [[ll, False] for ll in lls],
                      "filter": "none", "metrics": ["acc"], "doc_hash": h(ctx), "prompt_hash": h(ctx),
                      "target_hash": h(str(gold)), "acc": value})
    (d / f"samples_{task}_{date}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    path = d / f"results_{date}.json"  # a second task of the same run (same date) joins its results
    results = json.loads(path.read_text()) if path.exists() else {
        "results": {}, "configs": {},
        "config": {"model": model, "model_args": f"pretrained=x,dtype={dtype}", "batch_size": 8},
        "date": 0.0, "lm_eval_version": "0.4.9"}
    results["results"][task] = {"acc,none": sum(float(i >= flip) for i in range(n_docs)) / n_docs}
    results["configs"][task] = {"output_type": "multiple_choice"}
    path.write_text(json.dumps(results))
    return root


def add_cell(root: Path, cell: CellSpec, table: pd.DataFrame, **extra) -> None:
    """Add ``cell`` with per-sample ``table`` to a synthetic run: its spec entry, its table, its sealed record
    (with ``extra`` fields: ``versions``, ``reused_from``, ...)."""
    spec = RunSpec.from_json(json.loads((root / "spec.json").read_text()))
    spec = RunSpec.from_json(spec.to_json() | {"cells": [*spec.to_json()["cells"], asdict(cell) | {"name": cell.name}]})
    (root / "spec.json").write_text(json.dumps(spec.to_json()))
    d = root / "cells" / cell.name
    d.mkdir(parents=True, exist_ok=True)
    table = table.assign(cell=cell.name)
    write_table(table, d / "samples.parquet")
    write_cell_record(d, spec, cell.name, len(table), **extra)


def add_variant(root: Path, name: str, like: str, *, backend: str = "vllm", dtype: str = "bf16",
                args: dict[str, str] | None = None, env: dict[str, str] | None = None, drift: float = 0.0,
                seed: int = 0, **extra) -> CellSpec:
    """A named variant cell (``--cell NAME=BACKEND:DTYPE:k=v,...``) added to a synthetic run: the table of
    cell ``like`` with the answer of a ``drift`` share of its docs moved to a wrong choice (acc 0 there)."""
    from evalparity.samples import read_table

    cell = CellSpec(backend, parse_dtype(dtype), 8, label=name, args=tuple((args or {}).items()),
                    env=tuple((env or {}).items()))
    table = read_table(root / "cells" / like / "samples.parquet").drop(columns=["cell"])
    if drift:
        docs = table[["task", "doc_id"]].drop_duplicates().sample(frac=drift, random_state=seed)
        hit = table.set_index(["task", "doc_id"]).index.isin(pd.MultiIndex.from_frame(docs))
        table.loc[hit, "m:acc"] = 0.0
    add_cell(root, cell, table, **extra)
    return cell


def reseal(root: Path) -> None:
    """After a test edited a synthetic run's spec.json or tables on purpose (to build a case, not to tamper):
    rewrite every cell's record as the run would have written it, under the edited spec."""
    from evalparity.samples import read_table

    spec = RunSpec.from_json(json.loads((root / "spec.json").read_text()))
    for c in spec.cells:
        d = root / "cells" / c.name
        if (d / "cell.json").exists() and (d / "samples.parquet").exists():
            old = json.loads((d / "cell.json").read_text())
            write_cell_record(d, spec, c.name, len(read_table(d / "samples.parquet")),
                              **{k: v for k, v in old.items()
                                 if k not in ("spec_identity", "table", "run_cells", "model_args")})


def run_of_cells(src: Path, dest: Path, names: tuple[str, ...]) -> Path:
    """``dest``: a run of ``names`` alone, made of the finished run ``src``'s cells of those names (copied)
    with its spec narrowed to them, as if the run had had those cells only: their records' ``run_cells`` say so
    too (``records.verify_run`` refuses a spec that lost cells its records name). For tests that need a real
    run of fewer cells without scoring them again."""
    spec = json.loads((src / "spec.json").read_text())
    spec["cells"] = [c for c in spec["cells"] if c["name"] in names]
    (dest / "cells").mkdir(parents=True)
    (dest / "spec.json").write_text(json.dumps(spec))
    for name in names:
        shutil.copytree(src / "cells" / name, dest / "cells" / name)
        record = dest / "cells" / name / "cell.json"
        rec = json.loads(record.read_text())
        if "run_cells" in rec:
            rec["run_cells"] = [c["name"] for c in spec["cells"]]
            record.write_text(json.dumps(rec))
    return dest
