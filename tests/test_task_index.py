"""The cache of lm-eval's task index: the same index as lm-eval builds, rebuilt when the tree changes,
and harmless when the cache is corrupt."""

from __future__ import annotations

import os
import shutil

import pytest
from lm_eval.tasks import TaskManager

from evalparity import task_index, tasks


def _entries(tm: TaskManager) -> dict:
    return {k: (e.kind, e.yaml_path, e.cfg, e.tags) for k, e in tm.task_index.items()}


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALPARITY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "task-index"


@pytest.fixture(scope="module")
def built(tiny_tasks, tmp_path_factory):
    """A task manager built through an empty cache, which writes the cache: (that cache folder, the manager).
    Built once (lm-eval parses its ~14,000 YAMLs: 8-10 s on 2 cores) for the two tests that need a written
    cache."""
    root = tmp_path_factory.mktemp("built") / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EVALPARITY_CACHE", str(root))
        first = tasks.task_manager([str(tiny_tasks)])
    return root, first


def test_cached_index_equals_lm_evals_own(built, tiny_tasks, monkeypatch):
    root, first = built  # built and written the cache
    files = list((root / "task-index").glob(f"{task_index.FILE_PREFIX}*.pkl"))
    assert len(files) == 1
    monkeypatch.setenv("EVALPARITY_CACHE", str(root))
    second = tasks.task_manager([str(tiny_tasks)])  # reads it
    plain = TaskManager(include_path=tasks.include_paths([str(tiny_tasks)]))
    assert _entries(first) == _entries(second) == _entries(plain)
    assert "tiny_mc" in second.all_tasks and "hellaswag" in second.all_tasks  # include path and lm-eval's own


def test_a_corrupt_cache_is_rebuilt(built, cache, tiny_tasks):
    shutil.copytree(built[0] / "task-index", cache)  # a cache as a build wrote it
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


PARALLEL_EQUALS_SERIAL = """
from pathlib import Path
from lm_eval.tasks import _index
from evalparity import task_index
root = Path(_index.__file__).resolve().parent
par = task_index.parallel_build(_index.TaskIndex, root, True)
assert par is not None, "the parallel build did not run (one core, or threads in this process)"
ser = _index.TaskIndex.build([root], resolve_includes=True)
entries = lambda ix: {k: (e.kind, e.yaml_path, e.cfg, e.tags) for k, e in ix.items()}
a, b = entries(par), entries(ser)
assert a == b, sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))[:5]
print(len(par))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the parallel build needs 2 cores")
def test_the_parallel_build_is_lm_evals_own_index():
    """``parallel_build`` (the YAMLs read by several processes) against lm-eval's serial ``TaskIndex.build`` on
    the installed lm-eval's whole task tree: every entry's kind, file, config and tags. In a process of its
    own: the parallel build forks, which it does only where no other thread runs (this suite runs some)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PARALLEL_EQUALS_SERIAL], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 10_000
