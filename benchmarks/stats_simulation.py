"""The simulation figures behind tests/test_stats_simulation.py, printed: false-alarm and false-equivalence
rates, and power against design, each over N simulated comparisons.

    python benchmarks/stats_simulation.py [--sims 2000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_stats_simulation import ALPHA, simulate, verdict_of  # noqa: E402

from evalparity.stats import paired, power, verdict  # noqa: E402


def rate(fn, sims: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    return sum(fn(rng) for _ in range(sims)) / sims


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sims", type=int, default=2000)
    s = ap.parse_args().sims
    se = (ALPHA * (1 - ALPHA) / s) ** 0.5
    print(f"{s} simulated comparisons each; α = {ALPHA} (Monte-Carlo SE at α: {se:.4f})")
    r = rate(lambda g: verdict_of(*simulate(g, 800, 0.03, 0.03))[0] == verdict.DIFFERENT, s, 1)
    print(f"  null (n=800, 6% discordant, Δ=0): false DIFFERENT rate {r:.4f}")
    r = rate(lambda g: verdict_of(*simulate(g, 3000, 0.02, 0.04))[0] == verdict.EQUIVALENT, s, 2)
    print(f"  Δ = 2 x margin (n=3000): false EQUIVALENT rate {r:.4f}")
    r = rate(lambda g: verdict_of(*simulate(g, 4000, 0.02, 0.03))[0] == verdict.EQUIVALENT, s, 3)
    print(f"  Δ = margin (n=4000): false EQUIVALENT rate {r:.4f}")
    r = rate(lambda g: verdict_of(*simulate(g, 400, 0.0, 0.01))[0] == verdict.EQUIVALENT, s, 4)
    print(f"  Δ = margin, rare discordance (n=400, 1%): false EQUIVALENT rate {r:.4f}")

    def t_tost(g):
        ref, cell = simulate(g, 400, 0.0, 0.01)
        return paired.paired_binary(ref, cell, equivalence="t").tost_pvalue < ALPHA
    print(f"  same, with the paired t-TOST instead of the score TOST: {rate(t_tost, s, 4):.4f}")
    n = power.n_for_equivalence(0.01, 0.04, power=0.8)
    r = rate(lambda g: verdict_of(*simulate(g, n, 0.02, 0.02))[0] == verdict.EQUIVALENT, s, 5)
    print(f"  designed equivalence power 0.80 at n={n} (ψ=4%, Δ=0): simulated {r:.4f}")
    mdd = power.minimum_detectable_difference(2000, 0.1)
    pb, pc = (0.1 - mdd) / 2, (0.1 + mdd) / 2
    r = rate(lambda g: paired.paired_binary(*simulate(g, 2000, pb, pc)).pvalue < ALPHA, s, 6)
    print(f"  McNemar at the minimum detectable difference {100 * mdd:.2f} pp (n=2000, ψ=10%): "
          f"simulated power {r:.4f}, exact {power.mcnemar_exact_power(2000, pb, pc):.4f}, designed 0.80")


if __name__ == "__main__":
    main()
