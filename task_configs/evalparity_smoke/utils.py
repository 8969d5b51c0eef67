"""Data loader for the evalparity_smoke task: the questions ship beside this file, so the task needs no
download and no mirror (lm-eval calls this through the YAML's ``custom_dataset``)."""

import json
from pathlib import Path

import datasets


def load(**kwargs):
    rows = [json.loads(line) for line in (Path(__file__).parent / "questions.jsonl").read_text().splitlines() if line]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
