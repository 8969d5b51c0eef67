"""Statistics stage: pure functions over per-sample tables, scipy.stats-style result objects.

Modules, in the order a comparison uses them:
- ``inference``: one object per comparison with one-sided p-values at any boundary and the intervals that
  invert them (score, exact zero-discordance, t, cluster score t, the stricter of two).
- ``paired``: binary per-sample scores (McNemar, Tango's score interval and TOST, the vectorised p-values).
- ``deltas``: loglikelihood deltas per request (|Δ| and Δ summaries, doc-level intervals, Wilcoxon).
- ``flips``: decision flips, observed against expected from each doc's whole vector of choice Δs.
- ``generations``: identical outputs by token ids, first-divergence positions.
- ``power``: minimum detectable difference and the n needed to reach a margin.
- ``multiplicity``: Holm / Benjamini-Hochberg over the beyond-margin and change claims, with the levels rejected at.
- ``verdict``: the decision rule: EQUIVALENT / DIFFERENT / SHIFT / INCONCLUSIVE, the interval decided on.
- ``record``: the ``Comparison`` row every reader uses (``verdicts.json`` schema 2).
- ``calibration``: the rule's exact error rates by enumeration (benchmarks and tests).
- ``sequential``: staged sign-offs: α spent over looks, the rule at a look, the family rule and a task's
  stop, exact error rates through the looks, the staged planner.
- ``staged``: a staged run's looks replayed on its tables: where each task stops, its gating verdicts.
- ``options``: the stage's options (light: ``evalparity run`` checks them before it starts anything).
- ``compare``: runs all of the above over a run's tables and writes ``stats/``.
"""
