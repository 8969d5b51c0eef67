"""``evalparity hidden``: chosen layers' hidden states of a prompt file, batched (``evalparity.hidden``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from evalparity import config, rundir
from evalparity.cli.options import Device, at_least, parse_layers
from evalparity.cli.output import console, safe
from evalparity.devices import resolve_device
from evalparity.errors import EvalParityError
from evalparity.models import resolve_model
from evalparity.spec import SHORT_DTYPE, parse_backend, parse_dtype

POOLINGS = ("last", "mean")


def hidden(
    prompts: Annotated[Path, typer.Option(help="Prompt file: .txt (one a line) or .jsonl with a 'prompt' field (and an optional 'id').")],
    layers: Annotated[str, typer.Option(help="Hidden-state entries, comma-separated (0: embeddings; L: the final norm's output; -1: the last), or all.")],
    model: Annotated[str | None, typer.Option(help="Local path or hub id (default: the embedded model).")] = None,
    backend: Annotated[str, typer.Option(help="vllm or hf.")] = "vllm",
    dtype: Annotated[str, typer.Option(help="fp32, bf16 or fp16.")] = "bf16",
    pooling: Annotated[str, typer.Option(help="Each prompt's last token (last) or the mean over its tokens (mean).")] = "last",
    device: Device = "auto",
    max_length: Annotated[int, typer.Option(help="Longest prompt in tokens; longer ones are cut to their first N.")] = 2048,
    check: Annotated[int, typer.Option(help="Also compute the first N prompts with the other backend at the same dtype and record the difference (0: off).")] = 8,
    out: Annotated[Path | None, typer.Option(help="Output folder (default: results/hidden-<timestamp>).")] = None,
) -> None:
    """Hidden states of chosen layers for every prompt of a file: hidden.safetensors, prompts.parquet, hidden.json."""
    b, d, entries = check_arguments(prompts, layers, backend, dtype, pooling, check, max_length)
    from evalparity.drift import launch_plan
    from evalparity.hidden import cell_name, finished, other_backend, read_prompts, request_of, run_hidden

    texts, ids = read_prompts(prompts)
    dest = out or Path("results") / f"hidden-{time.strftime('%Y%m%d-%H%M%S')}"
    dev = resolve_device(device, cheap=True)  # no torch here: the worker imports it and checks CUDA
    model_id, model_path, max_len = resolve_model(model, max_length)
    request = request_of(model_path=str(model_path), backend=b, dtype=d, layers=entries, pooling=pooling,
                         max_len=max_len, check=check, device=dev, prompts=prompts)
    with rundir.acquire(dest, flag="--out"):
        done = finished(dest, request)
        if done is not None:
            console.print(f"hidden: {safe(dest)} already holds these hidden states ({done['n_prompts']:,} prompts, "
                          f"entries {','.join(map(str, done['entries']))}): nothing to do", soft_wrap=True)
            return
        cells = [cell_name(b, d)] + ([cell_name(other_backend(b), d)] if check else [])
        launch = launch_plan(str(model_path), cells, cells[0], device=dev, max_len=max_len)
        record = run_hidden(request, launch, texts, ids, dest, model_id=model_id, console=console)
    t = record["timings"]
    console.print(f"hidden: {record['n_prompts']:,} prompts ({record['n_unique']:,} distinct) x entries "
                  f"{','.join(map(str, record['entries']))} ({pooling} token{'s' if pooling == 'mean' else ''}) "
                  f"from {b} {SHORT_DTYPE[d]} on {record['device']}: load {t['load_s']:.1f} s, encode "
                  f"{t['encode_s']:.1f} s, forward {t['forward_s']:.1f} s ({record['prompts_per_s']:,.0f} prompts/s), "
                  f"write {t['write_s']:.1f} s -> {safe(dest)}", soft_wrap=True)
    c = record["check"]
    if not c.get("off"):
        parts = ", ".join(f"entry {x['entry']} rel {x['rel_error']:.2e} cos {x['cosine']:.6f}" for x in c["entries"])
        mism = f"; {c['tokenization_mismatches']} prompt(s) tokenised differently" if c["tokenization_mismatches"] else ""
        console.print(f"check: {c['backend']} {SHORT_DTYPE[d]} on the first {c['n_prompts']} prompt(s): {parts}{mism}",
                      soft_wrap=True)


def check_arguments(prompts: Path, layers: str, backend: str, dtype: str, pooling: str, check: int,
                    max_length: int) -> tuple[str, str, list[int] | None]:
    """What only the command line can get wrong, before anything loads: (backend, dtype, entries)."""
    if not prompts.is_file():
        raise EvalParityError(f"prompt file {prompts} does not exist: give a .txt (one prompt a line) or .jsonl file")
    entries = parse_layers(layers)
    b, d = parse_backend(backend), parse_dtype(dtype)
    if pooling not in POOLINGS:
        raise EvalParityError(f"--pooling {pooling!r} is not last or mean")
    at_least("--check", check, 0, "prompts computed with the other backend; 0 is off")
    at_least("--max-length", max_length, 1, "tokens")
    config.check_environment()
    return b, d, entries
