"""Inference backends: one module each, behind one contract (``base.Backend``), looked up by name.

- ``base.py``: the ``Backend`` protocol, everything the rest of evalparity asks of a backend;
- ``registry.py``: the names (one line per built-in backend) and plugin backends (``EVALPARITY_PLUGINS``);
- ``hf.py``, ``vllm.py``: the two built-in backends;
- ``precision.py`` (precision modes of a cell process) and ``compat.py`` (vLLM version shim): shared helpers.

``get(name)`` is the way in; an unknown name is a one-line error that lists the known ones.
"""

from __future__ import annotations

from evalparity.backends.registry import get, names, register
from evalparity.errors import EvalParityError

__all__ = ["get", "names", "parse_extra_args", "register"]


def parse_extra_args(text: str) -> dict:
    """'a=1,b=true' -> {'a': 1, 'b': True}, with lm-eval's own parser (so values mean what they mean
    on lm-eval's command line)."""
    if not text:
        return {}
    from lm_eval.utils import simple_parse_args_string  # heavy: lm_eval

    try:
        return simple_parse_args_string(text)
    except Exception as err:  # noqa: BLE001 - any parse failure is the user's input
        raise EvalParityError(f"cannot parse backend args {text!r} ({err}): write key=value,key=value") from err


def check_names(keys, known, where: str, what: str, listed: str) -> None:
    """Each key one of ``known``, else one line: the key, what it is not, the closest spelling and where the
    names are listed (a vLLM cell's engine arguments, a started server's flags)."""
    import difflib

    for key in keys:
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise EvalParityError(f"{where}: {key} is not {what}{hint}: check its spelling ({listed})")
