"""The tamper fuzzer at length: thousands of damaged copies of a finished run and comparison folder, each
held to the invariant of ``tests/tamper.py`` (the untouched verdict and exit code, or a refusal (2) or
INCOMPLETE (5); no finished cell changed or deleted; nothing outside the run touched).

    python benchmarks/tamper_fuzz.py [N] [--seed S]

Prints a tally of outcomes by kind of damage and the rate; exits 1 at the first violation, naming the
mutations (they replay with ``tamper.apply``). CI runs the same invariant on about 60 examples
(``tests/test_tamper.py``).
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import tamper  # noqa: E402
from synthetic import make_lm_eval_dir, make_run  # noqa: E402


def build(base: Path) -> list[tuple[str, Path, tuple[int, str], Path]]:
    """(label, folder, its baseline (exit code, sign-off line), another folder of the same cell names)."""
    out = []
    runs = []
    for name, model, drifting in (("run", "synthetic", "vllm-fp32"), ("other", "another/model", "hf-bf16")):
        run = make_run(base / name, n_tasks=2, cells=["hf-fp32", "vllm-fp32", "hf-bf16"], docs_per_task=300,
                       drift={drifting: 0.6}, model=model)
        code, stdout, _ = tamper.run_cli(["report", str(run)])
        runs.append((run, (code, tamper.sign_off_line(stdout))))
    out.append(("run", runs[0][0], runs[0][1], runs[1][0]))
    comps = []
    for name, seeds, flips in (("comp", (0, 1, 2), (0, 0, 12)), ("comp2", (5, 6, 7), (0, 3, 0))):
        lm = [make_lm_eval_dir(base / f"lm-{name}" / n, dtype=d, flip=f, seed=s)
              for n, d, f, s in zip("abc", ("float32", "bfloat16", "float16"), flips, seeds)]
        comp = base / name
        tamper.run_cli(["compare", *map(str, lm), "--out", str(comp)])
        code, stdout, _ = tamper.run_cli(["report", str(comp)])
        comps.append((comp, (code, tamper.sign_off_line(stdout))))
    out.append(("compare", comps[0][0], comps[0][1], comps[1][0]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    base = Path(tempfile.mkdtemp(prefix="tamper-bench-"))
    targets = build(base)
    tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    t0 = time.perf_counter()
    for i in range(a.n):
        label, folder, baseline, other = targets[i % len(targets)]
        mutations = tamper.random_mutations(rng, rng.randint(1, 3))
        top = Path(tempfile.mkdtemp(prefix="case-", dir=base))
        run, outside = top / "run", top / "outside"
        shutil.copytree(folder, run, symlinks=True)
        outside.mkdir()
        (outside / "precious.txt").write_text("keep me")
        try:
            for m in mutations:
                tamper.apply(run, m, other, outside)
            outcome = tamper.check(run, baseline, mutations, outside)
        except AssertionError as err:
            print(f"VIOLATION after {i} cases ({label}): {err}")
            return 1
        finally:
            shutil.rmtree(top, ignore_errors=True)
        for name, _ in mutations:
            tally[name][outcome] += 1
        tally["(all)"][f"{label}: {outcome}"] += 1
        if (i + 1) % 100 == 0:
            print(f"{i + 1} cases, {time.perf_counter() - t0:.0f} s, no violation", flush=True)
    wall = time.perf_counter() - t0
    print(f"\n{a.n} damaged folders, seed {a.seed}, {wall:.0f} s ({a.n / wall:.1f} cases/s): no violation\n")
    print(f"{'damage':24} {'same verdict':>13} {'refused (2)':>12} {'incomplete (5)':>15}")
    for name in sorted(k for k in tally if k != "(all)"):
        c = tally[name]
        print(f"{name:24} {c['same verdict']:>13} {c['refused (2)']:>12} {c['incomplete (5)']:>15}")
    print()
    for k, v in sorted(tally["(all)"].items()):
        print(f"{k:30} {v}")
    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
