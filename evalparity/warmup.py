"""Caches a backend fills once per machine, warmed while a run sets up so that its cells do not each pay
for them at once (issue 26, item 5).

A backend module may define ``warm_caches(architectures, device) -> argv | None``: a command to run in the
background from the start of the setup (``vllm``: its model-info cache, ``backends/vllm_warmup.py``). The run
does not wait for it: measured on an H200 (results/staged-h200), a fresh machine's setup (50 s: the embedded
model's preparation) outlasts the warm-up, and on a warm machine waiting for it cost 15.7 s (it imports vLLM
to find the cache already filled) while the cells reach vLLM's inspection only after their own imports. A
warm-up that is late, fails or is absent only costs what the cells would have paid without it. Its output
goes to a log in the cache directory, never to the run folder (which is not set up while it runs).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from evalparity import backends, config, procs


def architectures(model_path: Path | str | None) -> list[str]:
    """The model's ``architectures`` from its config.json (the embedded model's are known before it is
    prepared); [] where that cannot be read (a hub id not yet fetched)."""
    from evalparity.data import embedded

    if model_path is None:
        return list(embedded.ARCHITECTURES)
    try:
        archs = json.loads((Path(model_path) / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [a for a in archs if isinstance(a, str)]


@dataclass
class Warmup:
    """The warm-up processes of one run."""

    running: list[subprocess.Popen] = field(default_factory=list)

    def close(self) -> None:
        """Stop what is still running and forget what has ended (``procs``): at the end of the run."""
        for proc in self.running:
            procs.stop(proc, grace_s=2.0)  # waits for it and forgets it, ended or not
        self.running.clear()


def start(backend_names: set[str], device: str, model_path: Path | str | None) -> Warmup:
    """Start each named backend's warm-up for this model on this device (none on the CPU)."""
    archs = architectures(model_path)
    warm = Warmup()
    if not archs:
        return warm
    log_path = config.cache_dir() / "warmup.log"
    for name in sorted(backend_names):
        argv = getattr(backends.get(name), "warm_caches", lambda *_: None)(archs, device)
        if not argv:
            continue
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            warm.running.append(procs.popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log))
    return warm
