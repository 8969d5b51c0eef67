"""The variables a cell's process starts with, on top of its host's environment: one place for the cell
processes of a run (``matrix``), of a drift's sides and of ``evalparity hidden``'s workers (``drift.launch_plan``).

A leaf (no pandas, scipy or torch): ``evalparity hidden`` plans its worker's environment before anything
heavy is imported, so that its command starts the worker within a second (issue 28).
"""

from __future__ import annotations

from evalparity.backends import registry
from evalparity.config import AHEAD_ENV, KERNEL_WARMUP_ENV, kernel_warmup, score_ahead
from evalparity.spec import CellSpec


def cell_environment(backend_env: dict[str, str], offline: bool, cell: CellSpec | None = None) -> dict[str, str]:
    """The variables a cell process needs on top of its host's environment (which, on a cluster, is that
    host's own, not this one's), the plugin modules that register backends (``backends.registry``), and the
    cell's own (``env.VAR=`` of a ``--cell``: they win over the backend's, as the user asked)."""
    env = dict(backend_env) | registry.plugin_environment() | dict(cell.env if cell is not None else ())
    # the run's switches too (checked here first), so that a Ray cluster's hosts run as this one asked
    env.update({"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "TQDM_MININTERVAL": "1",
                AHEAD_ENV: score_ahead(), KERNEL_WARMUP_ENV: kernel_warmup()})
    if offline:
        env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    return env
