"""``evalparity drift``: where the drift comes from, on identical token ids (``evalparity.drift``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from evalparity.cli.options import Device
from evalparity.cli.output import console
from evalparity.devices import resolve_device
from evalparity.errors import EXIT_CELL_FAILED, EvalParityError
from evalparity.files import read_json
from evalparity.models import resolve_model
from evalparity.spec import split_list


def drift(
    run_dir: Annotated[Path | None, typer.Option(help="Run directory: prompts come from its tasks, results go to RUN_DIR/drift and its report.")] = None,
    prompts: Annotated[Path | None, typer.Option(help="Prompt file instead: .txt (one a line) or .jsonl with a 'prompt' field.")] = None,
    model: Annotated[str | None, typer.Option(help="Local path or hub id (default: the run's model, else the embedded one).")] = None,
    cells: Annotated[str, typer.Option(help="Cells to probe, comma-separated.")] = "vllm-fp32,vllm-bf16,vllm-fp16,hf-bf16,hf-fp16",
    reference: Annotated[str, typer.Option(help="Reference cell.")] = "hf-fp32",
    n_prompts: Annotated[int, typer.Option(help="Prompts to take from the run.")] = 200,
    gen_tokens: Annotated[int, typer.Option(help="Greedy tokens to generate per prompt for the divergence test (0: off).")] = 32,
    threshold: Annotated[float, typer.Option(help="Relative error above which a layer counts as drifted.")] = 1e-3,
    max_length: Annotated[int, typer.Option(help="Longest prompt + generation, in tokens.")] = 2048,
    device: Device = "auto",
    out: Annotated[Path | None, typer.Option(help="Output folder (default: RUN_DIR/drift, or results/drift-<timestamp>).")] = None,
    dump: Annotated[bool, typer.Option(help="Also save every prompt's hidden states of both backends (large).")] = False,
) -> None:
    """Localise drift: per-token prompt logprobs, hidden states layer by layer, greedy-generation divergence."""
    from evalparity.drift import prompts_from_file, prompts_from_run, run_drift  # heavy: pandas, torch

    check_arguments(run_dir, prompts, n_prompts)
    if run_dir is not None and model is None:
        model = run_model(run_dir)
    dev = resolve_device(device)
    _, model_path, max_len = resolve_model(model, max_length)
    texts = prompts_from_run(run_dir, n_prompts) if run_dir is not None else prompts_from_file(prompts)[:n_prompts]
    dest = out or (run_dir / "drift" if run_dir is not None else Path("results") / f"drift-{time.strftime('%Y%m%d-%H%M%S')}")
    t0 = time.perf_counter()
    results = run_drift(str(model_path), texts, split_list(cells), dest, reference=reference, device=dev,
                        max_len=max_len, gen_tokens=gen_tokens, threshold=threshold, dump=dump, console=console)
    console.print(f"drift: {len(texts)} prompts, {len(results)} cell(s) in {time.perf_counter() - t0:.0f} s -> {dest}")
    for c, s in results.items():
        layers = s["layers"]
        console.print(f"  {c}: rel error layer 1 {layers[1]['rel_error']:.2e}, final {layers[-1]['rel_error']:.2e}, "
                      f"first over {threshold:g}: {s['first_layer_over_threshold']}, "
                      f"mean |Δ logprob| {s['prompt_logprobs']['abs_mean']:.2e}, "
                      f"tokenization mismatches {len(s['tokenization_mismatches'])}")
    if run_dir is not None and (run_dir / "stats" / "verdicts.json").exists():
        from evalparity.report import write_report  # heavy: pandas, jinja2, matplotlib

        console.print(f"report: {write_report(run_dir)['html']}")
    if len(results) < len([c for c in split_list(cells) if c != reference]):
        raise typer.Exit(EXIT_CELL_FAILED)


def check_arguments(run_dir: Path | None, prompts: Path | None, n_prompts: int) -> None:
    """What only the command line can get wrong, before a model loads: one source of prompts, and some."""
    if (run_dir is None) == (prompts is None):
        raise EvalParityError("give exactly one of --run-dir (prompts from a run) or --prompts FILE")
    if n_prompts < 1:
        raise EvalParityError(f"--n-prompts {n_prompts} must be at least 1")


def run_model(run_dir: Path) -> str | None:
    """The model a run's cells loaded (their ``model_path``), so that drift probes the model the verdicts are
    about; None when the folder holds no run (then the embedded model)."""
    if not (run_dir / "spec.json").exists():
        return None


    return next((m["model_path"] for p in sorted((run_dir / "cells").glob("*/cell.json"))
                 if isinstance((m := read_json(p) or {}).get("model_path"), str)), None)
