"""Task resolution and the data preflight, through lm-eval's own TaskManager.

Any lm-eval task, group or tag name works, plus the YAMLs in ``task_configs/`` and in ``--include-path``.
The preflight builds each requested task once in the parent process (with the dataset mirrors active), so
an unknown name, a dataset that is neither reachable nor mirrored, or a task with no documents fails
before any model is loaded, with one line that names every such problem at once.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass
from pathlib import Path

from evalparity import task_index
from evalparity.data import mirrors
from evalparity.errors import EvalParityError
from evalparity.quiet import quiet

TASK_CONFIGS_DIR = Path(__file__).resolve().parent.parent / "task_configs"


def include_paths(extra: tuple[str, ...] | list[str]) -> list[str]:
    paths = [str(TASK_CONFIGS_DIR)] if TASK_CONFIGS_DIR.is_dir() else []
    for p in extra:
        if not Path(p).is_dir():
            raise EvalParityError(f"--include-path {p} is not a directory: give a folder of lm-eval task YAMLs")
        paths.append(str(Path(p).resolve()))
    return paths


def config_digest(extra: tuple[str, ...] | list[str]) -> str:
    """A sha256 over every file of the task folders the run reads (``task_configs/`` and each
    ``--include-path``: YAMLs and the Python or Jinja files beside them), by path within its folder: a task
    whose YAML changed (``max_gen_toks`` 12 -> 1) is another experiment, though its name is the same."""
    h = hashlib.sha256()
    for i, root in enumerate(include_paths(extra)):
        for path in sorted(Path(root).rglob("*")):
            rel = path.relative_to(root)
            if not path.is_file() or "__pycache__" in rel.parts or any(p.startswith(".") for p in rel.parts):
                continue
            h.update(f"{i}:{rel.as_posix()}\0".encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


def task_manager(extra_paths: tuple[str, ...] | list[str] = ()):
    from lm_eval.tasks import TaskManager  # heavy: lm_eval

    with quiet(), task_index.cached():  # lm-eval's own task tree is indexed once per tree state, not per process
        return TaskManager(include_path=include_paths(extra_paths))


@dataclass(frozen=True)
class TaskPlan:
    """What the preflight found: leaf tasks with their document counts, and their groups."""

    leaves: dict[str, int]
    groups: dict[str, list[str]]
    metrics: frozenset[str] = frozenset()  # every per-sample metric the tasks declare (lm-eval's higher_is_better)


# Split words that lm-eval appends to a group's name when the group evaluates one split of its dataset
# (``ceval-valid``, ``mmmu_val``). Users type the benchmark's name (``ceval``); lm-eval registers only the
# suffixed one.
SPLIT_SUFFIXES = ("valid", "validation", "val", "dev", "test")


def split_suffixed(name: str, tm) -> str | None:
    """The one lm-eval group or tag named ``name`` plus a split suffix (``ceval`` -> ``ceval-valid``), or None.

    Conservative on purpose: only when ``name`` itself is not registered, and only when exactly one
    candidate exists. Single tasks are not candidates: in lm-eval 0.4.13 a task whose name ends in a split
    word names a subject, not a split (``arabicmmlu_driving_test`` is the "driving test" subject), and
    resolving ``arabicmmlu_driving`` to it would silently run something else than asked.
    """
    if name in set(tm.all_tasks) or Path(name).is_file():
        return None
    collections = set(tm.all_groups) | set(tm.all_tags)
    hits = [f"{name}{sep}{suffix}" for sep in ("-", "_") for suffix in SPLIT_SUFFIXES
            if f"{name}{sep}{suffix}" in collections]
    return hits[0] if len(hits) == 1 else None


def resolve_names(names: list[str], tm) -> tuple[list[str], dict[str, str]]:
    """The names to hand lm-eval, and what was resolved (typed name -> lm-eval name), in order.

    A name resolved to one already given is dropped, so ``ceval,ceval-valid`` runs the group once.
    """
    out: list[str] = []
    resolved: dict[str, str] = {}
    for n in names:
        real = split_suffixed(n, tm)
        if real is not None:
            resolved[n] = real
        real = real or n
        if real not in out:
            out.append(real)
    return out, resolved


def check_names(names: list[str], tm) -> None:
    if not names:
        raise EvalParityError("no tasks given: pass --tasks with lm-eval task or group names, e.g. hellaswag")
    known = set(tm.all_tasks)
    unknown = [n for n in names if n not in known and not Path(n).is_file()]
    if unknown:
        hints = []
        for n in unknown:
            close = difflib.get_close_matches(n, known, n=1)
            hints.append(f"{n!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise EvalParityError(f"unknown task {', '.join(hints)}: see `lm-eval ls tasks`, or add its YAML "
                              "with --include-path DIR")


def preflight(names: list[str], tm, mirror_roots: list[Path], limit: int | None,
              num_fewshot: int | None = None) -> TaskPlan:
    """Build every requested task once (data included) and check that each has documents."""
    check_names(names, tm)
    mirrors.activate(mirror_roots)
    leaves: dict[str, int] = {}
    groups: dict[str, list[str]] = {}
    metrics: set[str] = set()
    missing: list[mirrors.MissingDataset] = []
    empty: list[str] = []
    for name in names:
        try:
            with quiet():
                loaded = tm.load([name])
        except mirrors.MissingDataset as err:
            missing.append(err)
            continue
        except EvalParityError:
            raise
        except Exception as err:  # noqa: BLE001 - lm-eval raises many kinds; name the task and the cause
            cause = _root_cause(err)
            if isinstance(cause, mirrors.MissingDataset):
                missing.append(cause)
                continue
            first = str(cause).splitlines()[0] if str(cause) else ""
            raise EvalParityError(f"task {name!r} failed to load ({type(cause).__name__}: {first}): "
                                  "check its YAML and data") from None
        groups.update(loaded.get("group_map", {}))
        for tname, task in loaded["tasks"].items():
            n = len(task.eval_docs)
            metrics.update(task.higher_is_better())  # the metrics lm-eval can aggregate: the per-sample keys
            if n == 0:
                empty.append(tname)
            if "/" in tname or "\0" in tname:  # lm-eval files its per-sample output under the task's name
                raise EvalParityError(f"task {tname!r} has a path separator in its name, under which lm-eval cannot "
                                      "save its per-sample output: rename it in its YAML (task:)")
            leaves[tname] = n
            shots = num_fewshot if num_fewshot is not None else (task.config.num_fewshot or 0)
            if shots > 0 and not _has_fewshot_docs(task):
                raise EvalParityError(
                    f"task {tname} asks for {shots}-shot examples but its data has no few-shot split "
                    f"({task.config.fewshot_split or task.config.training_split or 'none'}): pass --num-fewshot 0, "
                    "or add that split to the mirror")
    if missing:
        if len(missing) == 1:
            raise EvalParityError(str(missing[0]))
        names_ = ", ".join(m.dataset for m in missing)
        where = "; ".join(" or ".join(str(p) for p in m.looked) or "(no mirror given)" for m in missing)
        raise EvalParityError(f"datasets {names_} are not reachable (no network to the hub) and have no mirror "
                              f"(looked for {where}): put <split>.jsonl files there and pass --datasets-dir DIR")
    if empty:
        raise EvalParityError(f"task {empty[0]} has no documents in its evaluation split: check its data files "
                              "and split names")
    return TaskPlan(leaves, groups, frozenset(metrics))


def _has_fewshot_docs(task) -> bool:
    try:
        docs = task.fewshot_docs()
    except Exception:  # noqa: BLE001 - a missing split surfaces in several ways
        return False
    return docs is not None and len(docs) > 0


def _root_cause(err: BaseException) -> BaseException:
    seen = set()
    while (err.__cause__ or err.__context__) and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, mirrors.MissingDataset):
            return err
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return err
