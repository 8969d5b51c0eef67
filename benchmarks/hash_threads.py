"""A model's first fingerprint (``rundir.model_fingerprint``): its files hashed one after another against side
by side (``files.HashCache.sha256_all``, up to ``files.HASH_THREADS`` threads).

Each measurement starts from an empty hash cache (its own ``$EVALPARITY_CACHE``), so every file is read and
hashed; the files are read once beforehand, so that both modes read from the page cache (a model just
written or just downloaded is there too). Prints seconds and GB/s per mode, and checks that both modes give
the same fingerprint.

    python benchmarks/hash_threads.py                       # 6 files of 512 MiB made in a temporary folder
    python benchmarks/hash_threads.py --files 4 --mib 1024
    python benchmarks/hash_threads.py --model /tmp/m14b     # an existing model folder (its *.safetensors)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def measure(model: Path, threads: int, repeat: int) -> tuple[list[float], str]:
    from evalparity import config, files
    from evalparity.rundir.fingerprint import model_fingerprint

    times, digest = [], ""
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as cache:
            os.environ[config.CACHE_ENV] = cache
            files.HASH_THREADS = threads
            t0 = time.perf_counter()
            digest = model_fingerprint(model, str(model))["digest"]
            times.append(time.perf_counter() - t0)
    return times, digest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, help="a model folder; default: random files in a temporary folder")
    ap.add_argument("--files", type=int, default=6)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if model is None:
            model = Path(tmp) / "m"
            model.mkdir()
            (model / "config.json").write_text("{}")
            block = os.urandom(1 << 20)
            for i in range(a.files):
                with open(model / f"model-{i:05d}.safetensors", "wb") as f:
                    for _ in range(a.mib):
                        f.write(block)
        weights = sorted(model.glob("*.safetensors"))
        total = sum(p.stat().st_size for p in weights)
        for p in weights:  # into the page cache, for both modes alike
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass
        print(f"{len(weights)} weight file(s), {total / 2**30:.2f} GiB, {os.cpu_count()} CPU(s)")
        from evalparity import files

        digests = {}
        for threads in (1, files.HASH_THREADS):
            times, digests[threads] = measure(model, threads, a.repeat)
            med = statistics.median(times)
            print(f"  {threads} thread(s): median {med:.2f} s of {a.repeat} ({', '.join(f'{t:.2f}' for t in times)}), "
                  f"{total / med / 1e9:.2f} GB/s")
        print("same fingerprint:", len(set(digests.values())) == 1)


if __name__ == "__main__":
    main()
