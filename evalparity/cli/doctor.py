"""``evalparity doctor``: what works on this machine (``evalparity.doctor``)."""

from __future__ import annotations

from typing import Annotated

import typer

from evalparity.cli.options import DatasetsDir
from evalparity.cli.output import console


def doctor(
    tasks: Annotated[str | None, typer.Option(help="Tasks to check data for, comma-separated.")] = None,
    datasets_dir: DatasetsDir = None,
    python: Annotated[list[str] | None, typer.Option(metavar="NAME=PATH", help="An interpreter that cells would run under (run's --python): checked for evalparity, lm-eval, torch and every backend. Repeatable.")] = None,
) -> None:
    """What works here: backends, device and dtypes, caches, data for tasks, other interpreters, and known
    snags with fixes."""
    from evalparity.doctor import diagnose  # a rare verb: its checks import the engines
    from evalparity.variants import parse_pythons

    raise typer.Exit(diagnose(console, tasks, datasets_dir, parse_pythons(python or [])))
