"""One drift cell in its own process: ``python -m evalparity.drift.worker DRIFT_DIR CELL``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from evalparity import backends
from evalparity.backends import precision
from evalparity.cells import ProgressFile
from evalparity.drift import parse_cell
from evalparity.drift.measure import DriftAccumulator
from evalparity.rundir import layout, records


class WithPrecision:
    """Both probes live in one process and torch's TF32 switches are global, so each probe sets its own
    precision mode before every call (a TF32 cell must not turn the fp32 reference into TF32)."""

    def __init__(self, probe, true_fp32: bool | None):
        self.probe, self.true_fp32 = probe, true_fp32
        self.tokenizer = probe.tokenizer

    def _set(self) -> None:
        if self.true_fp32 is not None:
            precision.apply(self.true_fp32)

    def run(self, ids):
        self._set()
        return self.probe.run(ids)

    def generate(self, ids, n):
        self._set()
        return self.probe.generate(ids, n)


def make_probe(backend: str, dtype: str, tf32: bool, spec: dict) -> WithPrecision:
    true_fp32 = (not tf32) if dtype == "float32" else None
    if true_fp32 is not None:
        precision.apply(true_fp32)
    probe = backends.get(backend).drift_probe(spec["model_path"], dtype, spec["max_len"], spec["device"])
    return WithPrecision(probe, true_fp32)


def main(argv: list[str]) -> int:
    out, cell = Path(argv[0]), argv[1]
    spec = json.loads(layout.drift_spec(out).read_text())
    prompts = json.loads(layout.drift_prompts(out).read_text())["prompts"]
    progress = ProgressFile(layout.drift_progress(out, cell))
    t0 = time.perf_counter()
    ref = make_probe(*parse_cell(spec["reference"]), spec)
    other = make_probe(*parse_cell(cell), spec)
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    dump = out / "dump" / cell if spec.get("dump") else None
    acc = probe_prompts(ref, other, prompts, spec["max_len"], spec["gen_tokens"], progress, dump)
    summary = acc.summary(spec["threshold"]) | {"cell": cell, "reference": spec["reference"], "load_s": load_s,
                                                "probe_s": time.perf_counter() - t1}
    records.write_drift_summary(out, records.DriftRecord.from_json(summary))
    layout.drift_progress(out, cell).unlink(missing_ok=True)
    return 0


def probe_prompts(ref, other, prompts: list[str], max_len: int, gen_tokens: int,
                  progress: ProgressFile | None = None, dump: Path | None = None) -> DriftAccumulator:
    """Compare two probes prompt by prompt. A prompt the two tokenizers split differently is recorded as a
    tokenization mismatch and not compared: different ids would make every later number meaningless.

    Only summaries are kept, unless ``dump`` names a folder: then every prompt's hidden states of both
    backends are saved there too (``<prompt>.npz``: ids, reference [L+1, T, H], cell [L+1, T, H])."""
    acc = DriftAccumulator()
    decode = ref.tokenizer.decode
    keep = max_len - gen_tokens
    for i, text in enumerate(prompts):
        ids = ref.tokenizer(text)["input_ids"][:keep]
        ids_other = other.tokenizer(text)["input_ids"][:keep]
        if ids != ids_other:
            pos = next((k for k, (a, b) in enumerate(zip(ids, ids_other)) if a != b), min(len(ids), len(ids_other)))
            acc.tokenization_mismatches.append({"prompt": i, "first_difference": pos, "reference_len": len(ids),
                                                "cell_len": len(ids_other), "text": text[:200]})
            continue
        if len(ids) < 2:
            continue
        a, b = ref.run(ids), other.run(ids)
        acc.add_prompt(i, ids, a, b, decode)
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(dump / f"{i}.npz", ids=np.asarray(ids), reference=torch.stack(a.hidden).numpy(),
                                cell=torch.stack(b.hidden).numpy())
        if gen_tokens:
            acc.add_generation(len(ids), ref.generate(ids, gen_tokens), other.generate(ids, gen_tokens))
        if progress is not None:
            progress.update(n=i + 1, total=len(prompts))
    return acc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
