"""A staged cell's rounds scored ahead of the run's decision (``cells.Ahead``): only the rounds a guess can
name, only while another cell loads (or always, for tests), never past the run's own record or its end, and
published only where the run's record asks for exactly the guessed docs; a guess the run did not make is
thrown away with every guess after it. End to end on Ray (the same tables with and without it):
tests/test_staged_run.py."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from evalparity import cells, config, stager, staging
from evalparity.rundir import layout, rounds, units
from evalparity.spec import Alignment, RunSpec, build_cells
from evalparity.staging import make_plan

PLAN = make_plan({"b": [("b", 400)], "a": [("a", 400)]}, seed=3, first=50)  # round 0 names them b, a


def _spec() -> RunSpec:
    return RunSpec(model="m", tasks=("a", "b"), cells=build_cells(["hf", "vllm"], ["fp32"], "auto", []),
                   alignment=Alignment(seed=1), staging=PLAN.to_json())


def _ahead(tmp_path, monkeypatch, mode: str) -> tuple[cells.Ahead, list, RunSpec]:
    monkeypatch.setenv(config.AHEAD_ENV, mode)
    spec = _spec()
    (tmp_path / "stages").mkdir(parents=True)
    return cells.Ahead(tmp_path, spec, spec.cells[0]), [], spec


def _scoring(log: list):
    def score(meta, progress, out, request):
        (out / "scored.json").write_text(json.dumps(request.to_json()))
        meta["status"] = "ok"
        log.append(request.round)
    return score


class _Progress:
    def update(self, **kw):
        pass


def test_a_guess_the_run_makes_is_published_and_one_it_does_not_is_thrown_away(tmp_path, monkeypatch):
    ahead, log, spec = _ahead(tmp_path, monkeypatch, "always")
    r0 = stager.first_request(PLAN, spec.identity())
    assert r0.tasks == ("b", "a")
    ahead.score(r0, _scoring(log), {"load_s": 3.0}, _Progress())
    assert log == [1, 2, 3] == list(range(1, 1 + cells.AHEAD_ROUNDS))  # each guessing that every task goes on
    assert all(ahead.folder(r).is_dir() for r in (1, 2, 3))
    out = tmp_path / "stages" / "taken"
    r1 = staging.request_for(PLAN, spec.identity(), 1, ["a", "b"])  # the run's record: both go on, sorted
    meta = ahead.take(r1, out)
    assert meta["scored_ahead"] is True and meta["round"] == 1 and meta["load_s"] == 0.0
    assert json.loads((out / "scored.json").read_text()) == r1.to_json() and not ahead.folder(1).exists()
    r2 = staging.request_for(PLAN, spec.identity(), 2, ["b"])  # task a settled: not the guess
    assert ahead.take(r2, tmp_path / "stages" / "other") is None
    assert not ahead.folder(2).exists() and not ahead.folder(3).exists() and ahead.done == []
    assert not (tmp_path / "stages" / "other").exists()


def test_a_round_the_run_wrote_or_an_ended_run_is_never_scored_ahead(tmp_path, monkeypatch):
    ahead, log, spec = _ahead(tmp_path, monkeypatch, "always")
    r0 = staging.request_for(PLAN, spec.identity(), 0, ["a", "b"])
    rounds.write_round(tmp_path, staging.request_for(PLAN, spec.identity(), 1, ["b"]))
    ahead.score(r0, _scoring(log), {"load_s": 1.0}, _Progress())
    assert log == []
    layout.round_file(tmp_path, 1).unlink()
    rounds.write_finish(tmp_path, 1, spec.identity())
    ahead.score(r0, _scoring(log), {"load_s": 1.0}, _Progress())
    assert log == []


def test_the_last_look_has_no_guess_and_off_scores_nothing(tmp_path, monkeypatch):
    ahead, log, spec = _ahead(tmp_path, monkeypatch, "always")
    last = len(PLAN.unit("a").looks) - 1
    ahead.score(staging.request_for(PLAN, spec.identity(), last, ["a"]), _scoring(log), {"load_s": 1.0}, _Progress())
    assert log == []
    off, log_off, _ = _ahead(tmp_path / "off", monkeypatch, "off")
    off.score(staging.request_for(PLAN, spec.identity(), 0, ["a", "b"]), _scoring(log_off), {"load_s": 1.0},
              _Progress())
    assert log_off == []


@pytest.mark.parametrize("phase, loading", [(None, True), ("starting", True), ("loading model", True),
                                            ("reading the task index", True), ("round 1", False),
                                            ("waiting for round 2", False)])
def test_auto_scores_ahead_only_while_another_cell_loads(tmp_path, monkeypatch, phase, loading):
    ahead, log, spec = _ahead(tmp_path, monkeypatch, "auto")
    other = spec.cells[1].name
    if phase is not None:
        home = units.tmp_dir(tmp_path, other, "stages")
        home.mkdir(parents=True)
        layout.progress_file(home).write_text(json.dumps({"phase": phase}))
    assert ahead.others_loading() is loading
    ahead.score(staging.request_for(PLAN, spec.identity(), 0, ["a", "b"]), _scoring(log), {"load_s": 1.0},
                _Progress())
    assert log == ([1, 2, 3] if loading else [])


def test_a_misspelt_switch_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv(config.AHEAD_ENV, "sometimes")
    with pytest.raises(config.EvalParityError, match="EVALPARITY_SCORE_AHEAD='sometimes' is not one of"):
        config.score_ahead()


def test_no_cell_folder_can_be_a_guess_folder(tmp_path):
    """Guesses live in ``stages/.ahead-<cell>.r<r>``: a unit's name cannot start with a dot, so no cell (say
    one named ``hf.r1.ahead``) has a folder or a process home there."""
    from evalparity.rundir.names import check_name

    folder = rounds.ahead_dir(tmp_path, "hf", 1)
    assert folder.parent == tmp_path / "stages" and folder.name == ".ahead-hf.r1"
    with pytest.raises(config.EvalParityError):
        check_name(folder.name)
    assert units.tmp_dir(tmp_path, "hf.r1.ahead", "stages") != folder


def test_a_killed_processs_guesses_are_removed_when_the_cell_starts_again(tmp_path, monkeypatch):
    spec = _spec()
    mine, other = spec.cells[0].name, spec.cells[1].name
    for cell, r in ((mine, 1), (mine, 12), (other, 1)):
        rounds.ahead_dir(tmp_path, cell, r).mkdir(parents=True)
    (tmp_path / "stages" / f".ahead-{mine}.rx").mkdir()  # not one of its guesses' names: left alone
    monkeypatch.setenv(config.AHEAD_ENV, "auto")
    cells.Ahead(tmp_path, spec, spec.cells[0])
    assert [p.name for p in rounds.ahead_dirs(tmp_path)] == [f".ahead-{mine}.rx", f".ahead-{other}.r1"]


def test_a_guess_that_fails_ends_scoring_ahead_and_not_the_run(tmp_path, monkeypatch):
    ahead, log, spec = _ahead(tmp_path, monkeypatch, "always")
    calls = []

    def scoring(meta, progress, out, request):
        calls.append(request.round)
        if request.round == 2:
            raise RuntimeError("CUDA out of memory")
        meta["eval_s"] = 1.5

    ahead.score(stager.first_request(PLAN, spec.identity()), scoring, {"load_s": 1.0}, _Progress())
    assert calls == [1, 2] and ahead.mode == "off" and ahead.done == []
    assert ahead.discarded == [{"round": 1, "eval_s": 1.5}] and not rounds.ahead_dirs(tmp_path)


def test_a_guess_must_match_the_runs_record_in_every_field(tmp_path, monkeypatch):
    ahead, log, spec = _ahead(tmp_path, monkeypatch, "always")
    ahead.score(stager.first_request(PLAN, spec.identity()), _scoring(log), {"load_s": 1.0}, _Progress())
    r1 = staging.request_for(PLAN, spec.identity(), 1, ["a", "b"])
    grouped = dataclasses.replace(r1, groups={"ab": ["a", "b"]})
    assert not staging.same_request(r1, grouped)
    reordered = dataclasses.replace(r1, docs=dict(reversed(list(r1.docs.items()))))
    assert not staging.same_request(r1, reordered) and staging.same_request(r1, dataclasses.replace(r1))
    assert ahead.take(grouped, tmp_path / "stages" / "out") is None
    assert [d["round"] for d in ahead.discarded] == [1, 2, 3]


class _Executor:
    def __init__(self, units: list[str]):
        self.units, self.stopped = units, False

    def busy(self) -> bool:
        return bool(self.units) and not self.stopped

    def poll(self):
        return []

    def stop(self):
        self.stopped = True


def _phase(run_dir, unit: str, phase: str) -> None:
    home = units.tmp_dir(run_dir, unit, "stages")
    home.mkdir(parents=True, exist_ok=True)
    layout.progress_file(home).write_text(json.dumps({"phase": phase}))


def test_the_runs_end_stops_cells_scoring_ahead_at_once_and_waits_for_the_others(tmp_path):
    _phase(tmp_path, "hf-fp32", f"round 3, {cells.AHEAD_PHASE}")
    _phase(tmp_path, "vllm-fp32", "waiting for round 3")
    ex = _Executor(["hf-fp32"])
    t0 = time.monotonic()
    stager._wait_residents(ex, {"hf-fp32": object()}, tmp_path, timeout=30)
    assert ex.stopped and time.monotonic() - t0 < 5
    ex = _Executor(["hf-fp32", "vllm-fp32"])  # one that is not scoring ahead: waited for (up to the timeout)
    t0 = time.monotonic()
    stager._wait_residents(ex, {"hf-fp32": object(), "vllm-fp32": object()}, tmp_path, timeout=1.0)
    assert ex.stopped and time.monotonic() - t0 >= 1.0


def test_every_cell_process_gets_the_runs_choice(monkeypatch):
    from evalparity.cellenv import cell_environment

    monkeypatch.setenv(config.AHEAD_ENV, "OFF")
    assert cell_environment({}, offline=True)[config.AHEAD_ENV] == "off"
    monkeypatch.delenv(config.AHEAD_ENV)
    assert cell_environment({}, offline=True)[config.AHEAD_ENV] == "auto"
