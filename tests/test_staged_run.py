"""A staged run end to end on the CPU (issue 26): a task whose cells agree stops at an early look, a task with
a planted drift is scored to its end, a run killed between rounds resumes at its last finished round, and
the sign-off's verdicts are the staged rule's.

Cells: ``hf-fp32`` and ``hfcopy-fp32`` (``toy_backend``: lm-eval's HF model again, bit for bit, except on
docs whose question holds ``toy_backend.PLANT``, where its choices are shifted at random). Two 400-doc
multiple-choice tasks, looks at 50, 100, 200 and 400 docs (``--first-look 50``), margin 10 pp so that the
tiny numbers settle: ``st_same`` (no plant: zero discordance) settles EQUIVALENT at look 2 (0.9^100 < α_2),
``st_plant`` (every question planted: most docs discordant) cannot settle before its last look.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import sys
from collections import Counter
from pathlib import Path

import ahead
import pandas as pd
import pytest
from conftest import cli, evalparity
from tiny import MC_YAML, WORDS
from verdict_schema import check_verdicts

from evalparity.config import AHEAD_ENV
from evalparity.rundir import layout

sys.path.insert(0, str(Path(__file__).parent))
import toy_backend  # noqa: E402

N_DOCS = 400
ENV = {"EVALPARITY_PLUGINS": "toy_backend",
       "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}


def make_staged_tasks(root: Path) -> Path:
    rng = random.Random(7)
    root.mkdir(parents=True, exist_ok=True)
    for name, planted in (("st_same", False), ("st_plant", True)):
        rows = []
        for _ in range(N_DOCS):
            q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6)))
            rows.append({"question": f"{toy_backend.PLANT} {q}" if planted else q,
                         "choices": [rng.choice(WORDS) for _ in range(4)], "label": rng.randrange(4)})
        data = root / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / f"{name}.yaml").write_text(MC_YAML.format(name=name, data=data))
    return root


def args(model: Path, tasks: Path, out: Path) -> list[str]:
    return ["run", "--model", str(model), "--tasks", "st_same,st_plant", "--include-path", str(tasks),
            "--backends", "hf,hfcopy", "--dtypes", "fp32", "--max-length", "256", "--first-look", "50",
            "--margin", "10pp", "--out", str(out)]


@ahead.job("staged_run")
def _killed_run(ctx: ahead.Context):
    """The killed run (no Ray: it can run ahead, tests/ahead.py); the fixture resumes it."""
    root = ctx.mktemp("staged")
    tasks = make_staged_tasks(root / "tasks")
    out = root / "run"
    cmd = cli(*args(ctx.fixture("tiny_model"), tasks, out))
    return lambda: (root, tasks, ctx.run(cmd, env=ENV | {"EVALPARITY_TEST_KILL_AT": "publish-cell:hfcopy-fp32.r2"}))


@pytest.fixture(scope="module")
def staged_run(tiny_model, request):
    """A staged run killed while hfcopy-fp32 publishes its part of round 3, then resumed to its end. The
    killed run has one cell at a time (each cell's process scores one round and exits); the resumed one runs
    on a local Ray instance, which holds both cells at once, so they stay loaded across rounds."""
    root, tasks, killed = ahead.take("staged_run", request)
    out = root / "run"
    before = {p.name: (p / "cell.json").stat().st_mtime_ns for p in (out / "stages").iterdir()
              if p.is_dir() and not p.name.startswith(".")}
    token = root / "ray_auth_token"  # a token of its own, as tests/test_ray.py: Ray may have token auth on
    token.write_text(secrets.token_hex(32))
    resumed = evalparity(*args(tiny_model, tasks, out), "--ray", "local", env=ENV | {"RAY_AUTH_TOKEN_PATH": str(token)})
    return out, killed, before, resumed


def test_the_killed_run_is_not_signed_off(staged_run):
    out, killed, before, _ = staged_run
    assert killed.returncode == 5, killed.stderr[-2000:]
    assert "hfcopy-fp32" in killed.stdout + killed.stderr
    # rounds 1 and 2 of both cells, and round 3 of hf-fp32, were published before the kill
    assert set(before) == {"hf-fp32.r0", "hf-fp32.r1", "hf-fp32.r2", "hfcopy-fp32.r0", "hfcopy-fp32.r1"}


def test_resume_scores_only_what_is_missing(staged_run):
    out, _, before, resumed = staged_run
    assert resumed.returncode in (0, 4), resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for name, mtime in before.items():  # no finished part was scored again
        assert (out / "stages" / name / "cell.json").stat().st_mtime_ns == mtime, name


def test_resident_cells_load_once(staged_run):
    out = staged_run[0]
    part = {r: json.loads((out / "stages" / f"hfcopy-fp32.r{r}" / "cell.json").read_text()) for r in (2, 3)}
    assert part[2]["pid"] == part[3]["pid"]  # one process scored both rounds
    assert part[2]["load_s"] > 0 and part[3]["load_s"] == 0
    for cell in ("hf-fp32", "hfcopy-fp32"):  # what the load found reaches every round and the merged cell
        rec = json.loads((out / "cells" / cell / "cell.json").read_text())
        assert rec["precision"] and rec["environment"]["python"] and "bos_added" in rec["settings"]
    assert part[3]["precision"] == part[2]["precision"]


def test_the_agreeing_task_stops_early_and_the_planted_one_goes_to_the_end(staged_run):
    out = staged_run[0]
    v = check_verdicts(out / "stats" / "verdicts.json")
    tasks = {t["task"]: t for t in v["staging"]["tasks"]}
    assert tasks["st_same"]["looks"] == [50, 100, 200, 400]
    assert tasks["st_same"]["stopped_at_look"] == 2 and tasks["st_same"]["docs"] == 100
    assert tasks["st_plant"]["stopped_at_look"] == 4 and tasks["st_plant"]["docs"] == 400
    rows = [c for c in v["comparisons"] if c["gating"]]
    same = [c for c in rows if c["task"] == "st_same"]
    assert same and all(c["verdict"] == "EQUIVALENT" and c["staged_look"] == 2 and c["n"] == 100 for c in same)
    plant = [c for c in rows if c["task"] == "st_plant"]
    assert plant and all(c["staged_look"] == 4 and c["n"] == 400 for c in plant)
    assert all(c["discordant"] > 80 for c in plant)  # the plant is there: 20 % and more of docs disagree


def test_tables_hold_exactly_the_looks_scored(staged_run):
    out = staged_run[0]
    spec = json.loads((out / "spec.json").read_text())
    assert spec["staging"]["first"] == 50
    for cell in ("hf-fp32", "hfcopy-fp32"):
        t = pd.read_parquet(out / "cells" / cell / "samples.parquet")
        docs = t.drop_duplicates(["task", "doc_id"]).groupby("task").size().to_dict()
        assert docs == {"st_same": 100, "st_plant": 400}
        rec = json.loads((out / "cells" / cell / "cell.json").read_text())
        assert len(rec["rounds"]) == 4


def test_a_part_edited_after_the_run_is_refused(staged_run, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(staged_run[0], out)
    table = out / "cells" / "hfcopy-fp32" / "samples.parquet"
    t = pd.read_parquet(table)
    t = t[~((t["task"] == "st_same") & (t["doc_id"] == t.loc[t["task"] == "st_same", "doc_id"].iloc[0]))]
    t.to_parquet(table)
    proc = evalparity("report", str(out), "--margin", "10pp", env=ENV)
    assert proc.returncode == 2 and "not the table its cell wrote" in proc.stdout + proc.stderr


def test_a_report_with_a_tighter_margin_is_incomplete_not_a_single_look_verdict(staged_run, tmp_path):
    """st_same stopped at look 2 (100 docs) under the run's 10 pp. Under 6 pp the staged rule would not have
    stopped it there: the sign-off is INCOMPLETE (exit 5), saying to rerun `run` with that margin, never the
    single-look verdict of 100 docs (session 32's review: PASS, exit 0; the check could never fire)."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(staged_run[0], copy)
    proc = evalparity("report", str(copy), "--margin", "6pp", env=ENV)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 5 and proc.stdout.startswith("INCOMPLETE"), said[-2000:]
    assert "st_same (look 2 of 4, not settled)" in said and "rerun `evalparity run` with them" in said, said[-2000:]
    v = check_verdicts(copy / "stats" / "verdicts.json")
    assert v["sign_off"]["status"] == "INCOMPLETE"


def test_a_rounds_part_copied_over_its_cell_is_refused(staged_run, tmp_path):
    """A part is sealed like a cell (its table, its record): copied over ``cells/<cell>`` (a plain ``cp``, no
    hash made) it passed for the cell, and the sign-off was the first look's (session 32's review: PASS on 50
    docs where the run decided on 100). Its record says it is a part: refused."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(staged_run[0], copy)
    for cell in ("hf-fp32", "hfcopy-fp32"):
        shutil.rmtree(copy / "cells" / cell)
        shutil.copytree(copy / "stages" / f"{cell}.r0", copy / "cells" / cell)
    proc = evalparity("report", str(copy), "--margin", "10pp", env=ENV)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "part (round 0), not of a whole cell" in said, said[-2000:]


def test_a_resume_that_would_merge_parts_of_other_settings_is_refused_before_any_cell(staged_run, tiny_model,
                                                                                     tmp_path):
    """Session 32's review: a staged run killed after some rounds and resumed with another --batch-size (or
    --cell setting) scored the rest with it and merged both into one cell (then refused it, or, after the
    fix its message gave, signed off PASS on two variants). The parts' own records are checked first."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(staged_run[0], copy)
    for p in [*(copy / "cells").iterdir(), copy / "stages" / "finish.json", copy / "stats", copy / "report"]:
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)  # as if killed after its last round
    spec = (copy / "spec.json").read_bytes()
    for extra, says in ((["--batch-size", "4"], "has parts scored with batch size 8"),
                        (["--hf-args", "attn_implementation=eager"], "has parts scored with other settings")):
        proc = evalparity(*args(tiny_model, staged_run[0].parent / "tasks", copy), *extra, env=ENV)
        said = proc.stdout + proc.stderr
        assert proc.returncode == 2 and says in said and "Traceback" not in said, said[-2000:]
        assert (copy / "spec.json").read_bytes() == spec and not list((copy / "cells").iterdir())


def test_force_on_a_staged_run_sets_its_rounds_aside_with_its_cells(staged_run, tmp_path):
    """``--force`` moved a staged run's cells aside but left its rounds' parts, from which the run merged the
    same cells again: nothing was rescored. Now the parts and round records go to ``attempts/`` too, so the
    run starts again at round 1; nothing is deleted."""
    import shutil

    from evalparity.matrix import set_aside_forced
    from evalparity.rundir import records

    copy = tmp_path / "copy"
    shutil.copytree(staged_run[0], copy)
    parts = sorted(p.name for p in (copy / "stages").iterdir())
    moved = set_aside_forced(copy, records.read_spec(copy))
    assert "stages/" in moved and not (copy / "stages").exists()
    aside = next((copy / "attempts" / "stages" / "rounds").iterdir())
    assert sorted(p.name for p in aside.iterdir()) == parts and "round-0.json" in parts
    assert not [p for p in (copy / "cells").iterdir() if not p.name.startswith(".")]


@pytest.mark.parametrize("multiple", ["bh", "none"])
def test_another_multiple_on_a_staged_run_is_refused_not_ignored(staged_run, tiny_model, tmp_path, multiple):
    """A staged sign-off's family rule is Holm: ``--multiple bh|none`` was printed in its verdicts.json and
    applied to nothing. Refused in one line, by ``report`` on the staged run (which stays as it was) and by a
    staged ``run`` before any cell; ``holm`` is what the run was decided with."""
    out = staged_run[0]
    verdicts = (out / "stats" / "verdicts.json").read_bytes()
    proc = evalparity("report", str(out), "--margin", "10pp", "--multiple", multiple, env=ENV)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and f"--multiple {multiple}: a staged run" in said and "--full" in said, said[-2000:]
    assert "Traceback" not in said and (out / "stats" / "verdicts.json").read_bytes() == verdicts
    if multiple == "bh":  # the same refusal from a new staged run, before it scores anything
        new = tmp_path / "new"
        proc = evalparity(*args(tiny_model, out.parent / "tasks", new), "--multiple", multiple, env=ENV)
        said = proc.stdout + proc.stderr
        assert proc.returncode == 2 and "--multiple bh: a staged run" in said, said[-2000:]
        assert not (new / "cells").exists() and not (new / "stages").exists()


def test_one_scored_cell_stays_loaded_on_the_one_at_a_time_executor(staged_run, tiny_model, tmp_path):
    """Against a stored reference (``--reference-from``) a staged run scores one cell; without Ray it used to
    restart that cell every round, reloading the model each time (137 s against 82 s on an H200). Now its
    one process scores every round, and the sign-off is the one the source run made."""
    src, _, _, _ = staged_run
    tasks = src.parent / "tasks"
    out = tmp_path / "reused"
    proc = evalparity(*args(tiny_model, tasks, out), "--reference-from", f"{src}:hf-fp32", env=ENV)
    assert proc.returncode in (0, 4), proc.stdout[-3000:] + proc.stderr[-3000:]
    parts = sorted((out / "stages").glob("hfcopy-fp32.r*/cell.json"))
    assert len(parts) == 4, parts  # st_plant goes to its last look
    recs = [json.loads(p.read_text()) for p in parts]
    assert len({r["pid"] for r in recs}) == 1, [r["pid"] for r in recs]
    assert recs[0]["load_s"] > 0 and all(r["load_s"] == 0 for r in recs[1:])
    mine, theirs = (check_verdicts(d / "stats" / "verdicts.json") for d in (out, src))
    key = lambda v: sorted((c["task"], c["metric"], c["verdict"], c["n"]) for c in v["comparisons"] if c["gating"])  # noqa: E731
    assert key(mine) == key(theirs)


# ---------------------------------------------------------------- replicas (--shards) in a staged run
@pytest.fixture(scope="module")
def replica_run(staged_run, tiny_model, tmp_path_factory):
    """hfcopy-fp32 staged as two replicas against the staged run's hf-fp32 (``--reference-from``, so that
    only the replicas score): killed while replica 2 publishes its share of round 2 (no Ray: one process a
    round), then resumed on a local Ray instance, where both replicas stay loaded across rounds."""
    src = staged_run[0]
    tasks = src.parent / "tasks"
    out = tmp_path_factory.mktemp("replicas") / "run"
    cmd = [*args(tiny_model, tasks, out), "--reference-from", f"{src}:hf-fp32", "--shards", "2"]
    killed = evalparity(*cmd, env=ENV | {"EVALPARITY_TEST_KILL_AT": "publish-cell:hfcopy-fp32.r1.1of2"})
    before = {p.name: (p / "cell.json").stat().st_mtime_ns for p in (out / "stages").iterdir()
              if p.is_dir() and not p.name.startswith(".")}
    token = out.parent / "ray_auth_token"
    token.write_text(secrets.token_hex(32))
    resumed = evalparity(*cmd, "--ray", "local", env=ENV | {"RAY_AUTH_TOKEN_PATH": str(token)})
    return src, out, killed, before, resumed


def test_replicas_resume_at_the_missing_share(replica_run):
    _, out, killed, before, resumed = replica_run
    assert killed.returncode == 5, killed.stdout[-2000:] + killed.stderr[-2000:]
    # round 1: both shares and the part merged from them; round 2: the first replica's share only (and the
    # reused reference's parts, published before the replicas score)
    assert set(before) == {"hf-fp32.r0", "hfcopy-fp32.r0.0of2", "hfcopy-fp32.r0.1of2", "hfcopy-fp32.r0",
                           "hf-fp32.r1", "hfcopy-fp32.r1.0of2"}, before
    assert resumed.returncode in (0, 4), resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for name, mtime in before.items():  # no share or part was scored again
        assert (out / "stages" / name / "cell.json").stat().st_mtime_ns == mtime, name


def test_replica_shares_split_each_round_exactly(replica_run):
    """Every round's docs are scored once: the two shares are disjoint, together the round's docs, and the
    part merged from them holds exactly those rows; the cell's merged table holds exactly the looks."""
    _, out, _, _, _ = replica_run
    n_rounds = len(list((out / "stages").glob("round-*.json")))
    assert n_rounds == 4
    for r in range(n_rounds):
        want = {(task, d) for task, ids in json.loads((out / "stages" / f"round-{r}.json").read_text())["docs"].items()
                for d in ids}
        shares = [pd.read_parquet(out / "stages" / f"hfcopy-fp32.r{r}.{k}of2" / "samples.parquet") for k in (0, 1)]
        keys = [set(zip(s["task"], s["doc_id"])) for s in shares]
        assert keys[0] and keys[1] and not keys[0] & keys[1], r
        assert keys[0] | keys[1] == want, r
        part = pd.read_parquet(out / "stages" / f"hfcopy-fp32.r{r}" / "samples.parquet")
        assert set(zip(part["task"], part["doc_id"])) == want
        rec = json.loads((out / "stages" / f"hfcopy-fp32.r{r}" / "cell.json").read_text())
        assert rec["round"] == r and [x["index"] for x in rec["replicas"]] == [0, 1]
    t = pd.read_parquet(out / "cells" / "hfcopy-fp32" / "samples.parquet")
    assert t.drop_duplicates(["task", "doc_id"]).groupby("task").size().to_dict() == {"st_same": 100, "st_plant": 400}


def test_resident_replicas_load_once_and_sign_off_as_one_cell(replica_run):
    src, out, _, _, _ = replica_run
    for k in (0, 1):  # the resumed run scored rounds 3 and 4 in one loaded process per replica
        recs = [json.loads((out / "stages" / f"hfcopy-fp32.r{r}.{k}of2" / "cell.json").read_text()) for r in (2, 3)]
        assert recs[0]["pid"] == recs[1]["pid"] and recs[0]["shard"] == {"index": k, "of": 2}
        assert recs[1]["load_s"] == 0
    # replica 2 resumed at round 2 (its share was killed), replica 1 at round 3: each loaded once there
    loads = {k: [json.loads((out / "stages" / f"hfcopy-fp32.r{r}.{k}of2" / "cell.json").read_text())["load_s"] > 0
                 for r in (1, 2, 3)] for k in (0, 1)}
    assert loads == {0: [True, True, False], 1: [True, False, False]}, loads
    mine, theirs = (check_verdicts(d / "stats" / "verdicts.json") for d in (out, src))
    key = lambda v: sorted((c["task"], c["metric"], c["verdict"], c["n"]) for c in v["comparisons"] if c["gating"])  # noqa: E731
    assert key(mine) == key(theirs)


def test_replica_shares_of_generated_rounds():
    """``RoundRequest.replica_share`` on generated rounds (leaves with many, few or no new docs, padding
    leaves, 1-5 replicas): the shares' new docs are disjoint and together the round's; every share names
    every leaf of the round (lm-eval would score all docs of a leaf it does not name); what a share pads is
    dropped, and is a doc of its leaf."""
    from evalparity.rundir.rounds import RoundRequest

    rng = random.Random(26)
    for _ in range(300):
        docs = {f"leaf{i}": sorted(rng.sample(range(1000), rng.randint(1, 9))) for i in range(rng.randint(1, 5))}
        padding = {f"pad{i}": [rng.randrange(50)] for i in range(rng.randint(0, 2))}
        req = RoundRequest(rng.randrange(5), "id", ("t",), docs, padding)
        n = rng.randint(1, 5)
        shares = [req.replica_share(k, n) for k in range(n)]
        new = [{(leaf, d) for leaf, ids in s.docs.items() for d in ids} for s in shares]
        assert sum(len(x) for x in new) == sum(len(v) for v in docs.values())
        assert set().union(*new) == {(leaf, d) for leaf, ids in docs.items() for d in ids}
        for s in shares:
            assert set(s.samples()) == set(docs) | set(padding)
            dropped = s.placeholders()
            assert not dropped & {(leaf, d) for leaf, ids in s.docs.items() for d in ids}
            assert all(d in docs.get(leaf, []) or d in padding.get(leaf, []) for leaf, d in dropped)
            assert (s.round, s.identity, s.tasks) == (req.round, req.identity, req.tasks)


def test_a_cells_log_has_its_phases_on_its_process_clock(staged_run):
    """cell.log says when each phase began and how long after its process started (where a start goes)."""
    import re

    log = (staged_run[0] / "stages" / ".tmp-hfcopy-fp32" / "cell.log").read_text()
    ages = {}
    for phase in ("reading the task index", "loading model", "model loaded in", "round 4", "writing"):
        m = re.search(rf"^--- \S+ {re.escape(phase)}.* \((\d+\.\d) s after the process started\)$", log, re.M)
        assert m, (phase, log[-2000:])
        ages[phase] = float(m.group(1))
    assert ages["reading the task index"] <= ages["loading model"] <= ages["model loaded in"]


def _resumable_copy(src: Path, dest: Path) -> Path:
    """A copy of a finished staged run that a rerun resumes (its merged cells and its finish record gone)."""
    import shutil

    shutil.copytree(src, dest)
    shutil.rmtree(dest / "cells")
    (dest / "stages" / "finish.json").unlink()
    return dest


def test_a_resume_with_another_replica_count_is_refused(replica_run, tiny_model, tmp_path):
    """Refused in one line; the run it was refused on is left as it was: here a run killed while it merged
    its cells, whose decision that no round follows (``stages/finish.json``) was removed by the refused
    resume before session 33 (review F11)."""
    import shutil

    src, out, _, _, _ = replica_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "cells")
    finish = (copy / "stages" / "finish.json").read_bytes()
    proc = evalparity(*args(tiny_model, src.parent / "tasks", copy), "--reference-from", f"{src}:hf-fp32",
                      "--shards", "1", env=ENV)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "was scored by 2 replica(s) per cell" in said and "--shards 2" in said, said[-2000:]
    assert (copy / "stages" / "finish.json").read_bytes() == finish


def test_a_share_holding_another_replicas_docs_is_refused(replica_run, tiny_model, tmp_path):
    """Replica 1's round-1 share replaced by replica 2's table, resealed (its record made to match): the
    shares are still disjoint and sealed, but replica 1's holds docs that are not its share."""
    import shutil

    from evalparity.rundir import records

    src, out, _, _, _ = replica_run
    copy = _resumable_copy(out, tmp_path / "copy")
    stages = copy / "stages"
    shutil.rmtree(stages / "hfcopy-fp32.r0")  # merged again on the resume
    mine, other = stages / "hfcopy-fp32.r0.0of2", stages / "hfcopy-fp32.r0.1of2"
    shutil.copyfile(other / "samples.parquet", mine / "samples.parquet")
    rec = json.loads((mine / "cell.json").read_text())
    rec["n_rows"] = len(pd.read_parquet(mine / "samples.parquet"))
    rec["table"] = records.seal_table(mine, rec["n_rows"]).to_json()
    (mine / "cell.json").write_text(json.dumps(rec))
    proc = evalparity(*args(tiny_model, src.parent / "tasks", copy), "--reference-from", f"{src}:hf-fp32",
                      "--shards", "2", env=ENV)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "outside replica 1 of 2's share of round 1" in said, said[-2000:]
    assert "hfcopy-fp32.r0.0of2" in said


def test_replicas_that_ran_on_another_device_are_not_merged(replica_run, tiny_model, tmp_path):
    """A share whose record says another device (or versions, precision, interpreter) is not the same cell:
    refused in one line before anything of the merged part is written."""
    import shutil

    src, out, _, _, _ = replica_run
    copy = _resumable_copy(out, tmp_path / "copy")
    stages = copy / "stages"
    shutil.rmtree(stages / "hfcopy-fp32.r0")
    share = stages / "hfcopy-fp32.r0.1of2" / "cell.json"
    rec = json.loads(share.read_text())
    rec["device_name"] = "another GPU"
    share.write_text(json.dumps(rec))
    proc = evalparity(*args(tiny_model, src.parent / "tasks", copy), "--reference-from", f"{src}:hf-fp32",
                      "--shards", "2", env=ENV)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "hfcopy-fp32.r0 ran with different device_name" in said, said[-2000:]
    assert not (stages / "hfcopy-fp32.r0").exists() and not (stages / ".tmp-hfcopy-fp32.r0").exists()


# ---------------------------------------------------------------- rounds scored ahead (cells.Ahead)
@pytest.fixture(scope="module")
def ahead_run(tiny_model, tmp_path_factory):
    """The staged run above (st_same settles at look 2, st_plant goes on), on local Ray with every waiting cell
    scoring ahead: the guess for round 3 (both tasks) is not the run's record (st_plant only)."""
    root = tmp_path_factory.mktemp("ahead")
    tasks = make_staged_tasks(root / "tasks")
    token = root / "ray_auth_token"
    token.write_text(secrets.token_hex(32))
    out = root / "run"
    proc = evalparity(*args(tiny_model, tasks, out), "--ray", "local",
                      env=ENV | {"RAY_AUTH_TOKEN_PATH": str(token), AHEAD_ENV: "always"})
    return out, proc


def test_rounds_scored_ahead_change_no_number(ahead_run, staged_run):
    """The same tables, row for row, as the staged test's run (killed, resumed; never ahead)."""
    out, proc = ahead_run
    assert proc.returncode in (0, 4), proc.stdout[-3000:] + proc.stderr[-3000:]
    plain = staged_run[0]
    for cell in ("hf-fp32", "hfcopy-fp32"):
        mine = pd.read_parquet(layout.table(layout.cell_dir(out, cell)))
        theirs = pd.read_parquet(layout.table(layout.cell_dir(plain, cell)))
        pd.testing.assert_frame_equal(mine, theirs)
    assert json.loads((out / "stats" / "verdicts.json").read_text())["comparisons"] == \
        json.loads((plain / "stats" / "verdicts.json").read_text())["comparisons"]


def test_only_the_guesses_the_run_made_were_published(ahead_run):
    """Round 3's guess (both tasks) is wrong: st_same settled at look 2. A cell scores ahead only while the run
    has not written the round, so which of the right guesses (rounds 2 and 4) a cell made depends on which
    cell published last; the first one to publish always has."""
    out, _ = ahead_run
    flags, guessed = [], []
    for cell in ("hf-fp32", "hfcopy-fp32"):
        merged = json.loads((layout.cell_dir(out, cell) / "cell.json").read_text())
        flags.append([r["scored_ahead"] for r in merged["rounds"]])
        log = (out / "stages" / f".tmp-{cell}" / "cell.log").read_text()
        guessed.append("round 3, ahead of the run's decision" in log)
        # every round scored ahead (one log line each) was published or recorded as thrown away
        made = Counter(int(k) - 1 for k in re.findall(r"round (\d+), ahead of the run's decision", log))
        published = Counter(r for r, f in enumerate(flags[-1]) if f)
        thrown = Counter(d["round"] for r in merged["rounds"] for d in r["ahead_discarded"])
        assert made == published + thrown, (cell, made, published, thrown)
        assert merged["settings"]["score_ahead"] == "always"
    assert all(len(f) == 4 and not f[0] and not f[2] for f in flags), flags  # the wrong guess: scored again
    assert any(f[1] for f in flags) and any(f[3] for f in flags), flags
    assert any(guessed)  # the wrong guess was made, and thrown away
    assert not list((out / "stages").glob(".ahead-*"))  # nothing scored ahead is left behind
