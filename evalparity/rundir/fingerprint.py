"""The model's fingerprint: what the cells' results depend on besides the spec, the model's resolved source and
its files' contents. Hashing a 100 GB model takes minutes, so each file's hash is cached under the evalparity
cache directory, keyed by its resolved path, size, mtime, ctime and inode: a file rewritten in place changes at
least its ctime, so it is hashed again."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

from evalparity.errors import EvalParityError
from evalparity.files import HashCache, stamp
from evalparity.printable import visible

logger = logging.getLogger(__name__)

CONFIG_FILES = ("config.json", "generation_config.json", "preprocessor_config.json")
TOKENIZER_RE = re.compile(r"(tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab.*|merges\.txt|"
                          r"chat_template.*|.*\.model|.*\.tiktoken)$")
WEIGHT_RE = re.compile(r".*\.(safetensors|bin|pt|pth|gguf|index\.json)$")
CODE_RE = re.compile(r".*\.py$")  # modelling code of trust_remote_code models


def _kind(name: str) -> str | None:
    if name in CONFIG_FILES:
        return "config"
    if WEIGHT_RE.fullmatch(name):
        return "weights"
    if TOKENIZER_RE.fullmatch(name):
        return "tokenizer"
    if CODE_RE.fullmatch(name):
        return "code"
    return None


@dataclass
class HashStats:
    """How much a fingerprint had to read (for the message and the tests)."""

    hashed_bytes: int = 0
    cached_bytes: int = 0
    seconds: float = 0.0


def model_fingerprint(model_path: Path | str, source: str, stats: HashStats | None = None) -> dict:
    """The fingerprint of the model folder ``model_path``: ``source`` (the resolved absolute path, or the
    hub id), the hub revision when the folder is a hub-cache snapshot, and size and sha256 of each config,
    tokenizer, weight and code file at the top level of the folder; ``digest`` hashes all of it."""
    folder = Path(model_path)
    stats = stats or HashStats()
    revision = folder.name if folder.parent.name == "snapshots" else None
    files = sorted(p for p in folder.iterdir() if not p.name.startswith(".") and _kind(p.name) and p.is_file())
    cache = HashCache()
    todo = []
    entries: dict[str, dict] = {}
    for p in files:
        try:
            st = stamp(p)
        except OSError as err:
            raise _unreadable(err, folder) from None
        hit = cache.get(p, st)
        if hit is not None:
            entries[p.name] = {"kind": _kind(p.name), "size": st[0], "sha256": hit}
            stats.cached_bytes += st[0]
        else:
            todo.append((p, st))
    if todo:
        total = sum(st[0] for _, st in todo)
        if total > 1 << 30:
            logger.info(f"hashing {len(todo)} model file(s), {total / 2**30:.1f} GiB (once: cached by path, size, "
                        "times, inode and device) ...")
        t0 = time.perf_counter()
        try:
            hashed = cache.sha256_all([p for p, _ in todo])
        except OSError as err:
            raise _unreadable(err, folder) from None
        finally:
            cache.save()  # what was hashed before an error or an interrupt is kept
        for (p, _), (digest, st, cached) in zip(todo, hashed):
            entries[p.name] = {"kind": _kind(p.name), "size": st[0], "sha256": digest}
            if cached:  # the same file under another name (a link), hashed just before
                stats.cached_bytes += st[0]
            else:
                stats.hashed_bytes += st[0]
        stats.seconds += time.perf_counter() - t0
    if not any(e["kind"] == "weights" for e in entries.values()):
        logger.warning(f"no weight files found at the top of {folder}: the fingerprint holds its config "
                       "and tokenizer only")
    body = {"source": source, "revision": revision, "files": entries}
    body["digest"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return body


def _unreadable(err: OSError, folder: Path) -> EvalParityError:
    """A model file that cannot be read (gone meanwhile, no permission, an I/O error), in one line."""
    return EvalParityError(f"cannot read the model file {visible(err.filename or folder)}: {err.strerror or err}: "
                           "check the model folder (--model, or a cell's model=)")


def fingerprint_change(old: dict | None, new: dict | None) -> str | None:
    """What differs between two fingerprints, in words (None when they match)."""
    if old == new:
        return None
    if not old or not new:
        return "the run was made without a model fingerprint (an older evalparity)"
    if old.get("source") != new.get("source"):
        return f"model {old.get('source')} there, {new.get('source')} now"
    if old.get("revision") != new.get("revision"):
        return f"revision {old.get('revision')} there, {new.get('revision')} now"
    a, b = old.get("files", {}), new.get("files", {})
    for name in sorted(set(a) | set(b)):
        if name not in a:
            return f"{b[name].get('kind', 'file')} file {name} is new"
        if name not in b:
            return f"{a[name].get('kind', 'file')} file {name} is gone"
        if a[name] != b[name]:
            x, y = a[name], b[name]
            size = f", {x.get('size')} -> {y.get('size')} bytes" if x.get("size") != y.get("size") else ""
            return (f"{x.get('kind', 'file')} file {name} changed (sha256 {str(x.get('sha256'))[:12]} there, "
                    f"{str(y.get('sha256'))[:12]} now{size})")
    return "the fingerprint differs"
