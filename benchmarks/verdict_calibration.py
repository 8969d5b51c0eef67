"""Exact operating characteristics of the verdict rule for one paired binary comparison, over a grid.

For discordance ψ in {0.5%, 1%, 5%, 20%}, n in {100, 300, 1000, 3000, 10000} and true Δ/m in {0, 0.5, 0.9,
1, 1.5, 2} (m = 1 pp, α = 0.05), every possible (ref-only, cell-only) table is enumerated
(``evalparity.stats.calibration``) and the probabilities of PASS (EQUIVALENT), FAIL (DIFFERENT), SHIFT and
INCONCLUSIVE are printed. Required: P(FAIL) ≤ α wherever |Δ| ≤ m, and P(EQUIVALENT) ≤ α wherever |Δ| ≥ m.
A design point with |Δ| > ψ is impossible (|Δ| ≤ ψ always) and shown as such.

A second grid puts the interval wide against the margin (margins of 0.1–1 pp at ψ up to 40 %), where both
beyond-margin claims are false at once inside the margin (``verdict.beyond_pvalue``). ``--planner`` prints
the planner's n for EQUIVALENT at 80 % and 90 % power beside the exact P(EQUIVALENT) at that n and the
smallest n whose exact P reaches the target (bisection on the exact P, which is saw-toothed in n).

Then a Monte-Carlo check of the family rule (10 and 60 comparisons, Holm) and of ``--cluster``.

    python benchmarks/verdict_calibration.py [--direction both|worse] [--mc 4000] [--planner] [--skip-mc]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from evalparity.stats import calibration, multiplicity, paired, power, verdict

ALPHA, MARGIN = 0.05, 0.01
PSIS = (0.005, 0.01, 0.05, 0.20)
NS = (100, 300, 1000, 3000, 10000)
RATIOS = (0.0, 0.5, 0.9, 1.0, 1.5, 2.0)


def grid(direction: str) -> bool:
    ok = True
    print(f"exact enumeration, one comparison, m = 1 pp, α = {ALPHA}, direction {direction}; true Δ = −ratio·m "
          "for 'worse' (a drop), +ratio·m otherwise")
    print(f"{'ψ':>6} {'n':>6} {'Δ/m':>5} | {'P(PASS)':>9} {'P(FAIL)':>9} {'P(SHIFT)':>9} {'P(INC)':>9} | check")
    worst_fail_inside, worst_eq_outside, fail_at_margin = 0.0, 0.0, []
    for psi in PSIS:
        for n in NS:
            for ratio in RATIOS:
                delta = ratio * MARGIN * (-1 if direction == "worse" else 1)
                if abs(delta) > psi + 1e-15:
                    print(f"{psi:6.3f} {n:6d} {ratio:5.1f} |   impossible: |Δ| > ψ")
                    continue
                p_b, p_c = (psi - delta) / 2, (psi + delta) / 2
                o = calibration.verdict_probabilities(n, p_b, p_c, margin=MARGIN, alpha=ALPHA, direction=direction)
                check = ""
                if ratio <= 1.0:
                    worst_fail_inside = max(worst_fail_inside, o.different)
                    if o.different > ALPHA:
                        check += " FAIL>α inside the margin!"
                if ratio == 1.0:
                    fail_at_margin.append((n, o.different))
                if ratio >= 1.0:
                    worst_eq_outside = max(worst_eq_outside, o.equivalent)
                    if o.equivalent > ALPHA:
                        check += " PASS>α beyond the margin!"
                ok &= not check
                print(f"{psi:6.3f} {n:6d} {ratio:5.1f} | {o.equivalent:9.4f} {o.different:9.4f} {o.shift:9.4f} "
                      f"{o.inconclusive:9.4f} | {check or 'ok'}" + (f" (skipped mass {o.skipped:.1e})"
                                                                   if o.skipped > 1e-9 else ""))
    print(f"worst P(FAIL) with |Δ| ≤ m: {worst_fail_inside:.4f}; worst P(PASS) with |Δ| ≥ m: {worst_eq_outside:.4f}")
    big = [p for n, p in fail_at_margin if n >= 1000]
    if big:
        print(f"P(FAIL) at Δ = m, n ≥ 1,000 (where Δ = m is possible): {min(big):.4f} … {max(big):.4f}")
    return ok


def wide(direction: str) -> bool:
    """The interval wide against the margin: small margins at large ψ. P(FAIL) ≤ α where |Δ| ≤ m."""
    if direction != "both":
        return True
    ok, worst = True, 0.0
    print(f"\nwide intervals: P(FAIL) at |Δ| ≤ m (Δ/m = 0, 0.5, 1), α = {ALPHA}")
    for psi in (0.05, 0.2, 0.4):
        for m in (0.001, 0.002, 0.005, 0.01):
            for n in (100, 300, 1000, 3000, 10000):
                row = [calibration.verdict_probabilities(n, (psi - r * m) / 2, (psi + r * m) / 2, margin=m,
                                                         alpha=ALPHA).different for r in (0.0, 0.5, 1.0)]
                worst = max(worst, *row)
                bad = max(row) > ALPHA
                ok &= not bad
                print(f"  ψ = {psi:5.1%}, m = {100 * m:.1f} pp, n = {n:6,}: " + " ".join(f"{x:.4f}" for x in row)
                      + (" FAIL>α!" if bad else ""))
    print(f"worst P(FAIL) with |Δ| ≤ m, wide intervals: {worst:.4f}")
    return ok


def exact_eq(n: int, psi: float, m: float) -> float:
    return calibration.verdict_probabilities(int(n), psi / 2, psi / 2, margin=m, alpha=ALPHA).equivalent


def planner() -> bool:
    """The planner's n (Δ = 0) against the exact rule: P(EQUIVALENT) at that n must reach the target."""
    ok = True
    print(f"\nplanner: n for EQUIVALENT at Δ = 0 against exact enumeration, α = {ALPHA}")
    print(f"{'ψ':>6} {'m':>6} {'power':>5} | {'planner n':>10} {'exact P':>8} | {'exact n':>9} {'planner/exact':>13}")
    for m in (0.005, 0.01, 0.02, 0.05):
        for psi in (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4):
            for target in (0.8, 0.9):
                n = power.n_for_equivalence(m, psi, alpha=ALPHA, power=target)
                if n > 200_000:
                    print(f"{psi:6.3f} {100 * m:4.1f}pp {target:5.1f} | {n:10,} (not enumerated: > 200,000 docs)")
                    continue
                p = exact_eq(n, psi, m)
                lo, hi = max(1, n // 4), n
                while exact_eq(lo, psi, m) >= target and lo > 1:
                    lo //= 2
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if exact_eq(mid, psi, m) >= target else (mid, hi)
                bad = p < target
                ok &= not bad
                print(f"{psi:6.3f} {100 * m:4.1f}pp {target:5.1f} | {n:10,} {p:8.4f} | {hi:9,} {n / hi:13.3f}"
                      + (" below target!" if bad else ""), flush=True)
    return ok


def simulate_tables(rng, sims: int, n: int, p_b: np.ndarray, p_c: np.ndarray):
    """(sims, K) multinomial tables for K comparisons with rates p_b, p_c."""
    k = len(p_b)
    b = np.empty((sims, k), int)
    c = np.empty((sims, k), int)
    for j in range(k):
        draws = rng.multinomial(n, [p_b[j], p_c[j], 1 - p_b[j] - p_c[j]], size=sims)
        b[:, j], c[:, j] = draws[:, 0], draws[:, 1]
    return b, c


def family(sims: int) -> bool:
    """The sign-off over K comparisons: P(FAIL) when every |Δ| ≤ m (family-wise error of DIFFERENT), and
    P(PASS) when one comparison sits on the margin and the rest are 0 (intersection-union)."""
    rng = np.random.default_rng(1)
    ok = True
    print(f"\nfamily rule (Holm over the beyond-margin p-values; PASS needs all EQUIVALENT), {sims:,} runs each")
    for k in (10, 60):
        for label, deltas, n, psi in (("all Δ = m (worst case for FAIL)", np.full(k, MARGIN), 3000, 0.05),
                                      ("all Δ = 0.9·m", np.full(k, 0.9 * MARGIN), 3000, 0.05),
                                      ("one Δ = m, others 0", np.r_[MARGIN, np.zeros(k - 1)], 10000, 0.02)):
            p_b, p_c = (psi - deltas) / 2, (psi + deltas) / 2
            b, c = simulate_tables(rng, sims, n, p_b, p_c)
            p_eq, p_beyond, p_shift = paired.binary_tests(b, c, n, MARGIN)
            fail = pass_ = 0
            for s in range(sims):
                thr = multiplicity.rejection_thresholds(p_beyond[s], ALPHA, "holm")
                v = verdict.classify(p_eq[s], np.isfinite(thr), np.zeros(k, bool), ALPHA)
                status = verdict.sign_off(v)[0]
                fail += status == verdict.FAIL
                pass_ += status == verdict.PASS
            se = np.sqrt(ALPHA * (1 - ALPHA) / sims)
            check = ""
            if "one Δ = m" in label and pass_ / sims > ALPHA + 3 * se:
                check = " PASS>α!"
            if "one Δ = m" not in label and fail / sims > ALPHA + 3 * se:
                check = " FAIL>α!"
            ok &= not check
            print(f"  K = {k:2d}, n = {n:,}, ψ = {psi:.0%}, {label}: P(FAIL) = {fail / sims:.4f}, "
                  f"P(PASS) = {pass_ / sims:.4f} (MC se {se:.4f}) {check or 'ok'}")
    return ok


def cluster(sims: int) -> bool:
    """``--cluster``: 57 subjects of unequal size whose discordance and Δ vary by subject; overall Δ on the
    margin (P(EQUIVALENT) must be ≤ α) and at 0.9·m (P(DIFFERENT) ≤ α); the Wald cluster-robust TOST beside."""
    from scipy import stats as sps

    from evalparity.stats import inference

    rng = np.random.default_rng(2)
    ok = True
    g = 57
    sizes = rng.integers(20, 300, g)
    labels = np.repeat(np.arange(g), sizes)
    # The review's design: small subjects and discordance on the margin (ψ = m, every discordant doc one way).
    small = np.repeat(np.arange(30), 10)
    hits = 0
    for _ in range(sims * 2):
        d = np.where(rng.random(small.size) < MARGIN, 1.0, 0.0)
        c = int(d.sum())
        inf = inference.StricterOf(inference.cluster_inference(d, small), inference.binary_inference(0, c, d.size))
        hits += verdict.tests(inf, verdict.Margin.around_zero(MARGIN)).p_equivalence < ALPHA
    se_mc = np.sqrt(ALPHA * (1 - ALPHA) / (sims * 2))
    bad = hits / (sims * 2) > ALPHA + 3 * se_mc
    ok &= not bad
    print(f"\n--cluster, 30 subjects × 10 docs, Δ = ψ = m: P(EQUIVALENT) = {hits / (sims * 2):.4f} "
          f"(MC se {se_mc:.4f}; the exact zero-discordance part alone is 0.99^300 = {0.99 ** 300:.4f}) "
          f"{'FAIL!' if bad else 'ok'}")
    print(f"--cluster: {g} clusters, {sizes.sum():,} docs, cluster-level random discordance and Δ; "
          f"{sims:,} runs each")
    for target, what in ((MARGIN, "Δ = m: P(EQUIVALENT)"), (0.9 * MARGIN, "Δ = 0.9·m: P(DIFFERENT)"),
                         (-MARGIN, "Δ = −m: P(EQUIVALENT)")):
        for psi in (0.015, 0.02, 0.08):
            hits = wald = 0
            for _ in range(sims):
                psi_g = np.clip(rng.gamma(4, psi / 4, g), 0.002, 0.9)
                # Each subject's Δ_g = ψ_g ρ_g, with ρ_g varying by subject, scaled so that the docs' mean Δ
                # is exactly the target (|ρ_g| ≤ 1 keeps every subject's rates valid).
                rho = np.clip(rng.normal(0.0, 0.3, g) + np.sign(target), -1, 1)
                rho *= target * sizes.sum() / np.sum(sizes * psi_g * rho)
                if np.any(np.abs(rho) > 1):
                    rho = np.full(g, target * sizes.sum() / np.sum(sizes * psi_g))
                dg = psi_g * rho
                assert abs(np.sum(dg * sizes) / sizes.sum() - target) < 1e-12 and np.all(np.abs(dg) <= psi_g)
                p_c = np.repeat((psi_g + dg) / 2, sizes)
                p_b = np.repeat((psi_g - dg) / 2, sizes)
                u = rng.random(labels.size)
                d = np.where(u < p_b, -1.0, np.where(u < p_b + p_c, 1.0, 0.0))
                b, c = int(np.sum(d < 0)), int(np.sum(d > 0))
                inf = inference.StricterOf(inference.cluster_inference(d, labels),  # what --cluster uses
                                           inference.binary_inference(b, c, d.size))
                m = verdict.Margin.around_zero(MARGIN)
                t = verdict.tests(inf, m)
                if "EQUIVALENT" in what:
                    hits += t.p_equivalence < ALPHA
                    se = paired._cluster_robust_se(d, labels)
                    tt = sps.t(df=g - 1)
                    wald += max(tt.sf((d.mean() + MARGIN) / se), tt.cdf((d.mean() - MARGIN) / se)) < ALPHA
                else:
                    hits += t.p_beyond < ALPHA
            se_mc = np.sqrt(ALPHA * (1 - ALPHA) / sims)
            bad = hits / sims > ALPHA + 3 * se_mc
            ok &= not bad
            extra = f", Wald cluster-robust TOST {wald / sims:.4f}" if "EQUIVALENT" in what else ""
            print(f"  ψ ≈ {psi:.1%}, {what} = {hits / sims:.4f}{extra} (MC se {se_mc:.4f}) {'FAIL!' if bad else 'ok'}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--direction", default="both", choices=("both", "worse"))
    ap.add_argument("--mc", type=int, default=2000, help="Monte-Carlo runs per family/cluster setting")
    ap.add_argument("--skip-mc", action="store_true")
    ap.add_argument("--planner", action="store_true", help="also the planner's n against exact enumeration")
    a = ap.parse_args()
    t0 = time.perf_counter()
    ok = grid(a.direction)
    ok &= wide(a.direction)
    if a.planner:
        ok &= planner()
    if not a.skip_mc:
        ok &= family(a.mc)
        ok &= cluster(a.mc // 4)
    print(f"\nall requirements met: {ok} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
