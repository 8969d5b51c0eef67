"""``verdicts.json`` schema 3: a synthetic run's file validates against the shipped JSON Schema, proportions are
fractions that say so, counts are integers, and the sign-off names its counts and the comparisons it rests on;
the schema itself refuses what version 2 wrote (``unit: "pp"`` beside a fraction, a fractional ``n_needed``)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from synthetic import make_run
from verdict_schema import check_verdicts, schema

from evalparity.stats.compare import compute
from evalparity.stats.options import StatsOptions

CELLS = ["hf-fp32", "vllm-fp32", "hf-bf16"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = make_run(tmp_path_factory.mktemp("v3") / "run", n_tasks=3, cells=CELLS, docs_per_task=40)
    summary = compute(root, StatsOptions())
    return root, summary


def test_a_written_file_validates_and_is_consistent(written):
    root, summary = written
    doc = check_verdicts(root / "stats" / "verdicts.json")
    assert doc["schema"] == "evalparity.verdicts/4"
    assert doc["sign_off"]["status"] == summary.sign_off
    props = [c for c in doc["comparisons"] if c["metric"] in ("acc", "acc_norm")]
    assert props and all(c["unit"] == "fraction" and c["shown_as"] == "pp" for c in props)
    assert all(isinstance(c["n"], int) for c in doc["comparisons"])
    assert all(c["n_needed"] is None or isinstance(c["n_needed"], int) for c in doc["comparisons"])
    assert doc["run"]["id"] and doc["run"]["evalparity"]
    assert set(doc["run"]["cells"]) == set(CELLS)


def test_the_sign_off_names_what_decided_it(written):
    doc = json.loads((written[0] / "stats" / "verdicts.json").read_text())
    so, gating = doc["sign_off"], [c for c in doc["comparisons"] if c["gating"]]
    if so["status"] == "INCONCLUSIVE":
        assert so["decided_by"] == [c["id"] for c in gating if c["verdict"] != "EQUIVALENT"]
    elif so["status"] == "PASS":
        assert so["decided_by"] == [c["id"] for c in gating]


@pytest.mark.parametrize("damage", ["unit_pp", "float_n_needed", "extra_field", "bad_status"])
def test_the_schema_refuses_what_it_should(written, damage):
    doc = json.loads((written[0] / "stats" / "verdicts.json").read_text())
    row = next(c for c in doc["comparisons"] if c["unit"] == "fraction")
    if damage == "unit_pp":
        row["unit"] = "pp"
    elif damage == "float_n_needed":
        row["n_needed"] = 123.4
    elif damage == "extra_field":
        doc["sign_off"]["verdict"] = "PASS"
    else:
        doc["sign_off"]["status"] = "OK"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema()).validate(doc)
