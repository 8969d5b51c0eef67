"""The statistics stage's options, in a module of their own, and the ``--margin`` grammar.

Why apart from ``compare``: ``evalparity run`` checks these options first, before it starts anything, and
``compare`` imports pandas, scipy and statsmodels (about 2 s). Kept here, the check costs nothing and the
run's own Ray instance (``placement.LocalRayHead``) starts 2 s sooner.

Margins carry units, because "1" is what a user types for one point and would otherwise mean ±100 points:
``--margin 1pp``, ``--margin 1%`` and ``--margin 0.01`` all mean one percentage point; a bare number of 0.5
or more for a proportion is refused. Per-metric margins: ``--margin acc=1pp,exact_match=2pp``; a metric that
is not a proportion (perplexity, f1 on a 0-100 scale, ...) gets a margin only this way, in its own unit
(``--margin 1pp,perplexity=0.05``), and without one it is reported but never gates.

Checked where typed: a metric named twice, or a value named twice, is refused when the option is parsed; a
metric name is checked against the metrics of the run's tables once they are loaded (``check_metric_names``),
so that a typo cannot take the gate off the metric it meant. A margin must be a finite number from
``MIN_MARGIN`` (1e-06 points for a proportion) up: below it no number of documents could show equivalence, and
the power calculations would overflow; a proportion margin is below 0.5 (50 points), another metric's at most
``MAX_MARGIN`` in its unit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from evalparity.errors import EvalParityError

DIRECTIONS = ("both", "worse")
MULTIPLE = ("holm", "bh", "none")
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(pp|%)?\s*$")
FORMS = "write 1pp, 1% or 0.01 for one percentage point"
MARGIN = "1pp"  # --margin's default, as typed: one percentage point for every proportion metric
MIN_MARGIN = 1e-8  # 1e-06 percentage points; the smallest margin (or --ll-tolerance) in any metric's unit
MAX_MARGIN = 1e8  # the largest margin of a non-proportion metric (or --ll-tolerance), in its unit
LOGLIKELIHOOD = "loglikelihood"  # compared against --ll-tolerance, not against a --margin


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
    if not math.isfinite(value):
        raise EvalParityError(f"{what} {text!r} is not a finite number: {FORMS}")
    if value <= 0:
        raise EvalParityError(f"{what} {text!r} must be positive: {FORMS}")
    if value < MIN_MARGIN:
        raise EvalParityError(f"{what} {text!r} is below the smallest margin, 1e-06pp ({MIN_MARGIN:g} in a metric's "
                              f"unit): no number of documents could show a difference that small; {FORMS}")
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
    default: float | None = None
    per: dict[str, MetricMargin] = {}
    for item in (x.strip() for x in str(text).split(",")):
        if not item:
            continue
        if "=" in item:
            name, _, val = item.partition("=")
            name = name.strip()
            if not re.fullmatch(r"[A-Za-z0-9_.@,\-]+", name):
                raise EvalParityError(f"--margin {item!r}: {name!r} is not a metric name (metric=VALUE)")
            if name == LOGLIKELIHOOD:
                raise EvalParityError(f"--margin {item!r}: the loglikelihood comparison has a tolerance, not a "
                                      f"margin: use --ll-tolerance {val.strip()} (nats)")
            if name in per:
                raise EvalParityError(f"--margin names {name} twice ({text}): give each metric one margin")
            mm = parse_margin_value(val.strip(), what=f"--margin {name}=")
            if mm.proportion_units:
                check_proportion_margin(mm, val.strip(), f"--margin {name}=")
            elif mm.value > MAX_MARGIN:
                raise EvalParityError(f"--margin {item!r} is above the largest margin, {MAX_MARGIN:g}: a margin that "
                                      "wide gates nothing; give one in the metric's own unit (e.g. perplexity=0.05)")
            per[name] = mm
        else:
            if default is not None:
                raise EvalParityError(f"--margin gives the proportion margin twice ({text}): give one VALUE, and "
                                      "METRIC=VALUE for a metric of its own")
            default = check_proportion_margin(parse_margin_value(item, what="--margin"), item, "--margin")
    return (0.01 if default is None else default), tuple(sorted(per.items()))


def check_metric_names(opts: StatsOptions, known: Iterable[str]) -> None:
    """Every metric ``--margin`` names must be one of ``known``, the metrics of the run's tables: a typo
    (``perplexty=0.05``) would otherwise leave the metric it meant without its margin, never gating. Called
    by the statistics once the tables are loaded (``stats.compare.compute``); the message lists the names."""
    names = sorted(set(known))
    unknown = [m for m, _ in opts.metric_margins if m not in names]
    if unknown:
        raise EvalParityError(f"--margin names {', '.join(unknown)}, which the run's tasks do not report: use one of "
                              f"{', '.join(names) or 'none (the run has no metric columns)'} (the cells' results are "
                              "kept: `evalparity report RUN_DIR --margin ...` recomputes the statistics)")


def parse_compare(texts: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``--compare A:B`` (repeatable) as (A, B) pairs, B compared against A, in the order typed. Only the
    form is checked here, where the options are parsed: two names, not the same one, no pair given twice.
    Whether they are cells of the run is ``signoff.check_pairs``'s, once the run's cells are known."""
    out: list[tuple[str, str]] = []
    for text in texts:
        a, sep, b = str(text).partition(":")
        a, b = a.strip(), b.strip()
        if not sep or not a or not b or ":" in b:
            raise EvalParityError(f"bad --compare {text!r}: write REFERENCE:CELL, two cell names, e.g. "
                                  "--compare vllm-bf16:vllm-fp8")
        if a == b:
            raise EvalParityError(f"--compare {text}: a cell compared with itself says nothing: name two cells")
        if (a, b) in out:
            raise EvalParityError(f"--compare {text} is given twice: keep one")
        if (b, a) in out:  # the same two cells: one comparison, counted once in the gating family
            raise EvalParityError(f"--compare {text} compares the same two cells as --compare {b}:{a}: keep one")
        out.append((a, b))
    return tuple(out)


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
    # ``--compare A:B``: comparisons of cell B against cell A besides every cell's against the reference (kind
    # "pair", gating like those); the names are checked against the run's cells by ``signoff.check_pairs``
    pairs: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise EvalParityError(f"--alpha {self.alpha} is not a test level: give a value in (0, 0.5), e.g. 0.05")
        if not MIN_MARGIN <= self.margin < 0.5:
            raise EvalParityError(f"--margin {self.margin} is not a proportion margin in [{MIN_MARGIN:g}, 0.5): "
                                  f"{FORMS}")
        if not (math.isfinite(self.ll_tolerance) and MIN_MARGIN <= self.ll_tolerance <= MAX_MARGIN):
            raise EvalParityError(f"--ll-tolerance {self.ll_tolerance:g} is not a tolerance: give a number of nats "
                                  f"from {MIN_MARGIN:g} to {MAX_MARGIN:g}, e.g. 0.05")
        if self.multiple not in MULTIPLE:
            raise EvalParityError(f"--multiple {self.multiple!r} is unknown: use holm, bh or none")
        if self.direction not in DIRECTIONS:
            raise EvalParityError(f"--direction {self.direction!r} is unknown: use both or worse")

    @classmethod
    def from_cli(cls, *, margin: str = MARGIN, compare: Iterable[str] | None = None, **kw) -> StatsOptions:
        default, per = parse_margins(margin)
        return cls(margin=default, metric_margins=per, pairs=parse_compare(compare or ()), **kw)

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

    @classmethod
    def from_dict(cls, d: object) -> StatsOptions:
        """``as_dict``'s inverse: the options a ``verdicts.json`` records, for a command that recomputes a run's
        statistics as they were last asked for (``drift --run-dir``, which re-renders the report), read back
        through the command line's own rules (``from_cli``), so that a record the command line could not have
        made (a proportion margin of 50 points, a pair given twice) is refused as the command line refuses it.
        The margins come back as bare numbers: a per-metric margin then gets, for a proportion metric, the
        check a bare number gets (below 0.5), which a margin typed in pp or % passed already when it was
        parsed; every other metric's is its value, as before. ``n_resamples`` and ``seed`` are not options of
        any command: another value than theirs is refused. Raises a one-line EvalParityError."""
        keys = set(cls().as_dict())
        if not isinstance(d, dict) or set(d) != keys:
            got = ", ".join(sorted(map(str, d))) if isinstance(d, dict) else type(d).__name__
            raise EvalParityError(f"its options are not this evalparity's statistics options (found: {got[:200]})")
        for key in ("n_resamples", "seed"):  # fixed: no command sets them
            if d[key] != getattr(cls(), key) or isinstance(d[key], bool):
                raise EvalParityError(f"options.{key} is {str(d[key])[:40]}, which no command sets "
                                      f"(evalparity uses {getattr(cls(), key)})")

        def number(key: str, value: object) -> str:
            try:  # an integer of 400 digits is JSON, and too large for a float
                f = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
            except OverflowError:
                f = math.nan
            if not math.isfinite(f):
                raise EvalParityError(f"options.{key} = {str(value)[:40]!r} is not a finite number")
            return repr(f)

        per, pairs = d["metric_margins"], d["compare"]
        if not isinstance(per, dict) or not all(isinstance(k, str) and "," not in k for k in per):
            raise EvalParityError("options.metric_margins is not metric -> margin")
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2
                                                  and all(isinstance(x, str) and ":" not in x for x in p)
                                                  for p in pairs):
            raise EvalParityError("options.compare is not a list of cell pairs")
        for key in ("reference", "multiple", "direction"):
            if not isinstance(d[key], str):
                raise EvalParityError(f"options.{key} is not text")
        for key in ("cluster", "gate_logprobs"):
            if not isinstance(d[key], bool):
                raise EvalParityError(f"options.{key} is not true or false")
        margin = ",".join([number("margin", d["margin"])]
                          + [f"{m}={number(f'metric_margins.{m}', v)}" for m, v in per.items()])
        return cls.from_cli(margin=margin, compare=[f"{a}:{b}" for a, b in pairs], reference=d["reference"],
                            ll_tolerance=float(number("ll_tolerance", d["ll_tolerance"])),
                            alpha=float(number("alpha", d["alpha"])), multiple=d["multiple"],
                            cluster=d["cluster"], gate_logprobs=d["gate_logprobs"], direction=d["direction"])

    def as_dict(self) -> dict:
        return {"reference": self.reference, "margin": self.margin,
                "metric_margins": {k: v.value for k, v in self.metric_margins},
                "ll_tolerance": self.ll_tolerance, "alpha": self.alpha, "multiple": self.multiple,
                "cluster": self.cluster, "gate_logprobs": self.gate_logprobs, "direction": self.direction,
                "n_resamples": self.n_resamples, "seed": self.seed, "compare": [list(p) for p in self.pairs]}
