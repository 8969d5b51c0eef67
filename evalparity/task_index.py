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
import pickle
from collections.abc import Iterator
from pathlib import Path

from evalparity import config
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
        index = original([root], resolve_includes=resolve_includes)
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
