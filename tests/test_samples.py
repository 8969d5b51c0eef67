"""The per-sample table from lm-eval's own jsonl samples, and the reader's errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalparity.errors import EvalParityError
from evalparity.samples import read_lm_eval_dir, samples_to_table


def mc_sample(doc_id: int, lls: list[float], gold: int, acc: float) -> dict:
    ctx = f"Question {doc_id}?\nAnswer:"
    return {
        "doc_id": doc_id, "doc": {"q": doc_id}, "target": gold,
        "arguments": {f"gen_args_{i}": {"arg_0": ctx, "arg_1": f" choice {i}"} for i in range(len(lls))},
        "resps": [[[ll, False]] for ll in lls], "filtered_resps": [[ll, False] for ll in lls],
        "filter": "none", "metrics": ["acc"], "doc_hash": f"d{doc_id}", "prompt_hash": f"p{doc_id}",
        "target_hash": f"t{gold}", "acc": acc,
    }


def gen_sample(doc_id: int, text: str, filt: str, em: float) -> dict:
    return {
        "doc_id": doc_id, "doc": {}, "target": "42",
        "arguments": {"gen_args_0": {"arg_0": f"Q{doc_id}", "arg_1": {"until": ["\n"]}}},
        "resps": [[text]], "filtered_resps": [text.strip()], "filter": filt, "metrics": ["exact_match"],
        "doc_hash": f"d{doc_id}", "prompt_hash": f"p{doc_id}", "target_hash": "t", "exact_match": em,
    }


def write_lm_eval_dir(root: Path, samples: dict[str, list[dict]], results: dict) -> Path:
    model = root / "my__model"
    model.mkdir(parents=True)
    (model / "results_2026-01-01T00-00-00.000000.json").write_text(json.dumps(results))
    for task, rows in samples.items():
        with open(model / f"samples_{task}_2026-01-01T00-00-00.000000.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return root


RESULTS = {"configs": {"mc": {"output_type": "multiple_choice"}, "gen": {"output_type": "generate_until"}},
           "group_subtasks": {"grp": ["mc"]}}


def test_table_rows_columns_and_groups(tmp_path):
    d = write_lm_eval_dir(tmp_path, {
        "mc": [mc_sample(0, [-1.0, -2.0, -3.0], 0, 1.0), mc_sample(1, [-3.0, -1.0, -2.0], 2, 0.0)],
        "gen": [gen_sample(0, " 42\n", "strict", 1.0), gen_sample(0, " 42\n", "flex", 1.0)],
    }, RESULTS)
    results, task_samples = read_lm_eval_dir(d)
    t = samples_to_table(task_samples, results, generated_ids={"Q0": [5, 6]})
    mc = t[t["task"] == "mc"]
    assert len(mc) == 6 and list(mc["loglikelihood"][:3]) == [-1.0, -2.0, -3.0]
    assert set(mc["group"]) == {"grp"} and list(mc["gold"].unique()) == [0, 2]
    assert mc["continuation"].iloc[1] == " choice 1" and (mc["m:acc"].tolist() == [1.0] * 3 + [0.0] * 3)
    gen = t[t["task"] == "gen"]
    assert len(gen) == 2 and set(gen["filter"]) == {"strict", "flex"}
    assert list(gen["generated_ids"].iloc[0]) == [5, 6] and gen["response"].iloc[0] == "42"


def test_truncated_jsonl_line_is_named(tmp_path):
    d = write_lm_eval_dir(tmp_path, {"mc": [mc_sample(0, [-1.0, -2.0], 0, 1.0)]}, RESULTS)
    f = next(d.rglob("samples_mc_*.jsonl"))
    f.write_text(f.read_text() + '{"doc_id": 1, "doc": {"q"\n')
    with pytest.raises(EvalParityError, match=r"samples_mc_.*\.jsonl:2 is not valid JSON"):
        read_lm_eval_dir(d)


def test_directory_without_samples(tmp_path):
    (tmp_path / "results_x.json").write_text("{}")
    with pytest.raises(EvalParityError, match="no samples_.*--log_samples"):
        read_lm_eval_dir(tmp_path)


def test_two_runs_of_one_task_mixed_are_refused(tmp_path):
    with pytest.raises(EvalParityError, match="share the key"):
        samples_to_table({"mc": [mc_sample(0, [-1.0], 0, 1.0), mc_sample(0, [-1.0], 0, 1.0)]}, RESULTS)


def test_metric_values_as_strings(tmp_path):
    """Numeric strings are numbers; a field with no number at all (text, the lists corpus-level metrics keep)
    is left out as before; a field mixing numbers with other text names file, field and line."""
    rows = [mc_sample(i, [-1.0, -2.0], 0, a) for i, a in enumerate(["1.0", " 0 ", 1, "nan"])]
    for r in rows:
        r["metrics"] = ["acc", "bleu", "note"]
        r["bleu"], r["note"] = [["ref"], ["hyp"]], "free text"
    d = write_lm_eval_dir(tmp_path / "ok", {"mc": rows}, RESULTS)
    results, task_samples = read_lm_eval_dir(d)
    t = samples_to_table(task_samples, results)
    first = t[t["choice"] == 0]["m:acc"].tolist()
    assert first[:3] == [1.0, 0.0, 1.0] and first[3] != first[3]  # "nan" is NaN, treated as NaN elsewhere
    assert "m:bleu" not in t and "m:note" not in t
    rows[2]["acc"] = "n/a"
    d = write_lm_eval_dir(tmp_path / "bad", {"mc": rows}, RESULTS)
    with pytest.raises(EvalParityError, match=r"samples_mc_.*\.jsonl:3 field 'acc' is 'n/a', not a number"):
        samples_to_table(*reversed(read_lm_eval_dir(d)))
    with pytest.raises(EvalParityError, match=r"task mc, sample 3, field 'acc'"):  # samples not from a file
        samples_to_table({"mc": [dict(r) for r in rows]}, RESULTS)


def test_corrupt_results_and_samples_are_one_line(tmp_path):
    d = write_lm_eval_dir(tmp_path / "a", {"mc": [mc_sample(0, [-1.0, -2.0], 0, 1.0)]}, RESULTS)
    res = next(d.rglob("results_*.json"))
    res.write_text("[1, 2]")
    with pytest.raises(EvalParityError, match=r"results_.*\.json is a JSON list, not lm-eval's results"):
        read_lm_eval_dir(d)
    res.write_bytes(b"\x00\xff garbage")
    with pytest.raises(EvalParityError, match=r"results_.*\.json is truncated or corrupt"):
        read_lm_eval_dir(d)
    bad = mc_sample(0, [-1.0, -2.0], 0, 1.0)
    del bad["doc_id"]
    d = write_lm_eval_dir(tmp_path / "b", {"mc": [bad]}, RESULTS)
    with pytest.raises(EvalParityError, match=r"jsonl:1 is not an lm-eval sample .*no 'doc_id' field"):
        samples_to_table(*reversed(read_lm_eval_dir(d)))
    f = next(d.rglob("samples_*.jsonl"))
    f.write_text('["a list"]\n')
    with pytest.raises(EvalParityError, match=r"jsonl:1 is a JSON list, not a sample"):
        read_lm_eval_dir(d)
