"""What a process has used of its host so far (CPU time, context switches, page faults, garbage collection),
read before and after a phase by the processes that time one: a cell's evaluation (``cells``), a drift side's
probe and generation (``drift.worker``). A leaf: the standard library only."""

from __future__ import annotations

import gc
import resource
import time


class _GcClock:
    """Wall seconds of Python's cyclic garbage collector, all passes and full ones, from ``gc.callbacks``.

    Why: scoring on vLLM used to keep a dict and Logprob objects per prompt token until lm-eval parsed them,
    and every full collection walks every live object. That work grows with the heap and is memory-bound,
    so it is a cost that a busy neighbour on the same host makes worse; this says how much of a phase it was."""

    def __init__(self) -> None:
        self.total_s = self.full_s = 0.0
        self.full_passes = 0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        took = time.perf_counter() - self._t0
        self.total_s += took
        if info.get("generation") == 2:
            self.full_s += took
            self.full_passes += 1


GC_CLOCK = _GcClock()


def cpu_usage() -> dict[str, float]:
    """This process's CPU time and context switches so far (all its threads; vLLM's engine runs in-process),
    and the time its garbage collector took since this was first called (``_GcClock``, which only the
    processes that measure carry).

    Why: a phase's CPU seconds against its wall seconds tell a slow cell's causes apart. If the CPU time
    grew too, each instruction ran slower (cores or caches shared with another cell). If it stayed put while
    the wall grew, the process waited (on its GPU, on I/O). Involuntary switches count the times the kernel
    took a core away. Page faults that read the disk (major) or not (minor) tell first-use costs (code or
    data not yet in the page cache, fresh memory) from steady work."""
    if GC_CLOCK not in gc.callbacks:
        gc.callbacks.append(GC_CLOCK)
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"user_s": r.ru_utime, "sys_s": r.ru_stime, "voluntary_switches": r.ru_nvcsw,
            "involuntary_switches": r.ru_nivcsw, "major_faults": r.ru_majflt, "minor_faults": r.ru_minflt,
            "gc_s": GC_CLOCK.total_s, "gc_full_s": GC_CLOCK.full_s, "gc_full_passes": GC_CLOCK.full_passes}


def usage_since(before: dict[str, float]) -> dict[str, float]:
    now = cpu_usage()
    return {k: round(now[k] - before[k], 3) for k in now}
