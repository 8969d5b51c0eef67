"""Speed-ups for lm-eval inside a cell process that change no result, each checked by a test.

``cache_templates``: lm-eval renders every prompt, target and choice with ``utils.apply_template``, which
compiles its Jinja template again on every call (``env.from_string``): per HellaSwag doc, several compiles
of the same few template strings. Profiled on an H200 hf cell (2,500 HellaSwag docs, ``EVALPARITY_PROFILE=1``),
these compiles took 6.4 s (10,002 calls), a third of the cell's evaluation under the profiler. A compiled
``jinja2.Template`` depends only on its source and the environment, which lm-eval configures once at import
(its filters), so the same source always compiles to an equivalent template; caching by source renders
the same text. ``tests/test_lmeval_patches.py`` checks this on the tasks' own templates.

``IndexSet``: lm-eval selects the docs of ``simple_evaluate(samples=...)`` with ``i in samples`` for every
doc of the task (``Task.doc_iterator``), a scan of the list per doc: a staged round of 2,000 HellaSwag docs
makes about 10,000 x 2,000 comparisons. The same indices in a list whose ``in`` is a set lookup select the
same docs in the same order.

``pick_docs``: even with ``IndexSet``, ``Task.doc_iterator`` reads every doc of the task to keep the chosen
ones (``enumerate(x for i, x in enumerate(self.eval_docs) if i in samples)``), twice per ``simple_evaluate``
(building the requests, then scoring them), and takes ``eval_docs`` (which reruns a task's ``process_docs``)
once more for its length check. Profiled on an H200 vLLM cell of a staged HellaSwag run (four rounds, 4,000
of 10,042 docs), reading those rows took about 11 s under the profiler (80,348 rows formatted by
``datasets``). The patched iterator takes ``eval_docs`` once and reads only the chosen rows, by index, in the
same ascending order, numbered from 0 as lm-eval numbers them; anything else (no ``samples``, an index
lm-eval would refuse) goes to lm-eval's own code.

``cache_env_info``: lm-eval's ``simple_evaluate`` ends with ``add_env_info``, which runs torch's
``collect_env`` (nvidia-smi, pip and other subprocesses): profiled on an H200, about 1.4 s of every staged
round of a resident cell, where nothing it reports can change between rounds of one process. The first
call's answer is kept and copied into every later result.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable

CACHE_SIZE = 4096  # distinct template sources; a run uses a few per task


def cache_templates() -> bool:
    """Make lm-eval's template environment compile each template source once (module docstring). Returns
    whether the cache is in place (False where lm-eval no longer has the environment this patches)."""
    from lm_eval import utils  # heavy: lm_eval

    env = getattr(utils, "env", None)
    if env is None or not hasattr(env, "from_string"):
        return False
    if not getattr(env.from_string, "evalparity_cached", False):
        env.from_string = _cached_from_string(env.from_string)  # on the instance: lm-eval's class is untouched
    return True


def _cached_from_string(from_string):
    """``from_string`` that compiles a source given alone once; a call with ``globals`` or a template class
    (which lm-eval does not make) goes to Jinja as it is."""
    compiled = functools.lru_cache(maxsize=CACHE_SIZE)(from_string)

    @functools.wraps(from_string)
    def cached(source, *args, **kwargs):
        if args or kwargs or not isinstance(source, str):
            return from_string(source, *args, **kwargs)
        return compiled(source)

    cached.evalparity_cached = True  # type: ignore[attr-defined]
    cached.cache_info = compiled.cache_info  # type: ignore[attr-defined]
    return cached


class IndexSet(list):
    """Doc indices for lm-eval's ``samples``: a list (lm-eval takes its ``len`` and iterates it, and it is
    written to lm-eval's config as a list) whose membership test is a set lookup (module docstring)."""

    def __init__(self, ids: Iterable[int]) -> None:
        super().__init__(ids)
        self._members = frozenset(self)

    def __contains__(self, item: object) -> bool:
        return item in self._members


def fast_samples(samples: dict[str, list[int]] | None) -> dict[str, list[int]] | None:
    """``samples`` with each task's indices as an ``IndexSet`` (None stays None)."""
    return None if samples is None else {task: IndexSet(ids) for task, ids in samples.items()}


def pick_docs() -> bool:
    """Make ``Task.doc_iterator`` read only the chosen docs of ``samples`` (module docstring). Returns whether
    the patch is in place (False where lm-eval's ``Task`` has no ``doc_iterator``, or another one than the code
    this reproduces: a ``python=`` cell's other lm-eval keeps its own)."""
    from lm_eval.api import task as task_mod  # heavy: lm_eval

    original = getattr(task_mod.Task, "doc_iterator", None)
    if original is None:
        return False
    if getattr(original, "evalparity_picked", False):
        return True
    if not _is_checked_selection(original):
        return False
    task_mod.Task.doc_iterator = _picking_doc_iterator(original)  # in the cell's process only
    return True


SELECTION = "enumerate(x for i, x in enumerate(self.eval_docs) if i in samples)"  # lm-eval 0.4.13's


def _is_checked_selection(original) -> bool:
    """Whether ``Task.doc_iterator`` is the code the patch reproduces (numbering the chosen docs 0..k-1 by
    position): lm-eval's main numbers them by their index instead, and a ``python=`` cell may run it."""
    import inspect

    try:
        source = inspect.getsource(original)
        params = list(inspect.signature(original).parameters)
    except (OSError, TypeError, ValueError):
        return False
    return SELECTION in " ".join(source.split()) and params == ["self", "rank", "limit", "world_size", "samples"]


def _picking_doc_iterator(original):
    from lm_eval import utils  # heavy: lm_eval

    @functools.wraps(original)
    def doc_iterator(self, *, rank: int = 0, limit: int | None = None, world_size: int = 1,
                     samples: list[int] | None = None):
        if not samples:
            return original(self, rank=rank, limit=limit, world_size=world_size, samples=samples)
        docs = self.eval_docs
        n = len(docs)
        if any(e >= n for e in samples):  # lm-eval's own assertion and message
            return original(self, rank=rank, limit=limit, world_size=world_size, samples=samples)
        chosen = sorted({i for i in samples if 0 <= i})  # the indices ``i in samples`` keeps, in the docs' order
        return utils.create_iterator(enumerate(docs[i] for i in chosen), rank=int(rank), limit=None,
                                     world_size=int(world_size))

    doc_iterator.evalparity_picked = True  # type: ignore[attr-defined]
    return doc_iterator


def cache_env_info() -> bool:
    """Make lm-eval's ``add_env_info`` compute once per process (module docstring). Returns whether the cache
    is in place (False where lm-eval's evaluator no longer calls it by that name)."""
    from lm_eval import evaluator  # heavy: lm_eval

    add = getattr(evaluator, "add_env_info", None)
    if add is None:
        return False
    if not getattr(add, "evalparity_cached", False):
        evaluator.add_env_info = _once_env_info(add)
    return True


def _once_env_info(add_env_info):
    first: dict = {}

    @functools.wraps(add_env_info)
    def cached(storage: dict) -> None:
        if not first:
            before = set(storage)
            add_env_info(storage)
            first.update(copy.deepcopy({k: v for k, v in storage.items() if k not in before}))
            return
        storage.update(copy.deepcopy(first))

    cached.evalparity_cached = True  # type: ignore[attr-defined]
    return cached
