"""A cell's parts (a sharded cell's shards, a staged run's rounds) become the cell when they are merged, and
its record then speaks for all of them. So only parts that are this cell's, scored as its spec entry says,
on one device and install, with the tables they sealed, may be merged (``records.verify_part``,
``shards.stage_merged``). A property over generated cases, built without engines: any one change that a
resume with other options, a copy or an edit makes to one part is refused in one line naming that part,
before anything of the merged cell is written; what may differ between parts (process, timings, host,
placement) merges, and the merged cell is what verification of a run reads as that cell."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from synthetic import write_cell_record

from evalparity import shards, stager
from evalparity.errors import EvalParityError
from evalparity.rundir import layout, records, rounds
from evalparity.samples import read_table, write_table
from evalparity.spec import Alignment, CellSpec, RunSpec

N_CASES = 120

# What each part of one cell records alike, beyond its spec entry: the values a part of another device,
# install or cell would have instead. Written here, apart from the product's own lists, as the claim.
ELSEWHERE = {
    "device_name": "NVIDIA A100-SXM4-80GB",
    "versions": {"python": "3.11.7", "torch": "2.9.0", "transformers": "4.57.0", "lm_eval": "0.4.9"},
    "precision": {"float32_matmul_precision": "high", "cuda_matmul_allow_tf32": True},
    "interpreter": {"executable": "/opt/other/bin/python", "prefix": "/opt/other", "python": "3.11.7"},
    # rows of an earlier run (--reference-from) where the other parts were scored here (or the reverse)
    "reused_from": {"run_dir": "/runs/old", "cell": "hf-fp32"},
}
# What may differ from part to part of one cell: its own process and when and where it ran.
MAY_DIFFER = {"pid": 4242, "host": "node-7", "started": "2026-01-01T00:00:00+0000", "load_s": 9.5, "eval_s": 1.25,
              "wall_s": 12.0, "peak_rss_gib": 3.5, "placement": {"executor": "ray", "host": "node-7"},
              "finished": "2026-01-01T00:01:00+0000"}


def _cells() -> list[CellSpec]:
    """Cells of several roles: plain, another batch size, a named variant, a noise-floor repeat, TF32."""
    base = CellSpec("hf", "float32", 8)
    return [base, CellSpec("vllm", "bfloat16", 8), CellSpec("hf", "float32", 4, tag="bs4"),
            CellSpec("vllm", "bfloat16", 8, label="vllm-bf16-fp8", args=(("quantization", "fp8"),)),
            CellSpec("hf", "float32", 8, tag="tf32", tf32=True)]


DIGEST = "5eed" * 16  # the run's model's fingerprint


def _spec(cells: list[CellSpec]) -> RunSpec:
    return RunSpec(model="synthetic", tasks=("syn",), cells=tuple(cells), alignment=Alignment(seed=1),
                   model_fingerprint={"digest": DIGEST})


def _rows(cell: str, docs: list[int]) -> pd.DataFrame:
    return pd.DataFrame([{"cell": cell, "task": "syn", "filter": "none", "doc_id": d, "choice": c,
                          "doc_hash": f"d{d}", "prompt_hash": f"p{d}", "target_hash": "0", "group": "syn",
                          "output_type": "multiple_choice", "loglikelihood": -1.0 - c - d / 10, "m:acc": 1.0}
                         for d in docs for c in range(2)])


def _write_part(folder: Path, spec: RunSpec, cell: CellSpec, docs: list[int], place: dict) -> None:
    folder.mkdir(parents=True)
    table = _rows(cell.name, docs)
    write_table(table, layout.table(folder))
    write_cell_record(folder, spec, cell.name, len(table), **{k: v for k, v in place.items() if v is not None},
                      device_name="CPU: test", versions={"python": "3.11.7", "torch": "2.13.0+cpu"},
                      precision={"float32_matmul_precision": "highest"},
                      interpreter={"executable": "/venv/bin/python", "prefix": "/venv", "python": "3.11.7"},
                      pid=1000, host="vm", load_s=1.0, eval_s=2.0, wall_s=3.0, model_fingerprint=DIGEST)


def _edit_record(folder: Path, **fields) -> None:
    path = layout.cell_record(folder)
    rec = json.loads(path.read_text())
    rec.update(fields)
    path.write_text(json.dumps(rec))


def _changes(spec: RunSpec, cell: CellSpec, parts: list[Path], i: int, rng: random.Random):
    """(what, edit of part i, whether it must be refused): every kind of change, one of them drawn per case."""
    others = [c for c in spec.cells if c.name != cell.name]
    other = rng.choice(others)
    d = parts[i]
    j = (i + 1) % len(parts)
    yield "another cell's name", lambda: _edit_record(d, cell=other.name), True
    for key, value in (("backend", other.backend if other.backend != cell.backend else "server"),
                       ("dtype", "bfloat16" if cell.dtype == "float32" else "float32"),
                       ("batch_size", cell.batch_size * 2), ("tag", "bs16" if cell.tag != "bs16" else ""),
                       ("tf32", not cell.tf32), ("base_cell", "another-cell"),
                       ("variant", {"args": {"attn_implementation": "eager"}}),
                       ("spec_identity", "0123456789abcdef"), ("model_fingerprint", "feedbeef")):
        yield f"{key} changed", (lambda k=key, v=value: _edit_record(d, **{k: v})), True
    yield "loaded in another dtype", lambda: _edit_record(
        d, model_args={"pretrained": "synthetic", "dtype": "bfloat16" if cell.dtype == "float32" else "float32"}), True
    yield "no model_args", lambda: _edit_record(d, model_args=None), True
    for key, value in ELSEWHERE.items():
        yield f"{key} of another machine", (lambda k=key, v=value: _edit_record(d, **{k: v})), True
    yield "table edited", lambda: write_table(read_table(layout.table(d)).assign(loglikelihood=-0.5),
                                              layout.table(d)), True
    yield "another part's table and record copied in", lambda: (shutil.rmtree(d), shutil.copytree(parts[j], d)), True
    yield "record without its seal", lambda: _edit_record(d, table=None), True
    link = layout.table(d)
    yield "the table a link", lambda: (link.unlink(), link.symlink_to(layout.table(parts[j]))), True
    for key, value in MAY_DIFFER.items():
        yield f"{key} differs", (lambda k=key, v=value: _edit_record(d, **{k: v})), False


def _build(root: Path, rng: random.Random, staged: bool):
    """A run folder with one cell's finished parts: its rounds (staged) or its shards."""
    cells = _cells()
    pick = rng.randrange(len(cells))
    n = rng.randint(2, 4)
    if not staged:
        cells[pick] = replace(cells[pick], shards=n)
    spec = _spec(cells)
    cell = spec.cells[pick]
    docs = list(range(3 * n))
    parts = []
    for k in range(n):
        if staged:
            folder, place = rounds.part_dir(root, cell.name, k), {"round": k}
        else:
            folder, place = shards.shard_dirs(root, cell)[k], {"shard": {"index": k, "of": n}}
        _write_part(folder, spec, cell, docs[k::n] if not staged else docs[3 * k:3 * k + 3], place)
        parts.append(folder)
    (root / "spec.json").write_text(json.dumps(spec.to_json()))
    return spec, cell, parts


def _merge(root: Path, spec: RunSpec, cell: CellSpec, parts: list[Path], staged: bool) -> None:
    if staged:
        stager.merge_parts(root, spec, cell, len(parts), 0.0)
    else:
        shards.merge(root, spec, cell)


def _decide(root: Path, spec: RunSpec, cell: CellSpec, parts: list[Path]) -> None:
    """What a staged run's decision after its last round reads of the parts (``stager.read_parts``)."""
    tables, _ = stager.read_parts(root, spec, len(parts) - 1)
    assert len(tables[cell.name]) == 2 * 3 * len(parts)


@pytest.mark.parametrize("staged", [False, True], ids=["shards", "rounds"])
def test_only_parts_that_are_the_cell_as_scored_are_merged(tmp_path, staged):
    rng = random.Random(20261205 + staged)
    seen: dict[str, int] = {}
    for case in range(N_CASES):
        root = tmp_path / f"c{case}"
        spec, cell, parts = _build(root, rng, staged)
        i = rng.randrange(len(parts))
        changes = list(_changes(spec, cell, parts, i, rng))
        what, edit, refused = changes[case % len(changes)]  # every kind, on drawn cells, parts and part
        seen[what] = seen.get(what, 0) + 1
        edit()
        where = f"case {case}: {cell.name}, {len(parts)} parts, part {i}: {what}"
        final = layout.cell_dir(root, cell.name)
        if refused:
            with pytest.raises(EvalParityError) as err:
                _merge(root, spec, cell, parts, staged)
            said = str(err.value)
            assert "\n" not in said and parts[i].name in said, (where, said)
            if staged:  # nor is it decided on
                with pytest.raises(EvalParityError) as err:
                    _decide(root, spec, cell, parts)
                assert "\n" not in str(err.value) and parts[i].name in str(err.value), (where, str(err.value))
            cells_dir = layout.cells_dir(root)  # nothing of the merged cell written
            assert not cells_dir.exists() or not any(cells_dir.iterdir()), (where, list(cells_dir.iterdir()))
        else:
            if staged:
                _decide(root, spec, cell, parts)
            _merge(root, spec, cell, parts, staged)
            got = records.verify_cell(final, spec.identity(), cell, None)
            assert isinstance(got, records.CellRecord), (where, got)
            merged = read_table(layout.table(final))
            want = pd.concat([read_table(layout.table(p)) for p in parts]).sort_values(
                ["task", "filter", "doc_id", "choice"]).reset_index(drop=True)
            pd.testing.assert_frame_equal(merged, want, obj=where)
    assert len(seen) == len(changes) and min(seen.values()) >= 4, seen  # each kind of change, several times
