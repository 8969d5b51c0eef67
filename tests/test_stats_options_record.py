"""The statistics options a ``verdicts.json`` records read back (``StatsOptions.from_dict``), for ``drift
--run-dir``, which recomputes a run's statistics with them before it re-renders the report.

Generated cases: options as a user types them (``--margin`` with units, per-metric margins, pairs, every
switch) come back with the same record and the same margin, or the same refusal, for every metric, proportion
or not; a record the command line could not have made (keys missing or added, a value of the wrong type or
out of range, a proportion margin of 50 points or more, a pair given twice, resamples or a seed no command
sets) is one EvalParityError line, never another exception.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evalparity.errors import EvalParityError
from evalparity.stats.options import StatsOptions

METRICS = ("acc", "acc_norm", "exact_match", "perplexity", "f1", "bleu")


@st.composite
def margins(draw) -> str:
    """A ``--margin`` as typed: a proportion margin in pp, % or bare, and per-metric ones in any unit."""
    def value(proportion: bool) -> str:
        pp = draw(st.floats(min_value=0.01, max_value=40.0))
        form = draw(st.sampled_from(("pp", "%", "bare") if proportion else ("pp", "%", "bare", "big")))
        if form == "big":  # a non-proportion metric's own unit may be large
            return f"{draw(st.floats(min_value=0.5, max_value=1e6)):.6g}"
        return f"{pp:.6g}{form}" if form != "bare" else f"{pp / 100:.6g}"
    items = [value(True)] if draw(st.booleans()) else []
    for m in draw(st.lists(st.sampled_from(METRICS), unique=True, max_size=4)):
        items.append(f"{m}={value(m in ('acc', 'acc_norm', 'exact_match'))}")
    return ",".join(items) or "1pp"


@st.composite
def options(draw) -> StatsOptions:
    cells = ["hf-fp32", "vllm-bf16", "hf-bf16", "vllm-fp8"]
    pairs = draw(st.lists(st.tuples(st.sampled_from(cells), st.sampled_from(cells)).filter(lambda p: p[0] != p[1]),
                          max_size=2, unique_by=frozenset))
    return StatsOptions.from_cli(
        margin=draw(margins()), compare=[f"{a}:{b}" for a, b in pairs],
        reference=draw(st.sampled_from(cells)), ll_tolerance=draw(st.floats(min_value=1e-6, max_value=10.0)),
        alpha=draw(st.floats(min_value=0.001, max_value=0.2)), multiple=draw(st.sampled_from(("holm", "bh", "none"))),
        cluster=draw(st.booleans()), gate_logprobs=draw(st.booleans()),
        direction=draw(st.sampled_from(("both", "worse"))))


def margin_or_error(opts: StatsOptions, metric: str, proportion: bool):
    try:
        return opts.margin_for(metric, proportion=proportion)
    except EvalParityError as err:
        return f"error: {err}"


@settings(max_examples=300, deadline=None)
@given(options())
def test_recorded_options_read_back_as_they_were_asked_for(opts):
    back = StatsOptions.from_dict(opts.as_dict())
    assert back.as_dict() == opts.as_dict()
    for metric in (*METRICS, "other"):
        for proportion in (True, False):  # a refusal too (a bare 0.5 or more for a proportion metric)
            assert margin_or_error(back, metric, proportion) == margin_or_error(opts, metric, proportion), \
                (metric, proportion)


CORRUPTIONS = [
    ("missing key", lambda d: d.pop("alpha")),
    ("extra key", lambda d: d.update(margin_text="1pp")),
    ("margin as text", lambda d: d.update(margin="1pp")),
    ("margin as bool", lambda d: d.update(margin=True)),
    ("margin too large", lambda d: d.update(margin=0.7)),
    ("margin nan", lambda d: d.update(margin=float("nan"))),
    ("margin of 400 digits", lambda d: d.update(margin=10**400)),
    ("metric margin of 400 digits", lambda d: d.update(metric_margins={"acc": 10**400})),
    ("alpha out of range", lambda d: d.update(alpha=0.9)),
    ("reference not text", lambda d: d.update(reference=["hf-fp32"])),
    ("multiple unknown", lambda d: d.update(multiple="bonferroni")),
    ("direction unknown", lambda d: d.update(direction="better")),
    ("cluster not bool", lambda d: d.update(cluster="yes")),
    ("resamples huge", lambda d: d.update(n_resamples=10**6)),
    ("resamples zero", lambda d: d.update(n_resamples=0)),
    ("resamples float", lambda d: d.update(n_resamples=2000.5)),
    ("seed negative", lambda d: d.update(seed=-1)),
    ("seed another", lambda d: d.update(seed=7)),
    ("margin 50 points", lambda d: d.update(margin=0.5)),
    ("margin zero", lambda d: d.update(margin=0.0)),
    ("metric margin above the largest", lambda d: d.update(metric_margins={"perplexity": 1e9})),
    ("metric margin for loglikelihood", lambda d: d.update(metric_margins={"loglikelihood": 0.1})),
    ("metric name with a comma", lambda d: d.update(metric_margins={"acc,x": 0.01})),
    ("metric name with markup", lambda d: d.update(metric_margins={"[bold]acc": 0.01})),
    ("pair twice", lambda d: d.update(compare=[["a", "b"], ["a", "b"]])),
    ("pair reversed", lambda d: d.update(compare=[["a", "b"], ["b", "a"]])),
    ("pair with itself", lambda d: d.update(compare=[["a", "a"]])),
    ("pair with a colon", lambda d: d.update(compare=[["a:b", "c"]])),
    ("metric margin text", lambda d: d.update(metric_margins={"acc": "1pp"})),
    ("metric margin zero", lambda d: d.update(metric_margins={"acc": 0.0})),
    ("metric margin inf", lambda d: d.update(metric_margins={"acc": float("inf")})),
    ("metric margins list", lambda d: d.update(metric_margins=[["acc", 0.01]])),
    ("compare not pairs", lambda d: d.update(compare=[["hf-fp32"]])),
    ("compare of numbers", lambda d: d.update(compare=[[1, 2]])),
]


@pytest.mark.parametrize("what, spoil", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_a_record_of_another_shape_is_one_line(what, spoil):
    d = copy.deepcopy(StatsOptions.from_cli(margin="1pp,perplexity=0.05").as_dict())
    spoil(d)
    with pytest.raises(EvalParityError) as err:
        StatsOptions.from_dict(d)
    assert "\n" not in str(err.value)


def test_a_proportion_margin_of_50_points_per_metric_is_refused_as_typed_bare():
    """acc=0.9 in a record: the command line refuses it for a proportion metric (``margin_for``), typed bare
    or in points; read back, it is refused the same way, and a non-proportion metric keeps it."""
    back = StatsOptions.from_dict({**StatsOptions().as_dict(), "metric_margins": {"acc": 0.9}})
    with pytest.raises(EvalParityError, match="too large for a proportion"):
        back.margin_for("acc", proportion=True)
    assert back.margin_for("acc", proportion=False) == 0.9
    with pytest.raises(EvalParityError, match="too large for a proportion"):
        StatsOptions.from_cli(margin="acc=0.9").margin_for("acc", proportion=True)


@pytest.mark.parametrize("record", [None, [], "options", 3])
def test_no_options_at_all_is_one_line(record):
    with pytest.raises(EvalParityError, match="its options are not this evalparity's statistics options"):
        StatsOptions.from_dict(record)
