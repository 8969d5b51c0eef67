"""Statistics stage: pure functions over per-sample tables, scipy.stats-style result objects.

Modules, in the order a comparison uses them:
- ``paired``: binary per-sample scores (McNemar, paired CI, TOST, cluster-robust SE).
- ``deltas``: loglikelihood deltas per request (summary, Wilcoxon, bootstrap CI, TOST).
- ``flips``: decision flips against the reference's margin between its top two choices.
- ``generations``: identical outputs by token ids, first-divergence positions.
- ``power``: minimum detectable difference and the n needed to reach a margin.
- ``multiplicity``: Holm / Benjamini-Hochberg over the whole family.
- ``verdict``: EQUIVALENT / DIFFERENT / INCONCLUSIVE with the reason in words.
- ``options``: the stage's options (light: ``evalparity run`` checks them before it starts anything).
- ``compare``: runs all of the above over a run's tables and writes ``stats/``.
"""
