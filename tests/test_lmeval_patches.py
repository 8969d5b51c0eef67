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


def test_picked_docs_are_lm_evals_own_selection_on_generated_cases():
    """The patched ``Task.doc_iterator`` against lm-eval's own, on generated index lists (unsorted, repeated,
    negative, empty, out of range) over a list and a ``datasets.Dataset``, with ranks and world sizes: the same
    (number, doc) pairs, or lm-eval's own error."""
    import random
    from types import SimpleNamespace

    import datasets
    from lm_eval.api.task import Task

    from evalparity import lmeval_patches

    original = Task.__dict__["doc_iterator"]
    picked = lmeval_patches._picking_doc_iterator(original)
    rng = random.Random(26)
    rows = [{"i": i, "text": f"doc {i}"} for i in range(300)]
    for docs in (rows, datasets.Dataset.from_list(rows)):
        fake = SimpleNamespace(eval_docs=docs, config=SimpleNamespace(task="t"))
        for case in range(60):
            k = rng.randint(0, 40)
            samples = [rng.randint(-3, 299) for _ in range(k)]
            if case % 10 == 0:
                samples.append(300 + case)  # out of range: lm-eval's assertion
            world = rng.choice([1, 1, 2, 3])
            kw = {"rank": rng.randrange(world), "world_size": world,
                  "samples": lmeval_patches.IndexSet(samples) if case % 2 else samples}
            try:
                want = list(original(fake, **kw))
            except AssertionError:
                try:
                    list(picked(fake, **kw))
                except AssertionError:
                    continue
                raise AssertionError(f"case {case}: lm-eval refused {samples}, the patch did not") from None
            got = list(picked(fake, **kw))
            assert got == want, f"case {case} ({type(docs).__name__}, samples {samples}, {kw}): {got} != {want}"
    assert lmeval_patches.pick_docs() and lmeval_patches.pick_docs()
    assert getattr(Task.doc_iterator, "evalparity_picked", False)
    Task.doc_iterator = original  # this test process's lm-eval as it was


def test_doc_picking_stays_off_for_an_lm_eval_that_numbers_docs_otherwise(monkeypatch):
    """lm-eval's main numbers the chosen docs by their index (``(i, x) for i, x in ... if i in samples``); a
    ``python=`` cell may run it. The patch reproduces 0.4.13's numbering, so it is put only on that code."""
    from lm_eval.api import task as task_mod

    from evalparity import lmeval_patches

    def newer(self, *, rank=0, limit=None, world_size=1, samples=None):
        return ((i, x) for i, x in enumerate(self.eval_docs) if i in samples)

    assert lmeval_patches._is_checked_selection(task_mod.Task.__dict__["doc_iterator"])
    assert not lmeval_patches._is_checked_selection(newer)
    monkeypatch.setattr(task_mod.Task, "doc_iterator", newer)
    assert not lmeval_patches.pick_docs() and task_mod.Task.doc_iterator is newer
