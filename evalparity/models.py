"""Resolve --model to a local folder both backends load, and the context length both will use."""

from __future__ import annotations

import json
from pathlib import Path

from evalparity.data import embedded
from evalparity.errors import EvalParityError


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~")) or model.count("/") != 1 or Path(model).exists()


def resolve_model(model: str | None, max_length: int) -> tuple[str, Path | str, int]:
    """(model id for the report, path or hub id to load, max length capped at the model's)."""
    if model is None:
        path = embedded.model_path()
        model_id = f"{embedded.MODEL_NAME} (embedded, from {embedded.MODEL_PIN})"
        return model_id, path, _cap(path, max_length)
    if _looks_like_path(model):
        path = Path(model).expanduser()
        if not path.exists():
            raise EvalParityError(f"model path {model} does not exist: give a local model folder or a hub id "
                                  "(org/name)")
        if not (path / "config.json").exists():
            raise EvalParityError(f"{model} has no config.json: give a Hugging Face model folder")
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
