"""Synthetic run directories (no engines): per-sample tables with planted drift, for report-scale tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from evalparity.samples import write_table


def make_run(root: Path, *, n_tasks: int, cells: list[str], docs_per_task: int = 40, group: str = "mmlu",
             seed: int = 0, drift: dict[str, float] | None = None) -> Path:
    """A run directory whose tasks are members of one group; ``drift[cell]`` is the share of docs on which
    that cell's answer moves to a wrong choice."""
    rng = np.random.default_rng(seed)
    drift = drift or {}
    root.mkdir(parents=True, exist_ok=True)
    (root / "spec.json").write_text(json.dumps({"model": "synthetic", "tasks": [group], "cells": [], "limit": None,
                                                "alignment": {"seed": 1}}))
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
        backend, _, dtype = name.partition("-")
        (d / "cell.json").write_text(json.dumps({"cell": name, "status": "ok", "tag": "", "base_cell": name,
                                                 "backend": backend, "dtype": dtype, "batch_size": 8}))
    return root


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
