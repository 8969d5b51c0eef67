"""Speed-ups for lm-eval inside a cell process that change no result, each checked by a test.

``cache_templates``: lm-eval renders every prompt, target and choice with ``utils.apply_template``, which
compiles its Jinja template again on every call (``env.from_string``): per HellaSwag doc, several compiles
of the same few template strings. Profiled on an H200 hf cell (2,500 HellaSwag docs, ``EVALPARITY_PROFILE=1``),
these compiles took 6.4 s (10,002 calls), a third of the cell's evaluation under the profiler. A compiled
``jinja2.Template`` depends only on its source and the environment, which lm-eval configures once at import
(its filters), so the same source always compiles to an equivalent template; caching by source renders
the same text. ``tests/test_lmeval_patches.py`` checks this on the tasks' own templates.
"""

from __future__ import annotations

import functools

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
