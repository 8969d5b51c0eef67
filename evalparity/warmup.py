"""Caches a backend fills once per machine, warmed while a run sets up so that its cells do not each pay
for them at once (issue 26, item 5).

A backend module may define ``warm_caches(architectures, device) -> argv | None``: a command to run in the
background from the start of the setup (``vllm``: its model-info cache, ``backends/vllm_warmup.py``). The run
does not wait for it: measured on an H200 (results/staged-h200), a fresh machine's setup (50 s: the embedded
model's preparation) outlasts the warm-up, and on a warm machine waiting for it cost 15.7 s (it imports vLLM
to find the cache already filled) while the cells reach vLLM's inspection only after their own imports. A
warm-up that is late, fails or is absent only costs what the cells would have paid without it. Its output
goes to a log in the cache directory, never to the run folder (which is not set up while it runs).

A backend may also warm the kernels its engine compiles when it starts (``vllm``: Triton's, 14-15 s of a
cold vLLM cell's start on an H200; ``backends/vllm_warmup.py``). Those processes start with the setup, one
per set of cells that compile the same kernels (backend, dtype, arguments, environment), import while the
setup runs, and wait: the run tells each to go once its memory plan is made (``Warmup.fit`` keeps their
memory out of it, or skips them where they would take more than ``KERNEL_SHARE`` of the GPU) and its spec
built (``Warmup.go``: the cell's own engine arguments, one layer of random weights). ``run.json`` records
what each did (``kernel_warmup``).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from evalparity import backends, config, procs
from evalparity.cellenv import cell_environment
from evalparity.shapes import GiB, ModelShape
from evalparity.spec import CellSpec, RunSpec

MAX_KERNEL_WARMUPS = 4   # processes, at most: a run of many variants warms the first few sets of kernels
KERNEL_SHARE = 0.10      # of the GPU's memory, the kernel warm-ups together at most; more: none of them
PORT_ORDINALS = 1000     # the warm-ups' port ranges (config.job_port_base) start after the cells' (ordinals 0..)


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
class KernelWarmup:
    """One kernel warm-up process: the engine of ``cells[0]``, which compiles what all of ``cells`` need."""

    cells: list[CellSpec]
    proc: subprocess.Popen
    log_path: Path
    sent: str = ""  # "go", or "skip: why"; "" while it waits

    def tell(self, message: dict) -> None:
        """Send the one line it waits for, and close its input (a warm-up that ended already is left be)."""
        self.sent = "go" if "args" in message else f"skip: {message.get('skip')}"
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.close()
        except (OSError, ValueError):  # it ended (failed to import): its log says why
            pass

    def record(self) -> dict:
        """What it did, for run.json: its cells, what it was told, its last line and how it ended."""
        code = self.proc.poll()
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        said = next((ln for ln in reversed(lines) if ln.startswith("engine warm-up")), lines[-1] if lines else "")
        return {"cells": [c.name for c in self.cells], "sent": self.sent or "nothing (the run ended first)",
                "said": said[:300], "ended": "still running: stopped" if code is None else f"exit {code}",
                "log": str(self.log_path)}


@dataclass
class Warmup:
    """The warm-up processes of one run."""

    running: list[subprocess.Popen] = field(default_factory=list)
    kernels: list[KernelWarmup] = field(default_factory=list)
    shape: ModelShape | None = None  # the model's, once ``fit`` made room for the kernel warm-ups

    def fit(self, shape: ModelShape, max_length: int, gpu_total: int) -> int:
        """The GPU memory the kernel warm-ups will hold at most (what the memory plan must leave them), or 0
        after telling them all to skip: where together they would take more than ``KERNEL_SHARE`` of the GPU
        (a large model's one layer and embeddings), a warm-up costs more than the kernels it saves."""
        need = sum(backends.get(k.cells[0].backend).kernel_warmup_bytes(shape, k.cells[0].dtype, max_length)
                   for k in self.kernels if not k.sent)
        if need > KERNEL_SHARE * gpu_total:
            self.skip(f"{need / GiB:.1f} GiB for the warm-up engines is more than {KERNEL_SHARE:.0%} of the GPU")
            return 0
        self.shape = shape
        return need

    def go(self, spec: RunSpec, model_path: str, pending: set[str]) -> None:
        """Tell each kernel warm-up that waits to build its cells' engine (``kernel_warmup_args``), or to skip
        where none of its cells is left to run (a resumed run) or its backend cannot cut the model. Only
        after ``fit`` (the memory plan left them room): otherwise they were told to skip already."""
        for k in self.kernels:
            if k.sent:
                continue
            if self.shape is None:
                k.tell({"skip": "no memory plan made room for it"})
                continue
            if not any(c.name in pending for c in k.cells):
                k.tell({"skip": "its cells are done already"})
                continue
            args = backends.get(k.cells[0].backend).kernel_warmup_args(spec, k.cells[0], model_path, self.shape)
            k.tell({"args": args} if args is not None else {"skip": "the model's config.json has no layer count "
                                                                    "to cut"})

    def skip(self, why: str) -> None:
        """Tell every kernel warm-up that waits to end without building anything."""
        for k in self.kernels:
            if not k.sent:
                k.tell({"skip": why})

    def record(self) -> list[dict]:
        return [k.record() for k in self.kernels]

    def close(self) -> None:
        """Stop what is still running and forget what has ended (``procs``): at the end of the run."""
        self.skip("the run ended first")
        for proc in self.running + [k.proc for k in self.kernels]:
            procs.stop(proc, grace_s=2.0)  # waits for it and forgets it, ended or not
        self.running.clear()


def start(cell_specs: list[CellSpec], device: str, model_path: Path | str | None, *, true_fp32: bool,
          run_key: str) -> Warmup:
    """Start each of the cells' backends' cache warm-up for this model on this device (none on the CPU), and
    their kernel warm-ups (``start_kernels``), which wait to be told to go."""
    archs = architectures(model_path)
    warm = Warmup()
    if archs:
        log_path = config.cache_dir() / "warmup.log"
        for name in sorted({c.backend for c in cell_specs}):
            argv = getattr(backends.get(name), "warm_caches", lambda *_: None)(archs, device)
            if not argv:
                continue
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as log:
                warm.running.append(procs.popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log))
    start_kernels(warm, cell_specs, device, true_fp32, run_key)
    return warm


def kernel_groups(cell_specs: list[CellSpec], device: str) -> list[list[CellSpec]]:
    """The cells whose engines compile the same kernels, grouped (backend, dtype, TF32, arguments, environment),
    in the run's order; only cells of a backend with a kernel warm-up on this device, on the run's own model
    and interpreter (another vLLM's kernels are not this one's). ``MAX_KERNEL_WARMUPS`` groups at most."""
    groups: dict[tuple, list[CellSpec]] = {}
    for cell in cell_specs:
        argv = getattr(backends.get(cell.backend), "kernel_warmup_argv", lambda _d: None)(device)
        if not argv or cell.model or cell.python:
            continue
        key = (cell.backend, cell.dtype, cell.tf32, cell.args, cell.env)
        if key in groups or len(groups) < MAX_KERNEL_WARMUPS:
            groups.setdefault(key, []).append(cell)
    return list(groups.values())


def start_kernels(warm: Warmup, cell_specs: list[CellSpec], device: str, true_fp32: bool, run_key: str) -> None:
    """Start one kernel warm-up per group of cells (``kernel_groups``), each under its cells' environment and
    a port range of its own; they import, then wait for ``Warmup.go``. Offline: the model it gets is a local
    folder (the run's, resolved by then), and a hub that does not answer must not hold it up."""
    for i, group in enumerate(kernel_groups(cell_specs, device)):
        cell = group[0]
        backend = backends.get(cell.backend)
        env = os.environ | cell_environment(backend.process_environment(device, cell, true_fp32), True, cell) \
            | {config.PORT_BASE_ENV: str(config.job_port_base(run_key, PORT_ORDINALS + i))}
        log_path = config.cache_dir() / f"warmup-kernels-{i}.log"  # the cells' names are in run.json
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            proc = procs.popen(backend.kernel_warmup_argv(device), stdin=subprocess.PIPE, stdout=log, stderr=log,
                               env=env)
        warm.kernels.append(KernelWarmup(group, proc, log_path))
