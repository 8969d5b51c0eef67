"""Resolve --model (and a cell's ``model=``) to a local folder the backends load, and the context length all
cells will use; check that a cell's own checkpoint tokenizes as the run's model does."""

from __future__ import annotations

import json
from pathlib import Path

from evalparity.data import embedded
from evalparity.errors import EvalParityError


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~")) or model.count("/") != 1 or Path(model).exists()


def check_local_model(model: str | None) -> Path | None:
    """A local model folder (a ``--model`` that looks like a path) that exists and has a config.json, else one
    line; None for the embedded model or a hub id. Cheap: the run asks it before checking the tasks' data."""
    if model is None or not _looks_like_path(model):
        return None
    path = Path(model).expanduser()
    if not path.exists():
        raise EvalParityError(f"model path {model} does not exist: give a local model folder or a hub id "
                              "(org/name)")
    if not (path / "config.json").exists():
        raise EvalParityError(f"{model} has no config.json: give a Hugging Face model folder")
    return path


def resolve_model(model: str | None, max_length: int) -> tuple[str, Path | str, int]:
    """(model id for the report, path or hub id to load, max length capped at the model's)."""
    if model is None:
        path = embedded.model_path()
        return embedded.MODEL_ID, path, _cap(path, max_length)
    if _looks_like_path(model):
        path = check_local_model(model)
        # the resolved path is the model's name: ./m from two folders is two models, ./m and /abs/m one
        return str(path.resolve()), path.resolve(), _cap(path, max_length)
    # A hub id: it must be reachable or already in the local HF cache.
    try:
        # heavy: huggingface_hub (hub ids only); it reads HF_HUB_OFFLINE at import, which cli sets first
        from huggingface_hub import snapshot_download

        local = Path(snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as err:  # noqa: BLE001
        raise EvalParityError(f"model {model} could not be fetched from the hub nor found in its cache "
                              f"({type(err).__name__}): download it where the hub is reachable and pass its "
                              "folder with --model PATH") from None
    return model, local, _cap(local, max_length)


def _cap(path: Path, max_length: int) -> int:
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return max_length
    limit = cfg.get("max_position_embeddings") or cfg.get("n_positions")
    return min(max_length, int(limit)) if limit else max_length


# A text whose ids show a tokenizer's BOS/EOS policy, normalisation and pre-tokenisation at once: spaces,
# digits, case, punctuation, a newline and non-ASCII.
PROBE_TEXT = "Question: What is 12 + 30?\nAnswer: 42, the Ünïcode  answer."


def _tokenizer_files(fingerprint: dict) -> dict:
    return {n: e for n, e in (fingerprint.get("files") or {}).items() if e.get("kind") == "tokenizer"}


def tokenizer_difference(run_path: Path | str, run_fp: dict, cell_path: Path | str, cell_fp: dict) -> str | None:
    """What differs between the tokenizer of the run's model and a cell's checkpoint, in words (None when
    nothing does): the vocabulary (size, then the first token whose id differs), the special tokens, BOS and
    EOS, and the ids of a probe text (which shows the BOS policy and normalisation). Byte-identical tokenizer
    files (their fingerprints) are the same tokenizer without loading either."""
    mine, theirs = _tokenizer_files(run_fp), _tokenizer_files(cell_fp)
    if mine and mine == theirs:
        return None
    from transformers import AutoTokenizer  # heavy: transformers; only for a cell with model=

    try:
        a, b = AutoTokenizer.from_pretrained(str(run_path)), AutoTokenizer.from_pretrained(str(cell_path))
    except Exception as err:  # noqa: BLE001 - a tokenizer that cannot be read is a difference too
        said = str(err).splitlines()[0][:100] if str(err) else ""
        return f"its tokenizer cannot be read ({type(err).__name__}: {said})"
    va, vb = a.get_vocab(), b.get_vocab()
    if len(va) != len(vb):
        return f"its vocabulary has {len(vb):,} tokens, the run model's {len(va):,}"
    token = next((t for t in sorted(va) if va[t] != vb.get(t)), None)
    if token is not None:
        return f"token {token!r} is id {vb.get(token)} there, {va[token]} in the run model's"
    for role in ("bos", "eos", "unk", "pad"):
        x, y = getattr(a, f"{role}_token", None), getattr(b, f"{role}_token", None)
        if x != y:
            return f"its {role.upper()} token is {y!r}, the run model's {x!r}"
    if sorted(map(str, a.all_special_tokens)) != sorted(map(str, b.all_special_tokens)):
        extra = sorted(set(map(str, b.all_special_tokens)) ^ set(map(str, a.all_special_tokens)))
        return f"its special tokens differ ({', '.join(map(repr, extra[:3]))})"
    ia, ib = a(PROBE_TEXT).input_ids, b(PROBE_TEXT).input_ids
    if ia != ib:
        at = next((i for i, (x, y) in enumerate(zip(ia, ib)) if x != y), min(len(ia), len(ib)))
        return (f"it encodes the same text otherwise ({len(ib)} ids, the run model's {len(ia)}; first difference "
                f"at id {at}: BOS policy, normalisation or pre-tokenisation)")
    return None


def check_cell_model(cell: str, typed: str, run: tuple[Path | str, dict], own: tuple[Path | str, dict],
                     own_max: int, max_length: int) -> None:
    """A cell's ``model=`` checkpoint must be another checkpoint of the run's model: the same tokenizer
    (``tokenizer_difference``) and room for the run's context length. One line naming what differs."""
    why = tokenizer_difference(run[0], run[1], own[0], own[1])
    if why:
        raise EvalParityError(f"cell {cell}: model={typed} is not tokenized as the run's model ({why}): give a "
                              "checkpoint of the run's model with its tokenizer (e.g. copy the run model's "
                              "tokenizer files into it)")
    if own_max < max_length:
        raise EvalParityError(f"cell {cell}: model={typed} allows {own_max} tokens of context, the run uses "
                              f"{max_length}: pass --max-length {own_max} (one context length on every cell)")
