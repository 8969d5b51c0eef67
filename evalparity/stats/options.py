"""The statistics stage's options, in a module of their own, and the ``--margin`` grammar.

Why apart from ``compare``: ``evalparity run`` checks these options first, before it starts anything, and
``compare`` imports pandas, scipy and statsmodels (about 2 s). Kept here, the check costs nothing and the
run's own Ray instance (``placement.LocalRayHead``) starts 2 s sooner.

Margins carry units, because "1" is what a user types for one point and would otherwise mean ±100 points:
``--margin 1pp``, ``--margin 1%`` and ``--margin 0.01`` all mean one percentage point; a bare number of 0.5
or more for a proportion is refused. Per-metric margins: ``--margin acc=1pp,exact_match=2pp``; a metric that
is not a proportion (perplexity, f1 on a 0-100 scale, ...) gets a margin only this way, in its own unit
(``--margin 1pp,perplexity=0.05``), and without one it is reported but never gates.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from evalparity.errors import EvalParityError

DIRECTIONS = ("both", "worse")
MULTIPLE = ("holm", "bh", "none")
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(pp|%)?\s*$")
FORMS = "write 1pp, 1% or 0.01 for one percentage point"
MARGIN = "1pp"  # --margin's default, as typed: one percentage point for every proportion metric


@dataclass(frozen=True)
class MetricMargin:
    """A margin as given: the value in the metric's unit, and whether the user wrote pp/% (a proportion)."""

    value: float
    proportion_units: bool


def parse_margin_value(text: str, *, what: str) -> MetricMargin:
    m = _VALUE.match(text)
    if not m:
        raise EvalParityError(f"{what} {text!r} is not a margin: {FORMS} (or metric=VALUE for one metric)")
    value = float(m.group(1))
    if m.group(2):
        value /= 100.0
    if not math.isfinite(value) or value <= 0:
        raise EvalParityError(f"{what} {text!r} must be positive: {FORMS}")
    return MetricMargin(value, bool(m.group(2)))


def check_proportion_margin(mm: MetricMargin, text: str, what: str) -> float:
    """A margin for a difference of proportions must lie in (0, 0.5)."""
    if mm.value >= 0.5:
        hint = (f"--margin {text} reads as ±{100 * mm.value:g} points" if not mm.proportion_units
                else f"a margin of {100 * mm.value:g} points says nothing")
        raise EvalParityError(f"{what} {text!r} is too large for a proportion ({hint}): {FORMS}")
    return mm.value


def parse_margins(text: str) -> tuple[float, tuple[tuple[str, MetricMargin], ...]]:
    """``--margin`` → (the proportion margin, per-metric margins). Items are comma-separated, each
    ``VALUE`` (the margin for every proportion metric) or ``METRIC=VALUE``."""
    default = 0.01
    per: dict[str, MetricMargin] = {}
    for item in (x.strip() for x in str(text).split(",")):
        if not item:
            continue
        if "=" in item:
            name, _, val = item.partition("=")
            name = name.strip()
            if not re.fullmatch(r"[A-Za-z0-9_.@,\-]+", name):
                raise EvalParityError(f"--margin {item!r}: {name!r} is not a metric name (metric=VALUE)")
            mm = parse_margin_value(val.strip(), what=f"--margin {name}=")
            if mm.proportion_units:
                check_proportion_margin(mm, val.strip(), f"--margin {name}=")
            per[name] = mm
        else:
            default = check_proportion_margin(parse_margin_value(item, what="--margin"), item, "--margin")
    return default, tuple(sorted(per.items()))


@dataclass(frozen=True)
class StatsOptions:
    reference: str = "hf-fp32"
    margin: float = 0.01  # the proportion margin (a difference of 0.01 = one percentage point)
    metric_margins: tuple[tuple[str, MetricMargin], ...] = ()
    ll_tolerance: float = 0.05
    alpha: float = 0.05
    multiple: str = "holm"
    cluster: bool = False
    gate_logprobs: bool = False
    direction: str = "both"
    n_resamples: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise EvalParityError(f"--alpha {self.alpha} is not a test level: give a value in (0, 0.5), e.g. 0.05")
        if not 0 < self.margin < 0.5:
            raise EvalParityError(f"--margin {self.margin} is not a proportion margin in (0, 0.5): {FORMS}")
        if not (math.isfinite(self.ll_tolerance) and self.ll_tolerance > 0):
            raise EvalParityError("--ll-tolerance must be a positive number of nats, e.g. 0.05")
        if self.multiple not in MULTIPLE:
            raise EvalParityError(f"--multiple {self.multiple!r} is unknown: use holm, bh or none")
        if self.direction not in DIRECTIONS:
            raise EvalParityError(f"--direction {self.direction!r} is unknown: use both or worse")

    @classmethod
    def from_cli(cls, *, margin: str = MARGIN, **kw) -> StatsOptions:
        default, per = parse_margins(margin)
        return cls(margin=default, metric_margins=per, **kw)

    def with_reference(self, name: str) -> StatsOptions:
        return replace(self, reference=name)

    def margin_for(self, metric: str, *, proportion: bool) -> float | None:
        """The margin for one metric in its own unit; None for a non-proportion metric without one."""
        per = dict(self.metric_margins)
        if metric in per:
            mm = per[metric]
            if proportion and not mm.proportion_units:
                return check_proportion_margin(mm, f"{mm.value:g}", f"--margin {metric}=")
            return mm.value
        return self.margin if proportion else None

    def as_dict(self) -> dict:
        return {"reference": self.reference, "margin": self.margin,
                "metric_margins": {k: v.value for k, v in self.metric_margins},
                "ll_tolerance": self.ll_tolerance, "alpha": self.alpha, "multiple": self.multiple,
                "cluster": self.cluster, "gate_logprobs": self.gate_logprobs, "direction": self.direction,
                "n_resamples": self.n_resamples, "seed": self.seed}
