"""Task resolution through lm-eval's TaskManager, the shipped smoke task, mirrors, and `evalparity doctor`."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED_DATA, evalparity

from evalparity import tasks
from evalparity.errors import EvalParityError


@pytest.fixture(scope="module")
def tm():
    return tasks.task_manager()


def test_shipped_smoke_task_needs_no_download(tm):
    plan = tasks.preflight(["evalparity_smoke"], tm, [], None)
    assert plan.leaves == {"evalparity_smoke": 24}


def test_a_mirror_serves_a_hub_dataset_with_lm_eval_processing_unchanged(tm, tmp_path):
    """A fake hub id mirrored under DIR/<id>/<config>/<split>.jsonl is read by an lm-eval task whose YAML
    names that hub id; a split the mirror lacks reads as empty, and few-shot from it is refused."""
    folder = tmp_path / "mirror" / "someorg" / "tiny-qa" / "default"
    folder.mkdir(parents=True)
    (folder / "test.jsonl").write_text("".join(json.dumps({"q": f"q{i}", "c": ["a", "b"], "y": i % 2}) + "\n"
                                               for i in range(7)))
    yaml_dir = tmp_path / "yamls"
    yaml_dir.mkdir()
    (yaml_dir / "tinyqa.yaml").write_text(
        "task: tinyqa\ndataset_path: someorg/tiny-qa\ntest_split: test\ntraining_split: train\n"
        "fewshot_split: train\noutput_type: multiple_choice\ndoc_to_text: '{{q}}'\ndoc_to_choice: '{{c}}'\n"
        "doc_to_target: '{{y}}'\nmetric_list:\n  - metric: acc\n")
    tm2 = tasks.task_manager([str(yaml_dir)])
    plan = tasks.preflight(["tinyqa"], tm2, [tmp_path / "mirror"], None, num_fewshot=0)
    assert plan.leaves == {"tinyqa": 7}
    with pytest.raises(EvalParityError, match="asks for 2-shot examples.*--num-fewshot 0"):
        tasks.preflight(["tinyqa"], tm2, [tmp_path / "mirror"], None, num_fewshot=2)


@pytest.mark.skipif(not (SHARED_DATA / "cais" / "mmlu").is_dir(), reason="../shared/data is not beside the checkout")
def test_groups_resolve_to_their_members_through_the_mirror(tm):
    plan = tasks.preflight(["mmlu_abstract_algebra", "hellaswag"], tm, [SHARED_DATA], None, num_fewshot=0)
    assert plan.leaves["mmlu_abstract_algebra"] == 100 and plan.leaves["hellaswag"] == 10042


def test_doctor_reports_backends_and_missing_data(tmp_path):
    proc = evalparity("doctor", "--tasks", "evalparity_smoke,ceval-valid_computer_network",
                      env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "EVALPARITY_DATASETS_DIR": ""})
    out = proc.stderr + proc.stdout
    assert "vllm" in out and "transformers" in out and "device: cpu" in out
    assert "task evalparity_smoke: data available (24 docs" in out
    assert "ceval/ceval-exam" in out and proc.returncode == 6  # EXIT_DOCTOR_PROBLEMS; 1 is a bug's
    assert "embedded model files: shipped, pinned" in out
    assert "Traceback" not in out


def test_doctor_names_damaged_embedded_model_files(tmp_path, monkeypatch):
    """A damaged pin (``data/smollm2/MANIFEST.json``) is a problem doctor names, with its fix; the
    preparation would refuse it in the same words."""
    import shutil

    from rich.console import Console

    from evalparity import doctor
    from evalparity.data import embedded

    shipped = tmp_path / "shipped"
    shutil.copytree(embedded.SHIPPED, shipped)
    (shipped / "MANIFEST.json").write_text("[")
    monkeypatch.setattr(embedded, "SHIPPED", shipped)
    console = Console(record=True, width=300)
    assert doctor.diagnose(console, None, None) == 6  # a problem found: EXIT_DOCTOR_PROBLEMS
    text = console.export_text()
    assert f"embedded model files: {shipped / 'MANIFEST.json'} is missing or damaged: reinstall evalparity" in text


def test_a_task_named_with_a_path_separator_is_refused_before_any_cell(tmp_path):
    """Session 32's review: an include-path task ``sl/ash`` was scored by every cell, then lost at lm-eval's
    save (exit 5); it is one line at the data check now."""
    import json

    from tiny import MC_YAML

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "a b", "choices": ["x", "y"], "label": 0}) + "\n")
    (tmp_path / "slash.yaml").write_text(MC_YAML.format(name="sl/ash", data=data))
    tm = tasks.task_manager([str(tmp_path)])
    with pytest.raises(EvalParityError, match="'sl/ash' has a path separator in its name"):
        tasks.preflight(["sl/ash"], tm, [], None, num_fewshot=0)
