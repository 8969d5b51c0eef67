"""The check every test that writes a ``verdicts.json`` applies: the file validates against the JSON Schema the
package ships (``evalparity/stats/verdicts.schema.json``), and its counts agree with its own rows."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import jsonschema


def schema() -> dict:
    return json.loads(resources.files("evalparity").joinpath("stats/verdicts.schema.json").read_text())


def check_verdicts(path: Path) -> dict:
    """Validate ``path`` (a verdicts.json); return it parsed. Besides the schema: the sign-off's counts are the
    gating rows' verdicts, and every id it names is a gating row."""
    doc = json.loads(Path(path).read_text())
    jsonschema.Draft202012Validator(schema()).validate(doc)
    gating = [c for c in doc["comparisons"] if c["gating"]]
    so = doc["sign_off"]
    assert so["gating"] == len(gating)
    for v, k in so["counts"].items():
        assert k == sum(c["verdict"] == v for c in gating), v
    ids = {c["id"] for c in gating}
    assert set(so["decided_by"]) <= ids
    return doc
