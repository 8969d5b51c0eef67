"""Where everything in a run folder is: the one place that spells a run folder's paths.

The names are ``config``'s (the layout, in one comment there); every module that needs a path in a run
folder asks for it here, so a change of layout is a change of this file.

    <run>/spec.json | compare.json            spec_file, compare_file   what the run is (records)
    <run>/run.json                            run_file                  where the last command's time went
    <run>/cells/<cell>/                       unit_dir (CELLS)          one cell: cell_record, table, log_file,
                                                                        lm_eval_dir, lm_eval_results, progress_file
    <run>/cells/<cell>.failed/                failed_dir                a failed attempt kept beside a finished cell
    <run>/shards/<cell>.<k>of<n>/             unit_dir (SHARDS)         one shard, until merged
    <run>/<cells|shards>/.tmp-<unit>/         tmp_dir                   a unit being written
    <run>/stages/round-<r>.json, finish.json  round_file, finish_file   a staged run's rounds (rounds)
    <run>/stages/<cell>.r<r>/                 unit_dir (STAGES)         one cell's part of round r
    <run>/attempts/<cells|shards>/<unit>/     attempts_dir              every failed attempt of a unit
    <run>/stats/, stats/verdicts.json         stats_dir, verdicts_file, stats_table
    <run>/report/                             report_dir
    <run>/drift/                              drift_dir
"""

from __future__ import annotations

import os
from pathlib import Path

from evalparity.config import (
    ATTEMPTS,
    CELL_FILE,
    CELLS,
    COMPARE_FILE,
    DRIFT,
    FAILED_SUFFIX,
    LM_EVAL_DIR,
    LM_EVAL_RESULTS,
    LOG_FILE,
    PLAN_FILE,
    PROGRESS_FILE,
    REPORT,
    RUN_FILE,
    SHARDS,
    SPEC_FILE,
    STAGES,
    STATS,
    TABLE_FILE,
    TMP_PREFIX,
    VERDICTS_FILE,
)
from evalparity.errors import EvalParityError
from evalparity.rundir.names import check_name


# ---------------------------------------------------------------- the run folder
def spec_file(run: Path) -> Path:
    return Path(run) / SPEC_FILE


def compare_file(run: Path) -> Path:
    return Path(run) / COMPARE_FILE


def run_file(run: Path) -> Path:
    return Path(run) / RUN_FILE


def plan_file(run: Path) -> Path:
    """``plan.json``: what ``evalparity plan`` wrote from this run (``plan``)."""
    return Path(run) / PLAN_FILE


def cells_dir(run: Path) -> Path:
    return Path(run) / CELLS


def shards_dir(run: Path) -> Path:
    return Path(run) / SHARDS


def stages_dir(run: Path) -> Path:
    return Path(run) / STAGES


def round_file(run: Path, r: int) -> Path:
    """``stages/round-<r>.json``: what round r of a staged run scores (``rounds.RoundRequest``)."""
    return stages_dir(run) / f"round-{int(r)}.json"


def finish_file(run: Path) -> Path:
    """``stages/finish.json``: the staged run has decided; no round after the ones it names."""
    return stages_dir(run) / "finish.json"


def unit_dir(run: Path, name: str, folder: str = CELLS) -> Path:
    """``cells/<name>`` (or ``shards/<name>``), for a checked ``name``: always directly inside that folder."""
    return Path(run) / folder / check_name(name)


def cell_dir(run: Path, name: str) -> Path:
    return unit_dir(run, name, CELLS)


def tmp_dir(run: Path, name: str, folder: str = CELLS) -> Path:
    """Where a unit is written before its publish renames it into place."""
    return Path(run) / folder / f"{TMP_PREFIX}{check_name(name)}"


def failed_dir(run: Path, name: str, folder: str = CELLS) -> Path:
    return Path(run) / folder / f"{check_name(name)}{FAILED_SUFFIX}"


def attempts_dir(run: Path, name: str, folder: str = CELLS) -> Path:
    """``<run>/attempts/<folder>/<name>``: every failed attempt of a unit. Not under ``cells/``, where the
    statistics take every folder for a cell of the run. Refused in one line where a part of that path is a
    symbolic link: attempts are moved there, and through a link they would leave the run folder."""
    path = Path(run) / ATTEMPTS / folder / check_name(name)
    for part in (path.parents[1], path.parent, path):
        if part.is_symlink():
            raise EvalParityError(f"{part} is a symbolic link (to {os.readlink(part)}): a run keeps its failed "
                                  "attempts in a folder of its own; remove the link and rerun")
    return path


def stats_dir(run: Path) -> Path:
    return Path(run) / STATS


def verdicts_file(run: Path) -> Path:
    return stats_dir(run) / VERDICTS_FILE


def stats_table(run: Path, name: str) -> Path:
    """``stats/<name>.parquet``: one table of the statistics stage."""
    return stats_dir(run) / f"{name}.parquet"


def report_dir(run: Path) -> Path:
    return Path(run) / REPORT


def drift_dir(run: Path) -> Path:
    return Path(run) / DRIFT


# ---------------------------------------------------------------- inside one unit's folder
def cell_record(unit: Path) -> Path:
    return Path(unit) / CELL_FILE


def table(unit: Path) -> Path:
    return Path(unit) / TABLE_FILE


def log_file(unit: Path) -> Path:
    return Path(unit) / LOG_FILE


def progress_file(unit: Path) -> Path:
    return Path(unit) / PROGRESS_FILE


def lm_eval_dir(unit: Path) -> Path:
    return Path(unit) / LM_EVAL_DIR


def lm_eval_results(unit: Path) -> Path:
    return Path(unit) / LM_EVAL_RESULTS


# ---------------------------------------------------------------- inside a drift folder (drift_dir, or drift --out)
DRIFT_SPEC, DRIFT_PROMPTS = "spec.json", "prompts.json"


def drift_spec(folder: Path) -> Path:
    """What the drift workers probe: model, reference, cells and their settings."""
    return Path(folder) / DRIFT_SPEC


def drift_prompts(folder: Path) -> Path:
    return Path(folder) / DRIFT_PROMPTS


def drift_summary(folder: Path, cell: str) -> Path:
    """One probed cell's summary (``drift/<cell>.json``)."""
    return Path(folder) / f"{check_name(cell)}.json"


def drift_log(folder: Path, cell: str) -> Path:
    return Path(folder) / f"{check_name(cell)}.log"


def drift_progress(folder: Path, cell: str) -> Path:
    return Path(folder) / f".{check_name(cell)}.progress.json"


def drift_reference(folder: Path) -> Path:
    """The reference's hidden states, logprobs and generations, computed once for every cell
    (``reference/chunk-<k>.safetensors`` and ``reference/reference.json``); removed after the cells unless
    ``--dump`` keeps them."""
    return Path(folder) / "reference"


def drift_chunk(folder: Path, k: int) -> Path:
    """Chunk ``k`` of a probed side's hidden states (the reference's folder, or ``dump/<cell>/``)."""
    return Path(folder) / f"chunk-{k:05d}.safetensors"


def drift_dump(folder: Path, cell: str) -> Path:
    """``--dump``: a cell's own hidden states, chunk by chunk like the reference's."""
    return Path(folder) / "dump" / check_name(cell)


def drift_sync(folder: Path, side: str, state: str) -> Path:
    """A side's marker in a drift whose sides start at once (``drift.run_drift``'s ``reference_too``):
    ``loaded`` (written by its worker once its model is up) or ``ended`` (written by the parent once its
    worker's process has ended, with its exit status), in ``.sync/``, removed with the drift's staging."""
    return Path(folder) / ".sync" / f"{check_name(side)}.{state}"


def drift_summaries(folder: Path) -> list[tuple[str, Path]]:
    """(cell, path) of every probed cell's summary in a drift folder, by cell name."""
    skip = {DRIFT_SPEC, DRIFT_PROMPTS}
    return [(p.stem, p) for p in sorted(Path(folder).glob("*.json")) if p.name not in skip] \
        if Path(folder).is_dir() else []


def figures_dir(run: Path) -> Path:
    """``report/figures``: the report's PNGs (also embedded in report.html)."""
    return report_dir(run) / "figures"
