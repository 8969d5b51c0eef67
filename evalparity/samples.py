"""lm-eval samples -> the per-sample table; the alignment check; reading plain lm-eval output directories.

Every cell, whether ``evalparity run`` made it or plain ``lm_eval --log_samples`` did, is read through the
same path: lm-eval's own ``results_*.json`` and ``samples_<task>_*.jsonl`` files. That is what makes
``evalparity compare`` give the same verdicts as ``evalparity run`` for the same cells.

The table has one row per (task, filter, doc_id, choice):
- loglikelihood / multiple_choice tasks: one row per choice, with the loglikelihood and is_greedy;
- generate_until tasks: one row per doc (choice 0), with the generated text and, where the run recorded
  them, the generated token ids;
- every row: lm-eval's doc, prompt and target hashes, the gold index or target, and the doc's metric
  values as ``m:<metric>`` columns.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from evalparity.errors import EvalParityError
from evalparity.files import atomic_target

KEY = ["task", "filter", "doc_id", "choice"]
HASHES = ["doc_hash", "prompt_hash", "target_hash"]
METRIC_PREFIX = "m:"


# ---------------------------------------------------------------- reading lm-eval output directories
# lm-eval names a run's files by the moment it started (``EvaluationTracker.date_id``, an ISO time with
# ':' replaced by '-'): ``results_<stamp>.json`` and ``samples_<task>_<stamp>.jsonl``, the same stamp for both.
STAMP = r"\d{4}-\d{2}-\d{2}T[\d\-\.]+"
RESULTS_RE = re.compile(rf"results_({STAMP})\.json$")
SAMPLES_RE = re.compile(rf"samples_(.+)_({STAMP})\.jsonl$")
PICK = "@"  # DIR@STAMP picks one of several runs in DIR


def split_pick(arg: str | Path) -> tuple[Path, str | None]:
    """``DIR@STAMP`` -> (DIR, STAMP); a plain DIR (or a DIR whose own name has an '@' and exists) -> (DIR, None)."""
    text = str(arg)
    if PICK not in text or Path(text).exists():
        return Path(text), None
    folder, _, stamp = text.rpartition(PICK)
    return Path(folder), stamp


def _stamp_of(p: Path) -> tuple[str, str]:
    """(task or '', stamp) of a results or samples file; a file without lm-eval's stamp has stamp ''."""
    if m := RESULTS_RE.match(p.name):
        return "", m.group(1)
    if m := SAMPLES_RE.match(p.name):
        return m.group(1), m.group(2)
    return (p.stem[len("samples_"):] if p.name.startswith("samples_") else ""), ""


def find_lm_eval_files(path: Path, stamp: str | None = None) -> tuple[Path, dict[str, Path]]:
    """The ``results_*.json`` under ``path`` and, per task, its ``samples_<task>_*.jsonl``: of the one lm-eval
    run there, or of the run started at ``stamp`` (``DIR@STAMP``).

    Two runs into one ``--output_path`` (fp32 on two tasks, then bf16 on one) leave two stamps side by side:
    taking the newest file per task would mix the runs into one cell, so that is refused, naming the stamps."""
    path = Path(path)
    if not path.exists():
        raise EvalParityError(f"{path} does not exist: give a directory that lm-eval wrote with --log_samples")
    results = sorted(path.rglob("results_*.json"), key=lambda p: p.name)
    samples = sorted(path.rglob("samples_*.jsonl"), key=lambda p: p.name)
    if not samples:
        raise EvalParityError(f"no samples_*.jsonl under {path}: rerun lm-eval with --log_samples "
                              "--output_path, or point at the folder it wrote")
    if not results:
        raise EvalParityError(f"no results_*.json under {path}: point at the folder lm-eval wrote "
                              "(it holds results_<date>.json beside the samples)")
    # lm-eval writes each model's run into a folder of its own: two such folders are two runs, and picking
    # one by directory order would make the verdict depend on folder names.
    runs = sorted({p.parent for p in results} | {p.parent for p in samples})
    if len(runs) > 1:
        shown = ", ".join(str(r.relative_to(path)) if r != path else "." for r in runs[:5])
        raise EvalParityError(f"{path} holds {len(runs)} lm-eval runs ({shown}{', ...' if len(runs) > 5 else ''}): "
                              f"point at one of them, e.g. {runs[0]}")
    stamps = sorted({_stamp_of(p)[1] for p in results + samples})
    if stamp is None and len(stamps) > 1:
        raise EvalParityError(f"{path} holds {len(stamps)} lm-eval runs (started {', '.join(stamps)}), "
                              f"written into one --output_path: pick one as {path}{PICK}<start>, "
                              f"e.g. {path}{PICK}{stamps[-1]}")
    if stamp is not None:
        if stamp not in stamps:
            raise EvalParityError(f"{path} holds no lm-eval run started {stamp} (it holds {', '.join(stamps)}): "
                                  f"pick one of those as {path}{PICK}<start>")
        results = [p for p in results if _stamp_of(p)[1] == stamp]
        samples = [p for p in samples if _stamp_of(p)[1] == stamp]
        if not results or not samples:
            raise EvalParityError(f"the lm-eval run started {stamp} in {path} has no "
                                  f"{'results_' + stamp + '.json' if not results else 'samples_*_' + stamp + '.jsonl'}"
                                  f" (it did not finish): pick another run, or rerun it")
    by_task = {_stamp_of(p)[0]: p for p in samples}
    return results[-1], by_task


class SampleFile(list):
    """One task's samples as read from its jsonl file: the sample dicts, plus the file (``path``) and each
    sample's line number in it (``lines``), so that an error about a sample can name where it is."""

    def __init__(self, rows=(), path: Path | None = None, lines: list[int] | None = None):
        super().__init__(rows)
        self.path = path
        self.lines = lines if lines is not None else list(range(1, len(self) + 1))

    def where(self, i: int, task: str) -> str:
        """``file:line`` of sample ``i`` (or the task and the sample's position, for samples not from a file)."""
        if self.path is None:
            return f"the samples of task {task}, sample {i + 1},"
        return f"{self.path}:{self.lines[i] if i < len(self.lines) else i + 1}"


def read_jsonl(path: Path) -> SampleFile:
    out, lines = [], []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise EvalParityError(f"{path}:{i} is not valid JSON ({err.msg}): the file is truncated or "
                                      "corrupt; rerun that task or remove the file") from None
            if not isinstance(row, dict):
                raise EvalParityError(f"{path}:{i} is a JSON {type(row).__name__}, not a sample (an object): the "
                                      "file is corrupt or not lm-eval's samples; rerun that task or remove the file")
            out.append(row)
            lines.append(i)
    return SampleFile(out, Path(path), lines)


def read_lm_eval_dir(path: Path, stamp: str | None = None) -> tuple[dict, dict[str, SampleFile]]:
    """lm-eval's results and, per task, its samples (each a ``SampleFile``, which knows its file), of the one
    run in ``path`` or of the run started at ``stamp`` (see ``find_lm_eval_files``)."""
    results_path, by_task = find_lm_eval_files(path, stamp)
    try:
        results = json.loads(results_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise EvalParityError(f"{results_path} is truncated or corrupt ({type(err).__name__}): rerun lm-eval "
                              "into that folder, or point at a complete one") from None
    if not isinstance(results, dict):
        raise EvalParityError(f"{results_path} is a JSON {type(results).__name__}, not lm-eval's results (an "
                              "object): rerun lm-eval into that folder, or point at a complete one")
    return results, {task: read_jsonl(p) for task, p in by_task.items()}


# ---------------------------------------------------------------- samples -> table
def group_of_tasks(results: dict) -> dict[str, str]:
    """leaf task -> its top-level group (itself when it is not in a group), from ``group_subtasks``."""
    subtasks: dict[str, list[str]] = results.get("group_subtasks", {}) or {}
    parent: dict[str, str] = {}
    for group, members in subtasks.items():
        for m in members:
            parent[m] = group

    def top(t: str) -> str:
        seen = set()
        while t in parent and t not in seen:
            seen.add(t)
            t = parent[t]
        return t

    return {t: top(t) for t in set(parent) | set(subtasks) if t not in subtasks or not subtasks[t]}


def _scalar(v) -> tuple[str, float | None]:
    """A per-sample metric value read as a number: ("num", x) for a number, a bool or a string that parses
    as one ("0.0", " 1 ", "nan"); ("text", None) for any other string; ("other", None) for what is not a
    scalar (None, or the lists and dicts that corpus-level metrics such as bleu keep per sample)."""
    if isinstance(v, (bool, int, float)):
        try:
            return "num", float(v)
        except OverflowError:  # an integer beyond float range
            return "num", math.copysign(math.inf, v)
    if isinstance(v, str):
        try:
            return "num", float(v.strip())
        except ValueError:
            return "text", None
    return "other", None


def _metric_values(task: str, samples: list[dict]) -> list[dict[str, float]]:
    """Each sample's metric values as floats (``m:<metric>`` columns to be), field by field.

    A field whose values are numbers, or strings of numbers (some harnesses write "0.0"), is read; a field
    with no number at all (text, lists: corpus-level metrics) is left out, as it cannot be compared per
    sample. A field that mixes numbers with a string that is not one is refused, naming the file, the field
    and the first such line: reading it would drop those samples from the comparison without a word."""
    parsed: list[dict[str, float]] = [{} for _ in samples]
    has_number: set[str] = set()
    first_text: dict[str, tuple[int, object]] = {}
    for i, s in enumerate(samples):
        for m in s.get("metrics", []) or []:
            if not isinstance(m, str):
                continue
            kind, x = _scalar(s.get(m))
            if kind == "num":
                parsed[i][m] = x
                has_number.add(m)
            elif kind == "text":
                first_text.setdefault(m, (i, s.get(m)))
    for m, (i, value) in first_text.items():
        if m in has_number:
            where = samples.where(i, task) if isinstance(samples, SampleFile) else \
                f"the samples of task {task}, sample {i + 1},"
            shown = repr(value if len(value) <= 40 else value[:40] + "...")
            raise EvalParityError(f"{where} field {m!r} is {shown}, not a number, where other samples of task "
                                  f"{task} have numbers in that field: fix or remove that line (it would "
                                  "otherwise be left out of the comparison), then rerun")
    return parsed


def _args(sample: dict) -> list[list]:
    """Request arguments, whether in lm-eval's in-memory form (tuples) or its jsonl form (gen_args_i)."""
    a = sample.get("arguments", [])
    if isinstance(a, dict):
        return [[v[f"arg_{j}"] for j in range(len(v))] for _, v in sorted(a.items(), key=lambda kv: int(kv[0][9:]))]
    return [list(x) for x in a]


def _gold_index(target, continuations: list[str]) -> int | None:
    try:
        return int(target)
    except (TypeError, ValueError):
        pass
    for i, c in enumerate(continuations):
        if c.strip() == str(target).strip():
            return i
    return None


def _output_type(sample: dict, config: dict | None) -> str:
    if config and config.get("output_type"):
        return config["output_type"]
    args = _args(sample)
    if args and len(args[0]) > 1 and isinstance(args[0][1], dict):
        return "generate_until"
    if args and len(args[0]) == 1:
        return "loglikelihood_rolling"
    return "multiple_choice" if len(args) > 1 else "loglikelihood"


def samples_to_table(
    task_samples: dict[str, list[dict]],
    results: dict,
    generated_ids: dict[str, list[int]] | None = None,
) -> pd.DataFrame:
    """Build the per-sample table. ``generated_ids`` maps a prompt (context) to its generated token ids.
    ``task_samples`` as ``read_lm_eval_dir`` gives them (``SampleFile``s) lets an error name the file and
    line of the sample at fault."""
    configs = results.get("configs") if isinstance(results.get("configs"), dict) else {}
    try:
        groups = group_of_tasks(results)
    except (AttributeError, TypeError):  # a group_subtasks of another shape: no groups
        groups = {}
    rows: list[dict] = []
    for task, samples in task_samples.items():
        values = _metric_values(task, samples)
        for i, (s, metric_values) in enumerate(zip(samples, values)):
            try:
                rows += _sample_rows(task, s, metric_values, configs.get(task), groups, generated_ids)
            except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
                where = samples.where(i, task) if isinstance(samples, SampleFile) else \
                    f"the samples of task {task}, sample {i + 1},"
                what = f"no {err.args[0]!r} field" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
                raise EvalParityError(f"{where} is not an lm-eval sample evalparity can read ({what[:120]}): the "
                                      "file is corrupt or not lm-eval's --log_samples output; rerun that "
                                      "task") from None
    if not rows:
        raise EvalParityError("the lm-eval output holds no samples: check --limit and the task names")
    df = pd.DataFrame(rows)
    for col in ("loglikelihood",):
        if col not in df:
            df[col] = np.nan
    for col in ("generated_text", "response", "continuation", "generated_ids", "is_greedy", "gold"):
        if col not in df:
            df[col] = None
    df["gold"] = pd.array(df["gold"], dtype="Int64")
    df = df.sort_values(KEY, kind="stable").reset_index(drop=True)
    dup = df.duplicated(KEY)
    if dup.any():
        k = df.loc[dup, KEY].iloc[0].to_dict()
        raise EvalParityError(f"two samples share the key {k}: the lm-eval output mixes two runs of one task; "
                              "keep one samples file per task")
    return df


def _sample_rows(task: str, s: dict, metric_values: dict[str, float], config, groups: dict[str, str],
                 generated_ids: dict[str, list[int]] | None) -> list[dict]:
    """The table rows of one sample: one per choice, or one for a generation."""
    out_type = _output_type(s, config if isinstance(config, dict) else None)
    base = {
        "task": task, "group": groups.get(task, task), "filter": s.get("filter", "none"),
        "doc_id": int(s["doc_id"]), "output_type": out_type,
        **{h: str(s.get(h, "")) for h in HASHES},
        "target": str(s.get("target", "")),
    }
    for m, v in metric_values.items():
        base[METRIC_PREFIX + m] = v
    args = _args(s)
    resps = s.get("filtered_resps", [])
    if out_type == "generate_until":
        context = args[0][0] if args else ""
        raw = s.get("resps", [[None]])
        raw_text = raw[0][0] if raw and raw[0] else None
        ids = (generated_ids or {}).get(context)
        return [base | {
            "choice": 0, "context": context, "continuation": None,
            "generated_text": raw_text if isinstance(raw_text, str) else str(raw_text),
            "response": str(resps[0]) if resps else None,
            "generated_ids": ids,
        }]
    continuations = [a[1] if len(a) > 1 else "" for a in args]
    gold = _gold_index(s.get("target"), continuations)
    rows = []
    for i, a in enumerate(args):
        r = resps[i] if i < len(resps) else None
        if isinstance(r, (list, tuple)):
            ll, greedy = r[0], (bool(r[1]) if len(r) > 1 else None)
        else:
            ll, greedy = r, None
        rows.append(base | {
            "choice": i, "context": a[0], "continuation": continuations[i],
            "loglikelihood": _float(ll), "is_greedy": greedy, "gold": gold,
        })
    return rows


def _float(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def metric_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith(METRIC_PREFIX)]


def write_table(df: pd.DataFrame, path: Path) -> None:
    """Parquet through pyarrow, published atomically (``files.atomic_target``)."""
    with atomic_target(Path(path)) as tmp:
        df.to_parquet(tmp, engine="pyarrow", index=False)


def _unreadable(path: Path, err: Exception) -> EvalParityError:
    return EvalParityError(f"{path} is truncated or corrupt ({type(err).__name__}): remove {Path(path).parent} and "
                           "rerun the same command to redo that cell")


REQUIRED_COLUMNS = ("cell", *KEY, *HASHES, "group", "output_type")


def check_table(path: Path) -> None:
    """Read a parquet table's footer and schema (cheap): a one-line error if it is truncated or corrupt, or
    is not a per-sample table (it lacks a column the statistics read)."""
    import pyarrow.parquet as pq  # heavy: pyarrow

    try:
        names = pq.read_schema(path).names
    except (OSError, ValueError, Exception) as err:  # noqa: BLE001 - pyarrow's ArrowInvalid and kin
        raise _unreadable(path, err) from None
    lacking = [c for c in REQUIRED_COLUMNS if c not in names]
    if lacking:
        raise EvalParityError(f"{path} is not a per-sample table of evalparity (it lacks the column "
                              f"{lacking[0]!r}): remove {Path(path).parent} and rerun the same command to redo "
                              "that cell")


def read_table(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path, engine="pyarrow")
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 - pyarrow's ArrowInvalid (truncated file) and kin
        raise _unreadable(path, err) from None


# ---------------------------------------------------------------- alignment across cells
def check_alignment(tables: dict[str, pd.DataFrame]) -> None:
    """Every cell must hold the same (task, filter, doc_id, choice) set with the same hashes.

    Raises a one-line error naming the first doc that differs and why; returns None when aligned.
    """
    names = list(tables)
    if len(names) < 2:
        return
    ref_name = names[0]
    ref = tables[ref_name].set_index(KEY)[HASHES]
    for name in names[1:]:
        other = tables[name].set_index(KEY)[HASHES]
        missing = ref.index.difference(other.index)
        extra = other.index.difference(ref.index)
        if len(missing) or len(extra):
            key, where, lacks = (missing[0], ref_name, name) if len(missing) else (extra[0], name, ref_name)
            raise EvalParityError(
                f"cells are not aligned: {_key_str(key)} is in {where} but not in {lacks}: "
                "run every cell with the same tasks, --limit and --num-fewshot (or --force the stale cell)")
        joined = ref.merge(other, left_index=True, right_index=True, suffixes=("", "_other"))
        for h in HASHES:
            bad = joined[h] != joined[h + "_other"]
            if bad.any():
                key = joined.index[bad.to_numpy()][0]
                what = {"doc_hash": "document", "prompt_hash": "prompt", "target_hash": "target"}[h]
                raise EvalParityError(
                    f"cells are not aligned: {_key_str(key)} has a different {what} in {ref_name} and "
                    f"{name} ({h} differs): the cells used different task versions, data or few-shot "
                    "settings; rerun them with one spec")


def _key_str(key) -> str:
    task, filt, doc_id, choice = key
    return f"task {task} doc {doc_id}" + (f" (filter {filt})" if filt != "none" else "")
