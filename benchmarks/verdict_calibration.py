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

``--staged`` runs instead the staged (group-sequential) rule (``evalparity.stats.sequential``): exact DP over
the looks at ψ in {0.2 … 40 %}, N in {1,000 … 30,000}, Δ/m in {0 … 2} (m = 1 pp, and other margins), the
looks of ``sequential.schedule(N)``; P(PASS), P(FAIL), P(unsettled) and E[docs] per point, the checks
P(FAIL | |Δ| ≤ m) ≤ α and P(PASS | |Δ| ≥ m) ≤ α, E[docs] at Δ = 0 against the single-look rule at equal
power, and a Monte Carlo of the family rule (Holm on stage-adjusted p-values, ``sequential.settle``).

    python benchmarks/verdict_calibration.py [--direction both|worse] [--mc 4000] [--planner] [--skip-mc]
    python benchmarks/verdict_calibration.py --staged [--mc 2000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from evalparity.stats import calibration, multiplicity, paired, power, sequential, verdict

ALPHA, MARGIN = 0.05, 0.01
PSIS = (0.005, 0.01, 0.05, 0.20)
NS = (100, 300, 1000, 3000, 10000)
RATIOS = (0.0, 0.5, 0.9, 1.0, 1.5, 2.0)


def mc_check(label: str, fail: int, pass_: int, sims: int) -> tuple[float, str]:
    """(Monte-Carlo standard error at α, a flag when the error that should be held under α exceeds it by
    three of them): P(PASS) for designs with one Δ on the margin, P(FAIL) for the others."""
    se = float(np.sqrt(ALPHA * (1 - ALPHA) / sims))
    check = ""
    if "one Δ = m" in label and pass_ / sims > ALPHA + 3 * se:
        check = " PASS>α!"
    if "one Δ = m" not in label and fail / sims > ALPHA + 3 * se:
        check = " FAIL>α!"
    return se, check

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
            se, check = mc_check(label, fail, pass_, sims)
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


# ---------------------------------------------------------------- --staged
STAGED_PSIS = (0.002, 0.005, 0.01, 0.05, 0.20, 0.40)
STAGED_NS = (1000, 3000, 10000, 30000)


def staged_point(n_total: int, psi: float, delta: float, m: float):
    design = sequential.StagedDesign.for_task(n_total, alpha=ALPHA)
    return sequential.staged_probabilities(design, (psi - delta) / 2, (psi + delta) / 2, margin=m)


def staged_grid() -> bool:
    """The staged rule on the single-look grid (m = 1 pp): every point exact."""
    ok, worst_fail, worst_pass = True, (0.0, ""), (0.0, "")
    print(f"staged rule, exact DP over the looks, one comparison, m = 1 pp, α = {ALPHA}, O'Brien–Fleming-like "
          "spending, looks sequential.schedule(N)")
    for n_total in STAGED_NS:
        d = sequential.StagedDesign.for_task(n_total, alpha=ALPHA)
        print(f"  N = {n_total:,}: looks {', '.join(f'{x:,}' for x in d.looks)}; α_k "
              + ", ".join(f"{x:.2g}" for x in d.levels))
    print(f"{'ψ':>6} {'N':>6} {'Δ/m':>5} | {'P(PASS)':>9} {'P(FAIL)':>9} {'P(unset)':>9} {'E[docs]':>8} | check")
    for psi in STAGED_PSIS:
        for n_total in STAGED_NS:
            for ratio in RATIOS:
                delta = ratio * MARGIN
                if delta > psi + 1e-15:
                    continue
                o = staged_point(n_total, psi, delta, MARGIN)
                check, where = "", f"ψ {psi:.1%}, N {n_total:,}, Δ/m {ratio}"
                if ratio <= 1.0:
                    worst_fail = max(worst_fail, (o.different, where))
                    check += " FAIL>α inside the margin!" if o.different > ALPHA else ""
                if ratio >= 1.0:
                    worst_pass = max(worst_pass, (o.equivalent, where))
                    check += " PASS>α beyond the margin!" if o.equivalent > ALPHA else ""
                ok &= not check
                print(f"{psi:6.3f} {n_total:6d} {ratio:5.1f} | {o.equivalent:9.4f} {o.different:9.4f} "
                      f"{o.unsettled:9.4f} {o.expected_docs:8.0f} | {check or 'ok'}"
                      + (f" (skipped mass {o.skipped:.1e})" if o.skipped > 1e-9 else ""), flush=True)
    print(f"worst P(FAIL) with |Δ| ≤ m: {worst_fail[0]:.4f} ({worst_fail[1]}); worst P(PASS) with |Δ| ≥ m: "
          f"{worst_pass[0]:.4f} ({worst_pass[1]}); points with |Δ| > ψ are impossible and left out")
    return ok


def staged_margins() -> bool:
    """Other margins: narrow against ψ (wide intervals, the far-end tail) and wide (few discordant docs)."""
    ok, worst_fail, worst_pass = True, (0.0, ""), (0.0, "")
    print(f"\nstaged rule, other margins: P(FAIL) at Δ/m = 0, 0.5, 0.9, 1 | P(PASS) at Δ/m = 1, 1.5, α = {ALPHA}")
    for m in (0.001, 0.005, 0.02, 0.05):
        for psi in (0.005, 0.05, 0.2, 0.4):
            for n_total in STAGED_NS:
                fails = [staged_point(n_total, psi, r * m, m).different if r * m <= psi else np.nan
                         for r in (0.0, 0.5, 0.9, 1.0)]
                passes = [staged_point(n_total, psi, r * m, m).equivalent if r * m <= psi else np.nan
                          for r in (1.0, 1.5)]
                where = f"m {100 * m:.1f} pp, ψ {psi:.1%}, N {n_total:,}"
                worst_fail = max(worst_fail, (float(np.nanmax(fails)), where))
                if np.any(np.isfinite(passes)):
                    worst_pass = max(worst_pass, (float(np.nanmax(passes)), where))
                bad = np.nanmax(fails) > ALPHA or (np.any(np.isfinite(passes)) and np.nanmax(passes) > ALPHA)
                ok &= not bad
                print(f"  m = {100 * m:.1f} pp, ψ = {psi:5.1%}, N = {n_total:6,}: "
                      + " ".join("   —  " if np.isnan(x) else f"{x:.4f}" for x in fails) + " | "
                      + " ".join("   —  " if np.isnan(x) else f"{x:.4f}" for x in passes)
                      + (" beyond α!" if bad else ""), flush=True)
    print(f"worst P(FAIL) with |Δ| ≤ m: {worst_fail[0]:.4f} ({worst_fail[1]}); worst P(PASS) with |Δ| ≥ m: "
          f"{worst_pass[0]:.4f} ({worst_pass[1]}) (— : |Δ| > ψ, impossible)")
    return ok


def staged_pocock() -> bool:
    """Pocock-like spending (``--spending pocock`` for whoever wires it in): the worst points only, Δ = m."""
    worst = (0.0, "")
    for m in (0.001, 0.005, 0.01, 0.02):
        for psi in STAGED_PSIS:
            for n_total in STAGED_NS:
                if m > psi:
                    continue
                design = sequential.StagedDesign.for_task(n_total, alpha=ALPHA, spending="pocock")
                o = sequential.staged_probabilities(design, (psi - m) / 2, (psi + m) / 2, margin=m)
                worst = max(worst, (max(o.equivalent, o.different), f"m {100 * m:.1f} pp, ψ {psi:.1%}, N {n_total:,}"))
    print(f"\nPocock-like spending, Δ = m, m 0.1–2 pp, the ψ and N above: worst max(P(PASS), P(FAIL)) = "
          f"{worst[0]:.4f} ({worst[1]})")
    return worst[0] <= ALPHA


def staged_power() -> bool:
    """E[docs] at Δ = 0 against the single-look rule at equal power (m = 1 pp): the single-look planner's n
    with its exact P(PASS); the staged planner's N (smallest on a 1 % grid whose exact staged P(PASS) reaches
    the target) with E[docs]; and a task of 30,000 docs under the staged rule, O'Brien–Fleming-like and
    Pocock-like spending (Pocock stops earlier and keeps less α for the last look)."""
    ok = True
    print(f"\nequal power at Δ = 0, m = 1 pp, α = {ALPHA}: single-look n against the staged rule")
    print(f"{'ψ':>6} {'power':>5} | {'single n':>9} {'exact P':>7} | {'staged N':>9} {'exact P':>7} {'E[docs]':>8} "
          f"{'E/n':>5} | N = 30,000: {'P(PASS)':>7} {'E[docs]':>8} | Pocock: {'P(PASS)':>7} {'E[docs]':>8}")
    for psi in (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4):
        for target in (0.8, 0.9):
            plan = sequential.n_for_equivalence_staged(MARGIN, psi, power_target=target, alpha=ALPHA)
            single = int(plan.single_look_n)
            p_single = calibration.verdict_probabilities(single, psi / 2, psi / 2, margin=MARGIN,
                                                         alpha=ALPHA).equivalent
            big = staged_point(30000, psi, 0.0, MARGIN)
            pocock = sequential.staged_probabilities(sequential.StagedDesign.for_task(30000, spending="pocock"),
                                                     psi / 2, psi / 2, margin=MARGIN)
            bad = plan.power < target
            ok &= not bad
            print(f"{psi:6.3f} {target:5.1f} | {single:9,} {p_single:7.4f} | {int(plan.total):9,} {plan.power:7.4f} "
                  f"{plan.expected_docs:8.0f} {plan.expected_docs / single:5.2f} | {'':11} {big.equivalent:7.4f} "
                  f"{big.expected_docs:8.0f} | {'':7} {pocock.equivalent:7.4f} {pocock.expected_docs:8.0f}"
                  + (" below target!" if bad else ""), flush=True)
    return ok


def staged_family(sims: int) -> bool:
    """K comparisons on one task (independent cells against one reference's rates), the family rule at each
    look (``sequential.settle``: PASS needs all EQUIVALENT; Holm on stage-adjusted p-values for DIFFERENT)."""
    rng = np.random.default_rng(3)
    ok = True
    n_total = 10000
    design = sequential.StagedDesign.for_task(n_total, alpha=ALPHA)
    looks = ", ".join(f"{x:,}" for x in design.looks)
    print(f"\nstaged family rule, N = {n_total:,} (looks {looks}), {sims:,} runs each")
    for k in (3, 10):
        for label, deltas, psi in (("all Δ = m (worst case for FAIL)", np.full(k, MARGIN), 0.05),
                                   ("all Δ = 0.9·m", np.full(k, 0.9 * MARGIN), 0.05),
                                   ("one Δ = m, others 0", np.r_[MARGIN, np.zeros(k - 1)], 0.02),
                                   ("all Δ = 0 (the task stops early)", np.zeros(k), 0.01)):
            p_b, p_c = (psi - deltas) / 2, (psi + deltas) / 2
            fail = pass_ = 0
            docs = 0.0
            for _ in range(sims):
                b, c = np.zeros(k, int), np.zeros(k, int)
                final: dict[int, str] = {}
                rejected, prev = 0, 0
                for n in design.looks:
                    for j in range(k):
                        draw = rng.multinomial(n - prev, [p_b[j], p_c[j], 1 - p_b[j] - p_c[j]])
                        b[j] += draw[0]
                        c[j] += draw[1]
                    prev = n
                    open_ = [j for j in range(k) if j not in final]
                    look = sequential.settle(sequential.decide_all(b[open_], c[open_], n, design, margin=MARGIN),
                                             alpha=ALPHA, family_size=k, already_different=rejected)
                    rejected += look.new_different
                    for j, r in zip(open_, look.results):
                        if r.verdict is not None:
                            final[j] = r.verdict
                    if look.stops:
                        docs += n
                        break
                status = verdict.sign_off(final.values())[0]
                fail += status == verdict.FAIL
                pass_ += status == verdict.PASS
            se, check = mc_check(label, fail, pass_, sims)
            ok &= not check
            print(f"  K = {k:2d}, ψ = {psi:.0%}, {label}: P(FAIL) = {fail / sims:.4f}, P(PASS) = {pass_ / sims:.4f}, "
                  f"E[docs] = {docs / sims:,.0f} (MC se {se:.4f}) {check or 'ok'}", flush=True)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--direction", default="both", choices=("both", "worse"))
    ap.add_argument("--mc", type=int, default=2000, help="Monte-Carlo runs per family/cluster setting")
    ap.add_argument("--skip-mc", action="store_true")
    ap.add_argument("--planner", action="store_true", help="also the planner's n against exact enumeration")
    ap.add_argument("--staged", action="store_true", help="the staged (group-sequential) rule instead")
    a = ap.parse_args()
    t0 = time.perf_counter()
    if a.staged:
        ok = staged_grid() & staged_margins() & staged_pocock() & staged_power() & staged_family(a.mc)
        print(f"\nall requirements met: {ok} ({time.perf_counter() - t0:.0f} s)")
        return
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
