"""``evalparity drift``: where the drift comes from, on identical token ids (``evalparity.drift``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from evalparity import config, rundir
from evalparity import mps as mps_mod
from evalparity.cli.options import Device, at_least, parse_layers, positive_finite
from evalparity.cli.output import console, safe
from evalparity.config import DRIFT, REPORT, STATS
from evalparity.data import embedded
from evalparity.devices import resolve_device
from evalparity.errors import EXIT_CELL_FAILED, EvalParityError
from evalparity.models import resolve_model
from evalparity.printable import visible
from evalparity.rundir import layout, records
from evalparity.spec import split_list
from evalparity.stats.options import StatsOptions

DEFAULT_CELLS = "vllm-fp32,vllm-bf16,vllm-fp16,hf-bf16,hf-fp16"


def drift(
    run_dir: Annotated[Path | None, typer.Option(help="Run directory: prompts come from its tasks, results go to RUN_DIR/drift and its report.")] = None,
    prompts: Annotated[Path | None, typer.Option(help="Prompt file instead: .txt (one a line) or .jsonl with a 'prompt' field.")] = None,
    model: Annotated[str | None, typer.Option(help="Local path or hub id (default: the run's model; with --prompts, the embedded one).")] = None,
    cells: Annotated[str | None, typer.Option(help=f"Cells to probe, comma-separated (default: the run's cells; with --prompts, {DEFAULT_CELLS}).")] = None,
    reference: Annotated[str, typer.Option(help="Reference cell.")] = "hf-fp32",
    n_prompts: Annotated[int, typer.Option(help="Prompts to take from the run.")] = 200,
    gen_tokens: Annotated[int, typer.Option(help="Greedy tokens to generate per prompt for the divergence test (0: off).")] = 32,
    threshold: Annotated[float, typer.Option(help="Relative error above which a layer counts as drifted.")] = 1e-3,
    max_length: Annotated[int, typer.Option(help="Longest prompt + generation, in tokens.")] = 2048,
    device: Device = "auto",
    out: Annotated[Path | None, typer.Option(help="Output folder (default: RUN_DIR/drift, published with its report; or results/drift-<timestamp>). Given with --run-dir, the run is only read.")] = None,
    layers: Annotated[str, typer.Option(help="Hidden-state entries to compare, comma-separated (0: embeddings; -1: the final norm's output), or all.")] = "all",
    positions: Annotated[str, typer.Option(help="Compare hidden states at every token (all) or only each prompt's last token (last).")] = "all",
    dump: Annotated[bool, typer.Option(help="Also keep both sides' hidden states, chunk by chunk as safetensors (large).")] = False,
    mps: Annotated[str, typer.Option(help="Cells probed together share their GPU through a CUDA MPS server of this command's own: auto, on or off (as evalparity run --mps).")] = "auto",
) -> None:
    """Localise drift: per-token prompt logprobs, hidden states layer by layer, greedy-generation divergence."""
    from evalparity import drift as probe_drift  # heavy: torch, pandas

    check_arguments(run_dir, prompts, n_prompts, gen_tokens=gen_tokens, threshold=threshold, max_length=max_length)
    mps_mod.check_choice(mps)
    entries = parse_layers(layers)
    if positions not in ("all", "last"):
        raise EvalParityError(f"--positions {positions!r} is not all or last")
    run_spec = None
    if run_dir is not None:
        check_is_run(run_dir)
    # The folder drift writes into is locked before anything loads: the run's (drift/ and its report), or a
    # folder of its own (--out, or without a run), the run then only read.
    into = run_dir is not None and out is None
    dest = layout.drift_dir(run_dir) if into else out or Path("results") / f"drift-{time.strftime('%Y%m%d-%H%M%S')}"
    lock = rundir.acquire(run_dir, create=False, flag="--run-dir") if into else rundir.acquire(dest, flag="--out")
    with lock:
        if not into:
            probe_drift.check_out(dest)
        # the statistics drift will recompute before it re-renders the run's report: a record that cannot be
        # read back is refused before anything loads
        if into:
            rundir.recover_outputs(run_dir)  # a report killed while publishing: finished first, as report does
        found = recorded_statistics(run_dir) if into else None
        if run_dir is not None:
            model = model or run_model(run_dir)
            run_spec = records.read_spec(run_dir)
            dev = run_device(run_spec, device)
        else:
            dev = resolve_device(device)
        _, model_path, max_len = resolve_model(model, max_length)
        if run_spec is not None:
            max_len = min(max_len, run_spec.alignment.max_length)
        texts = (probe_drift.prompts_from_run(run_dir, n_prompts) if run_dir is not None
                 else probe_drift.prompts_from_file(prompts)[:n_prompts])
        todo = split_list(cells) if cells else ([c.name for c in run_spec.cells if not c.tag] if run_spec
                                                 else split_list(DEFAULT_CELLS))
        launch = probe_drift.launch_plan(str(model_path), todo, reference, device=dev, max_len=max_len,
                                         run_spec=run_spec)
        together = probe_drift.together_ok(run_spec, [c for c in launch if c != reference])
        reference_too = probe_drift.together_ok(run_spec, list(launch))  # the run packed the reference with them
        t0 = time.perf_counter()

        def probe(folder: Path, shown: Path) -> dict[str, dict]:
            return probe_drift.run_drift(launch, texts, folder, reference=reference, max_len=max_len,
                                         gen_tokens=gen_tokens, threshold=threshold, layers=entries, pooling=positions,
                                         dump=dump, together=together, console=console, shown=shown,
                                         mps_choice=mps, reference_too=reference_too)

        results, html = into_run(run_dir, probe, found) if into else (probe(dest, dest), None)
    console.print(f"drift: {len(texts)} prompts, {len(results)} cell(s) in {time.perf_counter() - t0:.0f} s -> {safe(dest)}")
    for c, s in results.items():
        ls = s["layers"]
        console.print(f"  {c}: rel error entry {ls[0]['layer']} {ls[0]['rel_error']:.2e}, entry {ls[-1]['layer']} "
                      f"{ls[-1]['rel_error']:.2e}, first over {threshold:g}: {s['first_layer_over_threshold']}, "
                      f"mean |Δ logprob| {s['prompt_logprobs']['abs_mean']:.2e}, "
                      f"tokenization mismatches {len(s['tokenization_mismatches'])}; load {s['load_s']:.1f} s, "
                      f"probe {s['probe_s']:.1f} s, generate {s['generate_s']:.1f} s")
    if run_dir is not None:
        for line in probe_drift.engine_warnings(run_dir, results):
            console.print(f"[yellow]warning:[/yellow] {safe(line)}")
    if html is not None:
        console.print(f"report: {safe(html)}")
    if len(results) < len([c for c in launch if c != reference]):
        raise typer.Exit(EXIT_CELL_FAILED)


def run_device(spec, device: str) -> str:
    """The device a run's cells ran on: drift probes them there. Another --device is refused."""
    if device != "auto" and resolve_device(device).split(":")[0] != spec.device.split(":")[0]:
        raise EvalParityError(f"--device {device}: the run's cells ran on {spec.device}, and drift probes them as "
                              f"they ran; drop --device or pass --device {spec.device}")
    return spec.device


def into_run(run_dir: Path, probe,
             found: tuple[StatsOptions, object] | None) -> tuple[dict[str, dict], Path | None]:
    """Drift into ``run_dir/drift`` and, when the run has its statistics, its statistics and report again, all
    written into a staging folder and swapped in together (``rundir.staged_outputs``, as ``report`` does): a
    kill or an error midway leaves the previous drift/, stats/ and report/ whole. Call it holding the run's
    lock. Returns the results and the report's path (None when the run has no statistics yet: ``report``
    writes them later). ``found``: ``recorded_statistics(run_dir)``, read by the caller before anything loads.

    The statistics are recomputed from the run's verified tables (``compute``, as ``report`` does) with the
    options its ``verdicts.json`` records (the last ones asked for), before any model loads: the report
    drift publishes shows no verdict that the tables do not give. Before, it re-rendered ``stats/`` as found,
    so a hand-edited ``verdicts.json`` reached the report. A recomputed sign-off that differs from the one
    found is said in a warning line."""
    from evalparity.report import write_report  # heavy: pandas, jinja2, matplotlib
    from evalparity.stats.compare import compute  # heavy: pandas, scipy, statsmodels

    names = (DRIFT, STATS, REPORT) if found else (DRIFT,)
    staged = ""
    try:
        with rundir.staged_outputs(run_dir, names) as stage:
            staged = str(stage)
            if found:
                opts, said = found
                try:
                    now = compute(stage, opts, source=run_dir).sign_off
                except EvalParityError as err:  # its fixes name report's flags: said as what report would say
                    raise EvalParityError(f"the statistics {layout.verdicts_file(run_dir)} records cannot be "
                                          f"recomputed ({err}): {report_first(run_dir)}", err.exit_code) from None
                if now != said:
                    console.print(f"[yellow]warning:[/yellow] {safe(layout.verdicts_file(run_dir))} said "
                                  f"{safe(said)}; the run's tables give {now} under its recorded options: the "
                                  "statistics and report are recomputed")
            results = probe(layout.drift_dir(stage), layout.drift_dir(run_dir))
            html = run_dir / Path(write_report(stage)["html"]).relative_to(stage) if found else None
    except EvalParityError as err:  # messages name the run directory, not the staging folder
        raise EvalParityError(str(err).replace(staged, str(run_dir)) if staged else str(err), err.exit_code) from None
    except OSError as err:
        raise EvalParityError(f"could not write the drift results into {run_dir} ({err.strerror or err}): free "
                              "space or make it writable, then rerun (the previous drift/, stats/ and report/ "
                              "are unchanged)") from None
    return results, html


def report_first(run_dir: Path) -> str:
    """The fix for a run whose recorded statistics drift cannot take: ``report`` writes them again."""
    return f"rerun `evalparity report {run_dir}` with your statistics options, then drift"


def recorded_statistics(run_dir: Path) -> tuple[StatsOptions, object] | None:
    """The statistics options and the sign-off status that the run's ``verdicts.json`` records, checked as
    ``report`` checks its command line (``StatsOptions.from_dict``; the pairs against the run's cells); None
    when the run has none yet. Call it holding the run's lock, after ``rundir.recover_outputs`` (a ``report``
    killed while publishing is finished first, so these are the last options asked for). Anything else is
    refused in one line naming ``report`` as the fix, before any model loads."""
    from evalparity import signoff
    from evalparity.files import read_json
    from evalparity.stats.record import SCHEMA

    path = layout.verdicts_file(run_dir)
    if not path.exists():
        return None
    fix = report_first(run_dir)
    record = read_json(path)
    if not isinstance(record, dict):
        raise EvalParityError(f"{path} is not a verdicts record: {fix}")
    if record.get("schema") != SCHEMA:
        raise EvalParityError(f"{path} was written by another evalparity (schema {str(record.get('schema'))[:40]!r}, "
                              f"not {SCHEMA}): {fix}")
    try:
        opts = StatsOptions.from_dict(record.get("options"))
        cells = signoff.run_cells(run_dir)
        if opts.reference not in cells:
            raise EvalParityError(f"options.reference {opts.reference[:40]!r} is not a cell of the run "
                                  f"({', '.join(cells)})")
        signoff.check_pairs(opts, cells)
    except EvalParityError as err:
        raise EvalParityError(f"{path} records statistics options that `evalparity report` would refuse ({err}): "
                              f"{fix}") from None
    said = record.get("sign_off", {}).get("status") if isinstance(record.get("sign_off"), dict) else None
    return opts, said


def check_arguments(run_dir: Path | None, prompts: Path | None, n_prompts: int, *, gen_tokens: int = 0,
                    threshold: float = 1e-3, max_length: int = 2048) -> None:
    """What only the command line can get wrong, before a model loads: one source of prompts, and some;
    numbers in range; the ``EVALPARITY_*`` switches."""
    if (run_dir is None) == (prompts is None):
        raise EvalParityError("give exactly one of --run-dir (prompts from a run) or --prompts FILE")
    if n_prompts < 1:
        raise EvalParityError(f"--n-prompts {n_prompts} must be at least 1")
    at_least("--gen-tokens", gen_tokens, 0, "tokens; 0 is off")
    at_least("--max-length", max_length, 1, "tokens of prompt and generation")
    positive_finite("--threshold", threshold, "1e-3")
    config.check_environment()


def check_is_run(run_dir: Path) -> None:
    """Drift's results belong beside the verdicts of the model they probe. A folder that is not an
    ``evalparity run`` (a comparison of lm-eval outputs, or no run at all) names no model: refused, where the
    embedded model used to be probed in its place and added to that folder's report."""
    if not layout.spec_file(run_dir).is_file():
        what = ("a comparison of lm-eval outputs (compare.json), which names no model" if layout.compare_file(run_dir).is_file()
                else "not a run directory of `evalparity run` (no spec.json)")
        raise EvalParityError(f"--run-dir {run_dir} is {what}: there is no model to probe; pass --model and "
                              "--prompts instead")


def run_model(run_dir: Path) -> str | None:
    """The model a run's verified cells loaded (their ``model_path``), else the one its spec names, so that
    drift probes the model the verdicts are about; None for the embedded model, which ``resolve_model``
    prepares and verifies against its pin (a run none of whose cells has finished names it only by its id,
    and a finished cell's folder is in the cache of the machine that ran it); a run that does not verify
    (``records.verify_run``) is refused like ``report`` refuses it, and so is one whose embedded model is not
    this evalparity's."""
    run = records.verify_run(run_dir)
    if run.model == embedded.MODEL_ID:
        return None
    if isinstance(run.model, str) and embedded.EMBEDDED_MARK in run.model:
        raise EvalParityError(f"this run used the embedded model {visible(run.model)}, and this evalparity embeds "
                              f"{embedded.MODEL_ID}: pass --model with the run's model folder")
    # a cell with model= scored another checkpoint: the run's model is the plain cells' (spec.CellSpec.model)
    found = next((p for r in run.cells.values()
                  if isinstance(p := r.extra.get("model_path"), str) and not r.variant.get("model")), None)
    spec_model = run.model
    if found is None and not isinstance(spec_model, str):
        raise EvalParityError(f"{layout.spec_file(run_dir)} names no model and no cell of the run recorded one: pass "
                              "--model")
    return found or spec_model
