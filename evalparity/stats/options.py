"""The statistics stage's options, in a module of their own.

Why apart from ``compare``: ``evalparity run`` checks these options first, before it starts anything, and
``compare`` imports pandas, scipy and statsmodels (about 2 s). Kept here, the check costs nothing and the
run's own Ray instance (``placement.LocalRayHead``) starts 2 s sooner."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class StatsOptions:
    reference: str = "hf-fp32"
    margin: float = 0.01
    ll_tolerance: float = 0.05
    alpha: float = 0.05
    multiple: str = "holm"
    cluster: bool = False
    gate_logprobs: bool = False
    n_resamples: int = 2000
    seed: int = 0

    def with_reference(self, name: str) -> StatsOptions:
        return replace(self, reference=name)
