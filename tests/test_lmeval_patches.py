"""lm-eval speed-ups (evalparity/lmeval_patches.py) change no prompt, target or choice.

Two child processes build the same tasks' requests, one with lm-eval as it is and one with the template
cache, and print every request's arguments and every doc's target; they must be identical, and the cached
one must have reused compiled templates. The tasks: the two tiny local ones, and HellaSwag, MMLU (two
subjects) and GSM8K from ../shared/data where it is there (their YAMLs use Jinja templates and filters).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import SHARED_DATA

SCRIPT = textwrap.dedent("""
    import json, sys
    from evalparity import lmeval_patches, tasks
    from evalparity.data import mirrors

    cached, include, data, names = sys.argv[1] == "1", sys.argv[2], sys.argv[3], sys.argv[4].split(",")
    if data:
        mirrors.activate(mirrors.mirror_roots(data))
    if cached:
        assert lmeval_patches.cache_templates()
    from lm_eval.tasks import get_task_dict

    def leaves(d):
        for k, v in d.items():
            yield from leaves(v) if isinstance(v, dict) else [(getattr(k, "group_name", k), v)]

    out = {}
    for name, task in leaves(get_task_dict(names, tasks.task_manager((include,)))):
        task.set_config(key="num_fewshot", value=0)
        task.build_all_requests(limit=40, rank=0, world_size=1)
        out[str(name)] = [[i.doc_id, i.idx, list(map(str, i.args)), str(task.doc_to_target(i.doc))]
                          for i in task.instances]
    from lm_eval import utils
    info = utils.env.from_string.cache_info() if cached else None
    print(json.dumps({"requests": out, "hits": info.hits if info else None}))
""")


def _requests(cached: bool, include: str, data: str, names: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(int(cached)), include, data, ",".join(names)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_template_cache_renders_the_same_requests(tiny_tasks):
    names = ["tiny_mc", "tiny_gen"]
    data = ""
    if (SHARED_DATA / "Rowan" / "hellaswag").is_dir():
        names += ["hellaswag", "mmlu_anatomy", "mmlu_astronomy", "gsm8k"]
        data = str(SHARED_DATA)
    plain = _requests(False, str(tiny_tasks), data, names)
    cached = _requests(True, str(tiny_tasks), data, names)
    assert plain["hits"] is None and cached["hits"] > 0  # compiled templates were reused
    assert set(plain["requests"]) == set(cached["requests"]) and len(plain["requests"]) >= len(names)
    for task, rows in plain["requests"].items():
        assert rows, task
        for a, b in zip(rows, cached["requests"][task], strict=True):
            assert a == b, f"{task} doc {a[0]} choice {a[1]}: {a} != {b}"


def test_index_set_selects_the_same_docs_in_lm_evals_doc_iterator():
    """lm-eval's own ``Task.doc_iterator`` on a plain list and on ``IndexSet``: the same (index, doc) pairs."""
    from types import SimpleNamespace

    from lm_eval.api.task import Task

    from evalparity.lmeval_patches import IndexSet, fast_samples

    docs = [{"i": i} for i in range(500)]
    fake = SimpleNamespace(eval_docs=docs, config=SimpleNamespace(task="t"))
    chosen = [3, 7, 8, 120, 499, 250]
    plain = list(Task.doc_iterator(fake, samples=list(chosen)))
    fast = list(Task.doc_iterator(fake, samples=IndexSet(chosen)))
    assert fast == plain and [d["i"] for _, d in fast] == sorted(chosen)
    assert 120 in IndexSet(chosen) and 121 not in IndexSet(chosen) and list(IndexSet(chosen)) == chosen
    assert json.dumps(fast_samples({"t": chosen})) == json.dumps({"t": chosen})
    assert fast_samples(None) is None


def test_env_info_is_computed_once_per_process_and_copied(monkeypatch):
    from lm_eval import evaluator

    from evalparity import lmeval_patches

    calls = []

    def add_env_info(storage):
        calls.append(1)
        storage.update({"pretty_env_info": "torch ...", "versions": {"lm_eval": "x"}})

    monkeypatch.setattr(evaluator, "add_env_info", add_env_info)
    assert lmeval_patches.cache_env_info() and lmeval_patches.cache_env_info()
    first, second = {"results": 1}, {"results": 2}
    evaluator.add_env_info(first)
    evaluator.add_env_info(second)
    assert len(calls) == 1
    assert second == {"results": 2, "pretty_env_info": "torch ...", "versions": {"lm_eval": "x"}}
    first["versions"]["lm_eval"] = "changed"  # each result has its own copy
    third = {}
    evaluator.add_env_info(third)
    assert second["versions"]["lm_eval"] == third["versions"]["lm_eval"] == "x" and len(calls) == 1
