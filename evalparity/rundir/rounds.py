"""A staged run's rounds: the records the run writes between its statistics and its cells.

After each round the run decides (``stats.staged``) which tasks need another look and writes the next
``stages/round-<r>.json`` (``RoundRequest``), or ``stages/finish.json`` when none does. Each cell process
waits for the next record (``wait_for_round``), scores it and publishes its part ``stages/<cell>.r<r>/``
(a unit folder like a cell's, with its own record and sealed table). One writer (the run), one reader (the
cells) per record; a round record is never rewritten, so every cell scores the same docs in round r.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from evalparity.config import AHEAD_PREFIX, STAGES
from evalparity.errors import EvalParityError
from evalparity.files import read_json, write_json
from evalparity.rundir import layout, records
from evalparity.rundir.names import check_name

POLL_S = 0.2


def part_name(cell: str, r: int) -> str:
    """The unit name of one cell's part of round r (``stages/<cell>.r<r>``)."""
    return check_name(f"{cell}.r{int(r)}")


def part_dir(run_dir: Path, cell: str, r: int) -> Path:
    return layout.unit_dir(run_dir, part_name(cell, r), STAGES)


def ahead_dir(run_dir: Path, cell: str, r: int) -> Path:
    """Where a cell keeps its round r scored ahead of the run's record (``cells.Ahead``) until it is published
    or thrown away: ``stages/.ahead-<cell>.r<r>``, a name no cell's own folder can have."""
    return Path(run_dir) / STAGES / f"{AHEAD_PREFIX}{part_name(cell, r)}"


def ahead_dirs(run_dir: Path, cell: str | None = None) -> list[Path]:
    """The folders of rounds scored ahead that are still there: a cell's (its own leftovers from a killed
    process), or every cell's (at the run's end, when no cell runs)."""
    folder = Path(run_dir) / STAGES
    stem = f"{AHEAD_PREFIX}{check_name(cell)}.r" if cell is not None else AHEAD_PREFIX
    try:
        return sorted(p for p in folder.iterdir() if p.name.startswith(stem)
                      and (cell is None or p.name[len(stem):].isdigit()))
    except OSError:
        return []


def replica_name(cell: str, k: int, n: int) -> str:
    """A replica's name (``<cell>.<k>of<n>``): its process's home ``stages/.tmp-<cell>.<k>of<n>`` (log and
    progress), and the stem of its parts; the cell's own name when it has one replica."""
    return cell if n == 1 else check_name(f"{cell}.{int(k)}of{int(n)}")


def replica_part_name(cell: str, r: int, k: int, n: int) -> str:
    """The unit name of replica k of n's share of a cell's round r (``stages/<cell>.r<r>.<k>of<n>``), which
    the run merges into the cell's part ``stages/<cell>.r<r>`` once every replica's share is in; the part
    itself when the cell has one replica."""
    return part_name(cell, r) if n == 1 else check_name(f"{part_name(cell, r)}.{int(k)}of{int(n)}")


def replica_part_dir(run_dir: Path, cell: str, r: int, k: int, n: int) -> Path:
    return layout.unit_dir(run_dir, replica_part_name(cell, r, k, n), STAGES)


@dataclass(frozen=True)
class RoundRequest:
    """Round r: the tasks it scores (the staged tasks still open), the new docs of each of their leaves
    (sorted), and ``padding``: one doc already scored for a leaf with none left in this round, scored again
    and dropped (lm-eval scores every doc of a leaf its ``samples`` do not name)."""

    round: int
    identity: str
    tasks: tuple[str, ...]
    docs: dict[str, list[int]]
    padding: dict[str, list[int]] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)

    def samples(self) -> dict[str, list[int]]:
        """lm-eval's ``samples`` for the round: each leaf's docs and padding, sorted."""
        out = {leaf: list(ids) for leaf, ids in self.docs.items()}
        for leaf, ids in self.padding.items():
            out[leaf] = sorted(set(out.get(leaf, [])) | set(ids))
        return {k: v for k, v in out.items() if v}

    def replica_share(self, k: int, n: int) -> RoundRequest:
        """What replica k of n scores of this round: every n-th new doc of each leaf from the k-th (as
        ``RunSpec.shard_samples`` splits an unstaged cell), so that the n shares are the round's docs,
        each once. A leaf whose new docs leave this replica none gets one of them as padding (scored and
        dropped): lm-eval scores every doc of a leaf its ``samples`` do not name."""
        if n == 1:
            return self
        docs, padding = {}, {leaf: list(ids) for leaf, ids in self.padding.items()}
        for leaf, ids in self.docs.items():
            if ids[k::n]:
                docs[leaf] = ids[k::n]
            else:
                padding[leaf] = sorted(set(padding.get(leaf, [])) | {ids[0]})
        return RoundRequest(self.round, self.identity, self.tasks, docs, padding, self.groups)

    def placeholders(self) -> set[tuple[str, int]]:
        return {(leaf, int(d)) for leaf, ids in self.padding.items() for d in ids}

    def n_docs(self) -> int:
        return sum(len(v) for v in self.docs.values())

    def to_json(self) -> dict:
        return {"round": self.round, "identity": self.identity, "tasks": list(self.tasks), "docs": self.docs,
                "padding": self.padding, "groups": self.groups}

    @classmethod
    def from_json(cls, d: dict, where: str) -> RoundRequest:
        problem = records.shape_problem(d, {"round": (int,), "identity": (str,), "tasks": (list,), "docs": (dict,),
                                            "padding": (dict,), "groups": (dict,)},
                                        required=("round", "identity", "tasks", "docs"))
        if problem is None and not all(isinstance(v, list) and all(type(x) is int for x in v)
                                       for v in list(d["docs"].values()) + list(d.get("padding", {}).values())):
            problem = "its docs are not lists of doc numbers"
        if problem:
            raise EvalParityError(f"{where} is not a round record evalparity can read ({problem}): remove the "
                                  "run's stages/ folder and its cells, and rerun")
        return cls(d["round"], d["identity"], tuple(map(str, d["tasks"])),
                   {str(k): [int(x) for x in v] for k, v in d["docs"].items()},
                   {str(k): [int(x) for x in v] for k, v in d.get("padding", {}).items()},
                   {str(k): list(map(str, v)) for k, v in d.get("groups", {}).items()})


def write_round(run_dir: Path, request: RoundRequest) -> None:
    path = layout.round_file(run_dir, request.round)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, request.to_json())


def read_round(run_dir: Path, r: int, identity: str | None = None) -> RoundRequest | None:
    """Round r's record, or None when the run has not written it; refused when it is of another spec."""
    path = layout.round_file(run_dir, r)
    if not path.exists():
        return None
    data = read_json(path)
    if data is None:
        raise EvalParityError(f"{path} is truncated or corrupt: remove the run's stages/ folder and its cells, "
                              "and rerun")
    req = RoundRequest.from_json(data, str(path))
    if req.round != r or (identity is not None and req.identity != identity):
        raise EvalParityError(f"{path} is round {req.round} of spec {req.identity}, not round {r} of this run's "
                              f"{identity}: remove the run's stages/ folder and its cells, and rerun")
    return req


def written_rounds(run_dir: Path) -> int:
    """How many consecutive round records (from round 0) the run has written."""
    r = 0
    while layout.round_file(run_dir, r).exists():
        r += 1
    return r


def write_finish(run_dir: Path, rounds: int, identity: str) -> None:
    write_json(layout.finish_file(run_dir), {"rounds": int(rounds), "identity": identity})


def clear_finish(run_dir: Path) -> None:
    """A run that resumes may decide on more rounds: the cells it starts wait for the record of the next."""
    layout.finish_file(run_dir).unlink(missing_ok=True)


def finished_at(run_dir: Path) -> int | None:
    """The number of rounds the run decided on, once it has (``write_finish``); else None."""
    data = read_json(layout.finish_file(run_dir))
    return int(data["rounds"]) if isinstance(data, dict) and type(data.get("rounds")) is int else None


def wait_for_round(run_dir: Path, r: int, progress=None, identity: str | None = None) -> RoundRequest | None:
    """Round r's record once the run writes it; None once the run has finished before round r. The cell's
    process waits here between rounds, its model loaded (it dies with the run: ``procs``)."""
    while True:
        req = read_round(run_dir, r, identity)
        if req is not None:
            return req
        done = finished_at(run_dir)
        if done is not None and done <= r:
            return None
        if progress is not None:
            progress.update()
        time.sleep(POLL_S)
