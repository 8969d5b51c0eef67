"""A cache of lm-eval's index of its own task YAMLs, so that each process does not parse ~14,000 files again.

lm-eval's ``TaskManager`` parses every YAML under ``lm_eval/tasks`` each time it is built: about 8 s on a
2-core machine, and evalparity builds one in the run's process and one in every cell. The index of that
tree depends only on its files, so it is kept in the cache directory under a key made of lm-eval's
version and every YAML's path, size and modification time (a walk of the tree takes well under a second),
and read back by any process that finds the same key. Other roots (``task_configs/``, ``--include-path``)
are small and indexed afresh each time, exactly as lm-eval does.

This reaches into lm-eval's private ``TaskIndex``; if that is not there (another lm-eval version), or the
cache cannot be read or written, lm-eval builds its index itself, as without this module.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import multiprocessing
import os
import pickle
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from evalparity import config, procs
from evalparity.files import write_atomic

FILE_PREFIX = "lm-eval-tasks-"


def _key(root: Path, files: list[Path], version: str) -> str:
    h = hashlib.sha256(f"{version}\n{root}\n".encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(root)}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


@contextlib.contextmanager
def cached() -> Iterator[None]:
    """While active, lm-eval's index of its own task tree comes from (or goes to) the cache."""
    try:  # heavy: lm_eval
        import lm_eval
        from lm_eval.tasks import _index
    except ImportError:
        yield
        return
    index_cls = getattr(_index, "TaskIndex", None)
    original = getattr(index_cls, "build", None)
    iter_files = getattr(index_cls, "_iter_yaml_files", None)
    if original is None or iter_files is None:
        yield
        return
    own_root = Path(_index.__file__).resolve().parent
    version = getattr(lm_eval, "__version__", "unknown")

    def build_root(root: Path, resolve_includes: bool) -> dict:
        if Path(root).resolve() != own_root or not resolve_includes:
            return original([root], resolve_includes=resolve_includes)
        try:
            key = _key(own_root, list(iter_files(own_root)), version)
        except (OSError, ValueError):
            return original([root], resolve_includes=resolve_includes)
        path = config.task_index_dir() / f"{FILE_PREFIX}{key}.pkl"
        try:
            return pickle.loads(path.read_bytes())
        except Exception:  # noqa: BLE001 - absent, partial or from another version: rebuild
            pass
        index = parallel_build(index_cls, own_root, resolve_includes) or original([root],
                                                                             resolve_includes=resolve_includes)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL))
            for old in path.parent.glob(f"{FILE_PREFIX}*.pkl"):  # one tree state kept: the others are stale
                if old != path:
                    old.unlink(missing_ok=True)
        except Exception:  # noqa: BLE001 - a read-only or full cache only costs the rebuild
            pass
        return index

    def build(paths, *, resolve_includes: bool = True) -> dict:
        index: dict = {}
        for root in paths:  # later roots override earlier ones, as in lm-eval's own build
            index.update(build_root(root, resolve_includes))
        return index

    index_cls.build = staticmethod(build)
    try:
        yield
    finally:
        index_cls.build = staticmethod(original)


MAX_WORKERS = 16


def _load(job: tuple[Path, bool]) -> tuple[dict | None, bool]:
    """One YAML as lm-eval's index reads it (``load_yaml``, functions unresolved): (its config, whether it
    loaded). lm-eval skips a file that does not load; so does ``parallel_build``."""
    from lm_eval.tasks import _index  # heavy: lm_eval (imported by the forking process already)

    path, resolve_includes = job
    try:
        return _index.load_yaml(path, resolve_func=False, recursive=resolve_includes), True
    except Exception:  # noqa: BLE001 - lm-eval's own build skips such a file the same way
        return None, False


def parallel_build(index_cls, root: Path, resolve_includes: bool) -> dict | None:
    """lm-eval's ``TaskIndex.build([root])`` with the YAML files read in parallel, or None where that is not
    done (fewer than 2 cores, a process running other Python threads, which ``fork`` would not copy, or a
    worker lost on the way): the caller builds serially, as lm-eval does.

    Why: parsing lm-eval's ~14,000 task YAMLs is a fresh machine's first task check, on the critical path of
    its first run, serial in one process: 6.4 s of a 6.7 s build on 2 cores; on fresh H200 machines the
    whole task-and-data step took 8.4 s alone (``cold16``) and 12.8-15.2 s beside the embedded model's
    preparation (session 17, results/staged-h200), the parse's share there not measured. Only the reading is
    spread over processes (forked, dying with this one: ``procs.forked_worker_setup``); the entries are then
    made in this process by lm-eval's own ``process_cfg``, in lm-eval's file order, so that its rules (the
    first of two same-named tasks wins, tags gather their tasks) give the same index.
    ``tests/test_task_index.py`` holds the two equal on the installed lm-eval."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = min(cores, MAX_WORKERS)
    if workers < 2 or threading.active_count() > 1 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    files = list(index_cls._iter_yaml_files(root))
    jobs = [(f, resolve_includes) for f in files]
    procs.prepare_fork()
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                 initializer=procs.forked_worker_setup, initargs=(os.getpid(),)) as pool:
            loaded = list(pool.map(_load, jobs, chunksize=max(1, math.ceil(len(jobs) / (workers * 4)))))
    except Exception:  # noqa: BLE001 - a worker lost (killed, out of memory): lm-eval's serial build instead
        return None
    index: dict = {}
    for path, (cfg, ok) in zip(files, loaded):
        if not ok:
            continue
        try:
            index_cls.process_cfg(cfg, path, index)
        except Exception:  # noqa: BLE001 - as lm-eval's build: a file it cannot index is skipped
            continue
    return index
