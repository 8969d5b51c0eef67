"""Safe names: every name that becomes a path in a run folder (cell names, ``compare --name``, repeat tags,
shard units) is checked against one grammar, so that no name can point outside ``cells/`` (``../../victim``)
or into a folder of its own (``org/model``)."""

from __future__ import annotations

import re
from pathlib import Path

from evalparity.errors import EvalParityError

NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
NAME_RULE = "letters, digits and . _ - only, not starting with a dot, at most 100 characters"


def check_name(name: str, what: str = "cell name") -> str:
    """``name`` if it is safe as one path component, else a one-line error naming the rule.

    Why one grammar: a name with a slash or ``..`` makes ``cells/<name>`` point elsewhere, and the publish
    step replaces (deletes) whatever is at that path."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise EvalParityError(f"{what} {name!r} is not a safe name: use {NAME_RULE} (e.g. hf-fp32)")
    return name


def check_names(names: list[str], what: str = "--name") -> list[str]:
    """``names`` if each is safe (``check_name``) and none is given twice, else a one-line error: two cells
    under one name would share its folder (or one be renamed, which nobody asked for)."""
    for n in names:
        check_name(n, what)
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise EvalParityError(f"{what} {twice} is given twice: give each its own name")
    return names


def child(root: Path, name: str, what: str = "cell name") -> Path:
    """``root / name`` for a checked ``name``; the result is always directly inside ``root``."""
    return root / check_name(name, what)


def check_name_ok(name: str) -> bool:
    """Whether ``name`` is a safe path component (``check_name``), without raising."""
    try:
        check_name(name)
        return True
    except Exception:  # noqa: BLE001 - EvalParityError: not a plain file name
        return False
