"""A diagnostic, not the product's: with this folder first on ``PYTHONPATH`` and ``EP_PROFILE_DIR`` set, every
Python process started (a command and the workers it starts) runs under cProfile from its interpreter's start,
imports included, and writes ``EP_PROFILE_DIR/prof-<pid>-<name>.pstats`` at its exit. For the GPU machine
(scripts/gpu), where a worker's wall is to be split into its imports, its load and its work without changing
the product's code; cProfile slows Python-heavy code, so the shares are what it tells, not the seconds."""

import atexit
import cProfile
import os
import sys

_DIR = os.environ.get("EP_PROFILE_DIR")
if _DIR:
    _PROF = cProfile.Profile()
    _PROF.enable()

    def _dump() -> None:
        _PROF.disable()
        name = "-".join(a.replace("/", "_") for a in sys.argv[:3] if a)[:80] or "python"
        os.makedirs(_DIR, exist_ok=True)
        _PROF.dump_stats(os.path.join(_DIR, f"prof-{os.getpid()}-{name}.pstats"))

    atexit.register(_dump)
