"""Cells in other Python environments (``--python NAME=PATH`` and ``python=NAME``) and on their own checkpoint
(``model=PATH``), end to end on a tiny random Llama, hf cells only (the quickest backend on 2 CPU cores).

The second environment is a venv made here, once per session: a bare ``python -m venv`` whose own
site-packages gets one other pinned transformers and a ``.pth`` file that adds this venv's site-packages
*after* its own. ``--system-site-packages`` would not do: this repository's environment is itself a venv,
and that flag reaches the base interpreter's site-packages, not this venv's. So the second environment runs
this evalparity, torch and lm-eval, and another transformers: a cell's record must say so.

The end-to-end tests read one real run (``envs_run``): the reference, a cell in the second venv and a cell on
its own checkpoint; each reads its cell's record and table, then resumes the run with one thing changed.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import ahead
import pytest
from conftest import cli, evalparity, one_line_error
from venvs import ALT_TRANSFORMERS, venv_python

from evalparity.errors import EvalParityError


def _run_args(model: Path, tasks: Path, out: Path, *extra: str) -> list[str]:
    return ["run", "--model", str(model), "--tasks", "tiny_mc", "--include-path", str(tasks), "--limit", "6",
            "--max-length", "256", "--out", str(out), *extra]


def _cell(out: Path, name: str) -> dict:
    return json.loads((out / "cells" / name / "cell.json").read_text())


@dataclass(frozen=True)
class EnvsRun:
    """The module's one real run (``envs_run``): the folder it ran from, its output, its cells' options, the
    finished command, the second venv's interpreter (None: no python= cell, the venv was skipped), and the
    run's model and tasks."""

    root: Path
    out: Path
    cells: tuple[str, ...]
    proc: subprocess.CompletedProcess
    alt: Path | None
    model: Path
    tasks: Path

    def again(self, *cells: str) -> subprocess.CompletedProcess:
        """The same command again, with ``cells`` as its cells' options (``self.cells`` when none)."""
        return evalparity(*_run_args(self.model, self.tasks, self.out, *(cells or self.cells)), cwd=self.root)


@ahead.job("envs_run")
def _envs_run(ctx: ahead.Context):
    """One run of the reference hf-fp32, a cell on its own checkpoint (``other``: model=./other, weights of
    its own) and a cell in the second venv (``alt``: python=alt), from its own folder: both end-to-end tests
    read it (one run of three cells, not two runs of two; each cell's record and table is its own either
    way). Without the second venv (the package index unreachable) the run has no python= cell, and only the
    test that needs it is skipped. Started ahead (tests/ahead.py)."""
    root = ctx.mktemp("envs")
    model, tasks = ctx.fixture("tiny_model"), ctx.fixture("tiny_tasks")
    _copy_with_scaled_weight(model, root / "other")
    cells: tuple[str, ...] = ("--cell", "other=hf:fp32:model=./other")
    try:
        alt = ctx.fixture("alt_venv")
        cells += ("--cell", "alt=hf:fp32:python=alt", "--python", f"alt={alt}")
    except pytest.skip.Exception:
        alt = None
    out = root / "r"
    cmd = cli(*_run_args(model, tasks, out, *cells))
    return lambda: EnvsRun(root, out, cells, ctx.run(cmd, cwd=root), alt, model, tasks)


@pytest.fixture(scope="module")
def envs_run(request) -> EnvsRun:
    return ahead.take("envs_run", request)


# ------------------------------------------------------------------ python=NAME
def test_a_cell_in_another_venv_records_it_and_signs_off(alt_venv, envs_run):
    out, proc = envs_run.out, envs_run.proc
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]  # the sign-off ran (6 docs: INCONCLUSIVE is right)
    assert f"python alt: {alt_venv}" in proc.stderr and f"transformers {ALT_TRANSFORMERS}" in proc.stderr
    ref, alt = _cell(out, "hf-fp32"), _cell(out, "alt")
    # each cell's record is from inside its own process: the interpreter, its venv and what it imported
    assert alt["interpreter"]["executable"] == str(alt_venv)
    assert alt["interpreter"]["prefix"] == str(alt_venv.parent.parent)
    assert ref["interpreter"]["executable"] == sys.executable or Path(ref["interpreter"]["prefix"]) == \
        Path(sys.prefix)
    assert alt["versions"]["transformers"] == ALT_TRANSFORMERS
    assert ref["versions"]["transformers"] == md.version("transformers") != ALT_TRANSFORMERS
    assert alt["versions"]["evalparity"] == ref["versions"]["evalparity"]
    assert alt["variant"] == {"python": "alt"} and ref["variant"] == {}
    spec = json.loads((out / "spec.json").read_text())
    assert spec["pythons"] == [["alt", str(alt_venv)]]
    verdicts = json.loads((out / "stats" / "verdicts.json").read_text())
    assert {c["cell"] for c in verdicts["comparisons"]} >= {"alt"}, verdicts["comparisons"][:1]

    # The same run resumed with python=alt pointing at this venv (another transformers): refused, in one line,
    # before any cell starts; the finished cells stay as they were.
    before = (out / "cells" / "alt" / "cell.json").read_bytes()
    cells = list(envs_run.cells)
    cells[cells.index(f"alt={alt_venv}")] = f"alt={sys.executable}"
    line = one_line_error(envs_run.again(*cells))
    assert "cell alt finished with transformers" in line and "--force" in line, line
    assert (out / "cells" / "alt" / "cell.json").read_bytes() == before


def test_doctor_asks_each_interpreter(alt_venv, tmp_path, monkeypatch):
    from io import StringIO

    from rich.console import Console

    from evalparity.backends import registry
    from evalparity.doctor import interpreters

    # the built-in backends only: a test module that imported tests/toy_backend.py registered "hfcopy" in this
    # process, which no other interpreter can load (a plugin named in EVALPARITY_PLUGINS would travel)
    monkeypatch.setattr(registry, "_TARGETS", {k: v for k, v in registry._TARGETS.items()
                                               if isinstance(v, str) and v.startswith("evalparity.")})

    bad = tmp_path / "not-python"
    bad.write_text("#!/bin/sh\nexit 0\n")
    bad.chmod(0o755)
    shown = StringIO()
    problems = interpreters(Console(file=shown, width=200), (("alt", str(alt_venv)), ("bad", str(bad))))
    text = shown.getvalue()
    assert problems == 1, text
    assert f"transformers {ALT_TRANSFORMERS}" in text and "--python bad=" in text and "cannot run a cell" in text


def _refused_before_any_cell(tmp_path: Path, tiny_model, tiny_tasks, *extra: str) -> str:
    out = tmp_path / "r"
    line = one_line_error(evalparity(*_run_args(tiny_model, tiny_tasks, out, *extra), cwd=tmp_path))
    assert not (out / "cells").exists() or not any((out / "cells").iterdir())
    return line


def test_interpreters_that_cannot_run_a_cell_are_refused_in_one_line(tiny_model, tiny_tasks, tmp_path):
    cell = ("--cell", "alt=hf:fp32:python=alt")
    line = _refused_before_any_cell(tmp_path, tiny_model, tiny_tasks, *cell)
    assert "python=alt, which no --python names" in line and "--python alt=" in line
    line = _refused_before_any_cell(tmp_path, tiny_model, tiny_tasks, *cell, "--python", "alt=/no/such/python")
    assert "/no/such/python does not exist" in line
    text = tmp_path / "text"
    text.write_text("not a program")
    line = _refused_before_any_cell(tmp_path, tiny_model, tiny_tasks, *cell, "--python", f"alt={text}")
    assert "is not an executable file" in line
    # a real Python without evalparity: a bare venv of the same base interpreter
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    line = _refused_before_any_cell(tmp_path, tiny_model, tiny_tasks, *cell, "--python", f"alt={venv_python(bare)}")
    if not os.environ.get("PYTHONPATH"):  # else evalparity is found through it, and numpy is what is missing
        assert "cannot import evalparity" in line and "pip install -e" in line, line
    assert "cannot" in line and str(bare) in line, line


def test_python_names_and_paths_parse(tmp_path):
    from evalparity.variants import check_interpreter_names, parse_cell, parse_pythons

    py = tmp_path / "venv" / "bin"
    py.mkdir(parents=True)
    link = py / "python"
    link.symlink_to(sys.executable)
    got = parse_pythons([f"new={link}"])
    assert got == (("new", str(link)),)  # the link kept: resolved, it would leave the venv
    for bad, words in ((["new"], "write NAME=/path"), ([f"new={link}", f"new={link}"], "given twice"),
                       ([f"../x={link}"], "--python name"), ([f"new={tmp_path}"], "not an executable file")):
        with pytest.raises(EvalParityError, match=words):
            parse_pythons(bad)
    cells = (parse_cell("a=hf:fp32:python=new", 8, 1, {}),)
    check_interpreter_names(cells, got)
    with pytest.raises(EvalParityError, match="python=new, which no --python names"):
        check_interpreter_names(cells, ())


def test_interpreters_are_recorded_but_not_the_identity():
    from evalparity.spec import CellSpec, RunSpec

    spec = RunSpec(model="m", tasks=("t",), cells=(CellSpec("hf", "float32", 8, label="a", python="new"),),
                   pythons=(("new", "/venv/bin/python"),))
    back = RunSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert back.pythons == spec.pythons and back.interpreter(back.cells[0]) == "/venv/bin/python"
    assert replace(spec, pythons=(("new", "/other/bin/python"),)).identity() == spec.identity()
    with pytest.raises(EvalParityError, match="no --python names"):
        replace(spec, pythons=()).interpreter(spec.cells[0])
    assert spec.interpreter(CellSpec("hf", "float32", 8)) == ""


# ------------------------------------------------------------------ model=PATH
def _copy_with_scaled_weight(src: Path, dest: Path, which: int = 0) -> Path:
    """A copy of the model whose ``which``-th tensor (by name) is scaled: other weights, the same tokenizer."""
    from safetensors.torch import load_file, save_file

    if not dest.exists():
        shutil.copytree(src, dest)
    path = next(dest.glob("*.safetensors"))
    tensors = load_file(path)
    name = sorted(tensors)[which]
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, path, metadata={"format": "pt"})
    return dest


def test_a_cell_scores_its_own_checkpoint_and_a_resume_with_other_weights_is_refused(envs_run, tiny_model):
    import pandas as pd

    out, proc, other = envs_run.out, envs_run.proc, envs_run.root / "other"
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]
    ref, mine = _cell(out, "hf-fp32"), _cell(out, "other")
    assert mine["model"] == mine["model_path"] == str(other) and mine["model_args"]["pretrained"] == str(other)
    assert ref["model_path"] == str(tiny_model)
    spec_cell = next(c for c in json.loads((out / "spec.json").read_text())["cells"] if c["name"] == "other")
    assert spec_cell["model"] == str(other)  # resolved: ./other from another folder would be another model
    assert mine["variant"] == {"model": str(other), "model_digest": spec_cell["model_fingerprint"]["digest"]}
    assert mine["model_fingerprint"] == ref["model_fingerprint"]  # the run's model, which the identity holds
    a = pd.read_parquet(out / "cells" / "hf-fp32" / "samples.parquet")
    b = pd.read_parquet(out / "cells" / "other" / "samples.parquet")
    assert (a["loglikelihood"] - b["loglikelihood"]).abs().max() > 1e-3  # it did score the other weights

    weights = next(other.glob("*.safetensors"))
    kept = weights.read_bytes()
    try:
        _copy_with_scaled_weight(tiny_model, other, which=1)  # new weights at the same path
        line = one_line_error(envs_run.again())
    finally:
        weights.write_bytes(kept)  # the module's run as it was, for the other test's resume
    assert "cell other finished with other weights at model=" in line and "model.safetensors changed" in line, line
    assert "--force" in line


def test_a_checkpoint_with_another_tokenizer_is_refused_in_one_line(tiny_model, tiny_tasks, tmp_path):
    from transformers import AutoTokenizer

    other = tmp_path / "other-tok"
    shutil.copytree(tiny_model, other)
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(other)
    line = _refused_before_any_cell(tmp_path, tiny_model, tiny_tasks, "--cell", f"other=hf:fp32:model={other}")
    assert "model=" in line and "is not tokenized as the run's model" in line and "401 tokens" in line, line


def test_tokenizer_difference_names_what_differs(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    from evalparity.models import tokenizer_difference
    from evalparity.rundir import model_fingerprint

    base = model_fingerprint(tiny_model, str(tiny_model))
    assert tokenizer_difference(tiny_model, base, tiny_model, base) is None  # identical files: not even loaded
    resaved = tmp_path / "resaved"  # the same tokenizer written again (other bytes, same tokens): the same
    shutil.copytree(tiny_model, resaved)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(resaved)
    (resaved / "tokenizer_config.json").write_text((resaved / "tokenizer_config.json").read_text() + "\n")
    assert tokenizer_difference(tiny_model, base, resaved, model_fingerprint(resaved, str(resaved))) is None
    other_eos = tmp_path / "eos"
    shutil.copytree(tiny_model, other_eos)
    tok = AutoTokenizer.from_pretrained(other_eos)
    tok.eos_token = "<unk>"
    tok.save_pretrained(other_eos)
    why = tokenizer_difference(tiny_model, base, other_eos, model_fingerprint(other_eos, str(other_eos)))
    assert why is not None and "EOS" in why, why


def test_a_cell_record_made_with_other_weights_is_refused_by_verification(tmp_path):
    from evalparity.rundir import layout, records
    from evalparity.spec import CellSpec

    entry = CellSpec("hf", "float32", 8, label="q", model="/m/q", model_fingerprint={"digest": "a" * 16})
    folder = tmp_path / "cells" / "q"
    folder.mkdir(parents=True)
    (folder / "samples.parquet").write_bytes(b"table")
    seal = records.seal_table(folder, 1).to_json()
    meta = {"cell": "q", "status": "ok", "backend": "hf", "dtype": "float32", "batch_size": 8, "tag": "",
            "tf32": False, "base_cell": entry.base_name, "spec_identity": "id", "model_fingerprint": "run",
            "variant": {"model": "/m/q", "model_digest": "b" * 16}, "table": seal,
            "model_args": {"pretrained": "/m/q", "dtype": "float32"}}
    records.write_cell(folder, meta)
    with pytest.raises(EvalParityError, match="its variant is"):
        records.verify_cell(folder, "id", entry, "run")
    records.write_cell(folder, meta | {"variant": entry.variant()})
    assert records.verify_cell(folder, "id", entry, "run").ok
    assert layout.cell_record(folder).exists()


def test_an_interpreter_that_hangs_is_refused_in_one_line(tmp_path):
    """A --python that never answers is stopped and refused (the run's wait is cells.PROBE_TIMEOUT_S)."""
    from evalparity.cells import InterpreterProbes
    from evalparity.errors import EvalParityError

    hang = tmp_path / "hangpy"
    hang.write_text("#!/bin/sh\nexec sleep 1000\n")
    hang.chmod(0o755)
    probes = InterpreterProbes({"h": str(hang)}, {"h": {"hf"}})
    with pytest.raises(EvalParityError, match=r"--python h=.* did not answer in 1 s"):
        probes.wait(timeout=1.0)
    assert probes.started["h"][1].poll() is not None  # stopped, not left running
