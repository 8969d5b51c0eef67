"""The cache of lm-eval's task index: the same index as lm-eval builds, rebuilt when the tree changes,
and harmless when the cache is corrupt."""

from __future__ import annotations

import os

import pytest
from lm_eval.tasks import TaskManager

from evalparity import task_index, tasks


def _entries(tm: TaskManager) -> dict:
    return {k: (e.kind, e.yaml_path, e.cfg, e.tags) for k, e in tm.task_index.items()}


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALPARITY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "task-index"


def test_cached_index_equals_lm_evals_own(cache, tiny_tasks):
    first = tasks.task_manager([str(tiny_tasks)])  # builds and writes the cache
    files = list(cache.glob(f"{task_index.FILE_PREFIX}*.pkl"))
    assert len(files) == 1
    second = tasks.task_manager([str(tiny_tasks)])  # reads it
    plain = TaskManager(include_path=tasks.include_paths([str(tiny_tasks)]))
    assert _entries(first) == _entries(second) == _entries(plain)
    assert "tiny_mc" in second.all_tasks and "hellaswag" in second.all_tasks  # include path and lm-eval's own


def test_a_corrupt_cache_is_rebuilt(cache, tiny_tasks):
    tasks.task_manager([str(tiny_tasks)])
    (path,) = cache.glob(f"{task_index.FILE_PREFIX}*.pkl")
    path.write_bytes(b"not a pickle")
    tm = tasks.task_manager([str(tiny_tasks)])
    assert "hellaswag" in tm.all_tasks and path.stat().st_size > 1000


def test_key_follows_every_file(tmp_path):
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    f = root / "a" / "t.yaml"
    f.write_text("task: t\n")
    files = [f]
    k0 = task_index._key(root, files, "0.4.13")
    assert task_index._key(root, files, "0.4.13") == k0
    assert task_index._key(root, files, "0.4.14") != k0  # another lm-eval
    f.write_text("task: t2\n")  # edited (size changes)
    k1 = task_index._key(root, files, "0.4.13")
    assert k1 != k0
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched
    assert task_index._key(root, files, "0.4.13") != k1
    g = root / "a" / "u.yaml"
    g.write_text("task: u\n")
    assert task_index._key(root, [f, g], "0.4.13") != task_index._key(root, files, "0.4.13")  # added
