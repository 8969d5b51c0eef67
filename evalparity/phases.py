"""Where a cell's evaluation time goes: request building, tokenising, the engine, post-processing.

Why: a cell spends most of its time outside the model (issue 19: an H200 cell of SmolLM2 on HellaSwag took
70-106 s where the bare engine needs 29-55 s), and a profiler run is not something every user can do. So
every cell records, without a profiler, the phases of lm-eval's ``simple_evaluate`` by timing the LM's
request methods (``loglikelihood``, ``loglikelihood_rolling``, ``generate_until``), which lm-eval calls
once per request type between building the requests and scoring them:

- ``requests_s``: from ``simple_evaluate``'s start to the first request call (task loading, few-shot
  sampling, prompt templates: lm-eval's ``build_all_requests``);
- ``tokenize_s``: the batched pre-tokenisation of loglikelihood requests (``backends/pretokenize.py``),
  also when its check discards it (``settings.batched_tokenization`` false: lm-eval then tokenises each
  request itself, inside ``engine_s``);
- ``engine_s``: the rest of the request calls (lm-eval's own per-request code around the model included);
- ``postprocess_s``: from the last request call's return to ``simple_evaluate``'s end (metrics,
  aggregation, lm-eval's sample logging).
The writing of the cell's own files is timed apart (``write_s`` in ``cell.json``).
"""

from __future__ import annotations

import time

from evalparity.config import profile_enabled
from evalparity.files import atomic_target, write_atomic

REQUEST_METHODS = ("loglikelihood", "loglikelihood_rolling", "generate_until")


class PhaseClock:
    """Times an lm-eval LM's request calls. ``start()`` when ``simple_evaluate`` begins, ``stop()`` when it
    returns, then ``phases()``. The LM's methods are wrapped on the instance, so its class is untouched."""

    def __init__(self, lm) -> None:
        self.lm = lm
        self.t_start = self.t_stop = 0.0
        self.first_call: float | None = None
        self.last_return: float | None = None
        self.in_calls = 0.0
        for name in REQUEST_METHODS:
            method = getattr(lm, name, None)
            if method is not None:
                setattr(lm, name, self._timed(method))

    def _timed(self, method):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            if self.first_call is None:
                self.first_call = t0
            try:
                return method(*args, **kwargs)
            finally:
                t1 = time.perf_counter()
                self.in_calls += t1 - t0
                self.last_return = t1

        timed.__wrapped__ = method  # type: ignore[attr-defined]
        return timed

    def start(self) -> None:
        self.t_start = time.perf_counter()

    def stop(self) -> None:
        self.t_stop = time.perf_counter()

    @property
    def elapsed(self) -> float:
        """The evaluation's wall time, from ``start()`` to ``stop()``."""
        return self.t_stop - self.t_start

    def phases(self) -> dict[str, float]:
        """Seconds per phase (module docstring); they add up to the evaluation's wall time."""
        total = self.elapsed
        if self.first_call is None:  # no request at all (every task empty)
            return {"requests_s": total, "tokenize_s": 0.0, "engine_s": 0.0, "postprocess_s": 0.0}
        tokenize = float(getattr(self.lm, "tokenize_s", 0.0) or 0.0)
        requests = self.first_call - self.t_start
        postprocess = self.t_stop - (self.last_return or self.t_stop)
        between = total - requests - postprocess - self.in_calls  # lm-eval's work between request types
        return {"requests_s": requests + max(between, 0.0), "tokenize_s": tokenize,
                "engine_s": self.in_calls - tokenize, "postprocess_s": postprocess}


def profiled(fn, out_dir, *args, **kwargs):
    """``fn(*args, **kwargs)``, under cProfile when ``$EVALPARITY_PROFILE`` is on (1): the cell folder then gets
    ``profile.pstats`` and ``profile.txt`` (the top 40 functions by cumulative and by own time). For
    diagnosing where a cell's time goes (``scripts/gpu/issue19_run.sh``, ``MODE=profile``); cProfile slows
    Python-heavy code, so a profiled cell's timings are not its real ones."""
    if not profile_enabled():
        return fn(*args, **kwargs)
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    try:
        return prof.runcall(fn, *args, **kwargs)
    finally:
        with atomic_target(out_dir / "profile.pstats") as tmp:
            prof.dump_stats(str(tmp))
        text = io.StringIO()
        for key in ("cumulative", "tottime"):
            pstats.Stats(prof, stream=text).sort_stats(key).print_stats(40)
        write_atomic(out_dir / "profile.txt", text.getvalue())
