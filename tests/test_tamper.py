"""Issue 25: a sign-off that ordinary mistakes cannot make lie.

A fuzzer (hypothesis) damages copies of a finished run folder and of a finished comparison folder in the
ways ``tests/tamper.py`` lists (edited, deleted, duplicated or reordered rows; copied, swapped or symlinked
cells; edited or deleted json fields and files; forged staging folders and locks; links out of the run),
one to three at a time, and holds ``evalparity report`` to the invariant (``tamper.check``): the untouched
folder's verdict and exit code, or a refusal (exit 2) or INCOMPLETE (exit 5); never another verdict, never
a finished cell changed or deleted, never a path outside the run touched. ``EVALPARITY_TAMPER_EXAMPLES``
sets how many examples each target gets (default 60, about 45 s in all on 2 cores);
``benchmarks/tamper_fuzz.py`` runs thousands.

Below it, each case the issue names, by itself.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import ahead
import pytest
import tamper
from conftest import cli, evalparity_here, one_line_error, tiny_run_copy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic import make_lm_eval_dir, make_run

from evalparity.config import KILL_ENV

CELLS = ["hf-fp32", "vllm-fp32", "hf-bf16"]
EXAMPLES = int(os.environ.get("EVALPARITY_TAMPER_EXAMPLES", "60"))


def _baseline_run(root: Path, model: str = "synthetic", drifting: str = "vllm-fp32") -> Path:
    """A finished run whose sign-off is FAIL: one cell moves 60 % of the docs, the others none. Runs of
    another model share its documents and prompts, so only their records tell their cells apart."""
    run = make_run(root, n_tasks=2, cells=CELLS, docs_per_task=300, drift={drifting: 0.6}, model=model)
    code, out, err = tamper.run_cli(["report", str(run)])
    assert code == 3 and out.startswith("FAIL"), (code, out, err[-2000:])
    return run


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(run, its baseline, another model's run, comparison, its baseline, another comparison)."""
    base = tmp_path_factory.mktemp("tamper")
    run = _baseline_run(base / "run")
    other = _baseline_run(base / "other", model="another/model", drifting="hf-bf16")
    lm = [make_lm_eval_dir(base / "lm" / n, dtype=d, flip=f, seed=s)
          for n, d, f, s in (("a", "float32", 0, 0), ("b", "bfloat16", 0, 1), ("c", "float16", 12, 2))]
    comp = base / "comp"
    code, out, err = tamper.run_cli(["compare", *map(str, lm), "--out", str(comp)])
    assert code == 3 and out.startswith("FAIL"), (code, out, err[-2000:])
    lm2 = [make_lm_eval_dir(base / "lm2" / n, dtype=d, flip=f, seed=s)
           for n, d, f, s in (("a", "float32", 0, 5), ("b", "bfloat16", 3, 6), ("c", "float16", 0, 7))]
    comp2 = base / "comp2"
    tamper.run_cli(["compare", *map(str, lm2), "--out", str(comp2)])
    baseline = tamper.run_cli(["report", str(run)])
    comp_baseline = tamper.run_cli(["report", str(comp)])
    return (run, (baseline[0], tamper.sign_off_line(baseline[1])), other,
            comp, (comp_baseline[0], tamper.sign_off_line(comp_baseline[1])), comp2)


def _copy(src: Path) -> tuple[Path, Path, Path]:
    """A fresh copy of ``src`` in a folder of its own, with an ``outside`` folder beside it."""
    top = Path(tempfile.mkdtemp(prefix="tamper-"))
    run = top / "run"
    shutil.copytree(src, run, symlinks=True)
    outside = top / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    return top, run, outside


MUTATION = st.sampled_from(sorted(tamper.MUTATIONS)).flatmap(
    lambda n: st.tuples(st.just(n), st.tuples(*[st.integers(0, 999)] * tamper.MUTATIONS[n])))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _damage_and_check(folder: Path, baseline: tuple[int, str], other: Path, mutations: list) -> None:
    """Damage a copy of ``folder`` (``other``: a folder of another model with the same cell names) and hold
    ``report`` on it to the invariant."""
    top, run, outside = _copy(folder)
    try:
        for m in mutations:
            tamper.apply(run, m, other, outside)
        tamper.check(run, baseline, mutations, outside)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@FUZZ
@given(mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_a_damaged_run_never_signs_off_another_verdict(folders, mutations):
    run0, baseline, other, *_ = folders
    _damage_and_check(run0, baseline, other, mutations)


@FUZZ
@given(mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_a_damaged_comparison_never_signs_off_another_verdict(folders, mutations):
    *_, comp0, baseline, comp2 = folders
    _damage_and_check(comp0, baseline, comp2, mutations)


# ---------------------------------------------------------------- the cases, one by one
CASES = {
    # name: (mutations, exit code, words the one line says)
    "rows repeated 30x": ([("table_duplicate_rows", (1, 28))], 2, "not the table its cell wrote"),
    "the reference's table copied into another cell": ([("table_copy_from", (2, 0))], 2,
                                                        "not the table its cell wrote"),
    "a cell copied from another model's run": ([("cell_from_other_run", (1,))], 2, "spec identity"),
    "a cell folder symlinked to another": ([("cell_symlink", (1, 0))], 2, "symbolic link"),
    "two cell folders linked to each other (a loop)": ([("cell_symlink", (0, 1)), ("cell_symlink", (1, 0))], 2,
                                                       "symbolic link"),
    "a cell folder symlinked to another model's run's": ([("cell_link_other_run", (2,))], 2, "symbolic link"),
    "a cell copied over another, record and all": ([("cell_copy_from", (1, 0))], 2, "record of cell"),
    "spec.json removed": ([("spec_delete", ())], 2, "no spec.json"),
    "spec.json removed together with the failing cell": ([("spec_delete", ()), ("cell_delete", (2,))], 2,
                                                         "no spec.json"),
    "spec.json's model edited by hand": ([("spec_edit", (0, 7))], 2, "spec identity"),
    "spec.json of another model's run": ([("spec_from_other_run", ())], 2, "spec identity"),
    "a cell taken out of spec.json": ([("spec_drop_cell", (2,))], 2, "not a cell of this run"),
    "an extra cell folder": ([("cell_extra", (0, 0))], 2, "not a cell of this run"),
    "cell.json without its seal": ([("cell_json_drop", (1, 10))], 2, "no seal"),
    "cell.json's cell renamed": ([("cell_json_edit", (2, 0, 10))], 2, "record of cell"),
    "a forged staging folder whose .committed names cells": ([("forge_stage", (0, 0))], 3, None),
    # found by session 24's adversarial review (the cells are not in the spec's identity, cell.json is not sealed)
    "the failing cell re-declared a repeat of a cell that is not there": ([("cell_redeclare", (2, 0))], 2,
                                                                         "which no repeat is"),
    "a cell re-declared a named cell of another dtype": ([("cell_redeclare", (1, 1))], 2, "was loaded as"),
    "the failing cell taken out of spec.json, its folder removed": ([("cell_vanish", (2,))], 2,
                                                                     "no longer names"),
    "a hand-written drift summary of another shape": ([("drift_junk", (2, 2))], 2, "drift summary"),
    "attempts/ a link outside the run": ([("attempts_symlink_out", (0,))], 2, "symbolic link"),
    "spec.json nested too deeply to parse": ([("json_nest", (0,))], 2, "corrupt"),
    "a cell.json nested too deeply to parse": ([("json_nest", (1,))], 2, "corrupt"),
    "the lock nested too deeply to parse": ([("json_nest", (2,))], 2, "not a lock"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_named_case(folders, case):
    """Each fails on the evalparity before issue 25 (its report signed off PASS, another verdict, or
    deleted every cell); now it refuses in one line or keeps the verdict and the cells."""
    run0, baseline, other, *_ = folders
    mutations, code, says = CASES[case]
    top, run, outside = _copy(run0)
    try:
        for m in mutations:
            tamper.apply(run, m, other, outside)
        got = tamper.run_cli(["report", str(run)])
        assert got[0] == code, got
        if says:
            assert says in got[2] and got[2].count("error:") == 1, got[2]
        tamper.check(run, baseline, mutations, outside)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_cell_column_and_row_count_are_checked_even_under_a_matching_seal(folders):
    """The seal pins the bytes; the rows are checked too, so a writer that sealed a wrong table (or a seal
    recomputed by hand) still cannot pass another cell's rows or repeated keys for this cell's."""
    from synthetic import reseal

    from evalparity.samples import read_table, write_table

    run0, *_ = folders
    for damage, says in (("cell", "not vllm-fp32's"), ("dup", "repeated rows")):
        top, run, outside = _copy(run0)
        path = run / "cells" / "vllm-fp32" / "samples.parquet"
        t = read_table(path)
        t = t.assign(cell="hf-fp32") if damage == "cell" else t.iloc[list(range(len(t))) + [0]]
        write_table(t, path)
        reseal(run)
        code, _, err = tamper.run_cli(["report", str(run)])
        assert code == 2 and says in err, err
        shutil.rmtree(top, ignore_errors=True)


def test_out_inside_another_run_is_refused(folders, tmp_path):
    """`--out OUTER/stats/inner` used to be deleted by the outer run's next report; inside OUTER/cells/ it
    left the outer run at exit 5 for good."""
    run0, *_ = folders
    top, run, outside = _copy(run0)
    lm = [make_lm_eval_dir(tmp_path / n, dtype=d, seed=i) for i, (n, d) in enumerate((("a", "float32"),
                                                                                        ("b", "bfloat16")))]
    for inner in (run / "stats" / "inner", run / "cells" / "inner", run / "cells" / "hf-fp32" / "x"):
        before = tamper.tree_digest(run)
        proc = evalparity_here("compare", *map(str, lm), "--out", str(inner))
        line = one_line_error(proc)
        assert proc.returncode == 2 and "inside the run directory" in line, line
        assert tamper.tree_digest(run) == before
    shutil.rmtree(top, ignore_errors=True)


def test_recovery_finishes_only_what_a_command_of_the_run_staged(folders):
    """A staging folder is finished only when the lock of the (dead) command that made it names it; a
    forged .committed naming cells/ never replaces (deletes) the finished cells."""
    from evalparity import rundir

    run0, *_ = folders
    top, run, outside = _copy(run0)
    cells_before = tamper.finished_cells(run)
    stage = run / ".tmp-outputs-12345-forged"
    (stage / "cells").mkdir(parents=True)
    (stage / ".committed").write_text(json.dumps({"names": ["cells"]}))
    with rundir.acquire(run, create=False):
        rundir.recover_outputs(run)
    assert tamper.finished_cells(run) == cells_before and stage.is_dir()  # not ours: left alone
    import platform

    lock = run / ".evalparity.lock"  # now a dead command's lock that names it: taken over, cells still kept
    lock.write_text(json.dumps({"host": platform.node(), "pid": 4194311, "stages": [stage.name]}))
    with rundir.acquire(run, create=False):
        rundir.recover_outputs(run)
    assert tamper.finished_cells(run) == cells_before and not stage.exists()
    shutil.rmtree(top, ignore_errors=True)


def test_task_configuration_and_software_are_part_of_the_identity(tmp_path):
    """Resuming after a task YAML changed (max_gen_toks 12 -> 1) reported the new cell's 1-token
    generations as drift; the identity now covers the YAMLs' contents and the software versions."""
    from evalparity import tasks
    from evalparity.errors import EvalParityError
    from evalparity.matrix import prepare_run_dir
    from evalparity.spec import CellSpec, RunSpec

    inc = tmp_path / "tasks"
    inc.mkdir()
    (inc / "t.yaml").write_text("task: t\ngeneration_kwargs:\n  max_gen_toks: 12\n")
    before = tasks.config_digest([str(inc)])
    cells = (CellSpec("hf", "float32", 8), CellSpec("vllm", "float32", 8))
    spec = RunSpec(model="m", tasks=("t",), cells=cells, include_paths=(str(inc),), task_configs=before,
                   software=(("lm_eval", "0.4.13"),))
    run = tmp_path / "run"
    prepare_run_dir(run, spec)
    (inc / "t.yaml").write_text("task: t\ngeneration_kwargs:\n  max_gen_toks: 1\n")
    after = tasks.config_digest([str(inc)])
    assert after != before
    fp16 = (*cells, CellSpec("hf", "float16", 8))
    for changed in (RunSpec(**{**spec.__dict__, "cells": fp16, "task_configs": after}),
                    RunSpec(**{**spec.__dict__, "cells": fp16, "software": (("lm_eval", "0.4.14"),)})):
        with pytest.raises(EvalParityError, match="different spec"):
            prepare_run_dir(run, changed)
    prepare_run_dir(run, RunSpec(**{**spec.__dict__, "cells": fp16}))  # the same experiment resumes


@ahead.job("forced_run")
def _forced_run(ctx: ahead.Context):
    """A --force rerun of the HF cells of a copy of the shared tiny run, killed as hf-bf16 publishes (started
    ahead: tests/ahead.py). The HF cells are the ones rerun: what --force does is the same for every backend,
    and an HF cell of the tiny model starts in a quarter of a vLLM one's time (no engine)."""
    model, tasks = ctx.fixture("tiny_model"), ctx.fixture("tiny_tasks")

    def work():
        run = tiny_run_copy()
        args = ["run", "--model", str(model), "--tasks", "tiny_mc,tiny_gen", "--include-path", str(tasks),
                "--dtypes", "fp32,bf16", "--backends", "hf", "--limit", "10", "--max-length", "512", "--out", str(run)]
        return run, ctx.run(cli(*args, "--force"), env={KILL_ENV: "publish-cell:hf-bf16"}, timeout=900)
    return work


@pytest.fixture
def forced_run(tiny_run, request):
    return ahead.take("forced_run", request)


def test_force_rerun_killed_is_incomplete_not_the_old_verdict(forced_run, tiny_run):
    """After a --force rerun whose cell was killed, report signed off on the pre-force cell. The cells a
    forced run redoes are moved to attempts/ first, so until they finish again the run is INCOMPLETE."""
    run, proc = forced_run
    assert proc.returncode != 0, proc.stderr[-3000:]  # killed with hf-bf16's publish (the hook kills the run too)
    rep = evalparity_here("report", str(run))
    assert rep.returncode == 5 and rep.stdout.startswith("INCOMPLETE") and "hf-bf16" in rep.stdout, \
        (rep.stdout, rep.stderr[-2000:])
    kept = sorted(p.parent.name for p in (run / "attempts" / "cells").glob("*/superseded-*"))
    assert kept == ["hf-bf16", "hf-fp32"]  # the cells --force replaced are kept, not deleted
    assert (run / "cells" / "hf-fp32" / "cell.json").stat().st_mtime > (tiny_run[0] / "cells" / "hf-fp32" /
                                                                        "cell.json").stat().st_mtime  # redone


def test_a_comparison_cells_tag_is_verified_too(folders):
    """Found by the fuzzer (benchmarks/tamper_fuzz.py, case 361): a comparison's cell whose record was given
    a tag became a noise-floor repeat, leaving the gating family (FAIL: 1 of 2 -> FAIL: 1 of 1). Every field
    the statistics read (tag, tf32, base_cell) is verified against the spec, a comparison's cells too."""
    *_, comp0, baseline, comp2 = folders
    for key, value in ((5, 11), (6, 10), (7, 5)):  # tag '../x', base_cell 'hf-fp32', tf32 true
        top, run, outside = _copy(comp0)
        mutations = [("cell_json_edit", (1, key, value))]
        tamper.apply(run, mutations[0], comp2, outside)
        code, _, err = tamper.run_cli(["report", str(run)])
        assert code == 2 and "the spec's is" in err, (mutations, err)
        tamper.check(run, baseline, mutations, outside)
        shutil.rmtree(top, ignore_errors=True)


def test_every_record_field_of_a_wrong_type_is_one_line_never_a_traceback(folders, tmp_path):
    """Found by the fuzzer (benchmarks/tamper_fuzz.py): spec.json's model_fingerprint made a string crashed
    report with an AttributeError. Every field of spec.json, a cell.json and compare.json, set to every value
    of ``tamper.VALUES`` (and deleted), is either read or refused in one line (EvalParityError)."""
    from evalparity.errors import EvalParityError
    from evalparity.rundir import records

    run0, _, _, comp0, *_ = folders
    cases = [(run0 / "spec.json", tamper.SPEC_KEYS + ["alignment.seed", "alignment.max_length"],
              lambda p: records.verify_run(p.parent)),
             (run0 / "cells" / "vllm-fp32" / "cell.json", tamper.CELL_KEYS,
              lambda p: records.check_cell(p.parent)),
             (comp0 / "compare.json", tamper.COMPARE_KEYS, lambda p: records.read_compare(p.parent))]
    tried = 0
    for original, keys, read in cases:
        data = json.loads(original.read_text())
        for key in keys:
            for value in [*tamper.VALUES, "DELETE"]:
                top, run, outside = _copy(original.parents[2] if original.name == "cell.json" else original.parent)
                path = run / original.relative_to(original.parents[2] if original.name == "cell.json"
                                                  else original.parent)
                edited = json.loads(json.dumps(data))
                where, _, sub = key.partition(".")
                target = edited[where] if sub else edited
                name = sub or key
                if value == "DELETE":
                    target.pop(name, None)
                else:
                    target[name] = value
                path.write_text(json.dumps(edited))
                try:
                    read(path)
                except EvalParityError as err:
                    assert "\n" not in str(err), str(err)
                finally:
                    shutil.rmtree(top, ignore_errors=True)
                tried += 1
    assert tried > 700


def test_a_link_planted_at_a_temporary_files_name_is_never_written_through(folders):
    """The lock's and the records' temporary files have names a planter can predict (host and pid): a link
    put there beforehand would have had the lock's JSON, or a record, written into its target outside the
    run. Here the report runs in this process, so its pid is known; the links are replaced, never followed."""
    import platform

    from evalparity.files import write_json

    run0, baseline, *_ = folders
    top, run, outside = _copy(run0)
    try:
        precious = outside / "precious.txt"
        planted = [run / f".evalparity.lock.{platform.node()}.{os.getpid()}.tmp",
                   run / "stats" / f".verdicts.json.{os.getpid()}.tmp"]
        for link in planted:
            link.parent.mkdir(exist_ok=True)
            link.symlink_to(precious)
        got = evalparity_here("report", str(run))
        assert (got.returncode, tamper.sign_off_line(got.stdout)) == baseline, got.stderr[-2000:]
        assert precious.read_text() == "keep me"
        write_json(run / "stats" / "verdicts.json", {"x": 1})  # the same writer, called directly
        assert precious.read_text() == "keep me"
        assert json.loads((run / "stats" / "verdicts.json").read_text()) == {"x": 1}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_variant_cell_re_declared_a_repeat_of_a_cell_that_is_there_is_refused(tmp_path):
    """Session 32's review: a named variant ``hf-fp32-sdpa`` (20 % of its docs wrong: FAIL) re-declared, in
    spec.json and its cell.json alike, a repeat (label hf-fp32, tag sdpa) of the hf-fp32 that is there: it
    left the gating comparisons, and the sign-off was PASS, exit 0. Likewise a TF32 cell. And a named cell's
    record without the model arguments its claimed dtype is checked against."""
    from synthetic import add_variant

    run = make_run(tmp_path / "run", n_tasks=1, cells=["hf-fp32", "vllm-fp32"], docs_per_task=2000, group="syn")
    add_variant(run, "hf-fp32-sdpa", "hf-fp32", backend="hf", dtype="fp32", args={"attn_implementation": "sdpa"},
                drift=0.2)
    code, out, _ = tamper.run_cli(["report", str(run), "--margin", "2pp"])
    assert code == 3 and out.startswith("FAIL"), out

    def edited(entry: dict, record: dict, drop: tuple[str, ...] = ()) -> tuple[int, str, str]:
        top, copy, _ = _copy(run)
        try:
            spec = json.loads((copy / "spec.json").read_text())
            next(c for c in spec["cells"] if c["name"] == "hf-fp32-sdpa").update(entry)
            (copy / "spec.json").write_text(json.dumps(spec))
            cj = copy / "cells" / "hf-fp32-sdpa" / "cell.json"
            rec = json.loads(cj.read_text()) | record
            cj.write_text(json.dumps({k: v for k, v in rec.items() if k not in drop}))
            return tamper.run_cli(["report", str(copy), "--margin", "2pp"])
        finally:
            shutil.rmtree(top, ignore_errors=True)

    for entry, record, drop, says in (
            ({"label": "hf-fp32", "tag": "sdpa"}, {"tag": "sdpa", "base_cell": "hf-fp32"}, (), "which no repeat is"),
            ({"label": "hf-fp32", "tag": "sdpa", "tf32": True}, {"tag": "sdpa", "base_cell": "hf-fp32", "tf32": True},
             (), "TF32 cell only in part"),
            ({"dtype": "bfloat16"}, {"dtype": "bfloat16"}, ("model_args",), "no model_args"),
            ({"dtype": "bfloat16"}, {"dtype": "bfloat16", "model_args": {"pretrained": "synthetic"}}, (),
             "do not name the dtype")):
        code, out, err = edited(entry, record, drop)
        assert code == 2 and says in err and err.count("error:") == 1, (says, code, out, err[-500:])
