"""One module per backend: the lm-eval model arguments, the alignment settings and the recording LM.

Each backend module exposes:
- ``model_args(spec, cell, model_path) -> dict``: what lm-eval's model class gets, with every confound
  aligned as ``spec.alignment`` says;
- ``settings(spec, cell, model_args) -> dict``: the alignment settings in words, for ``cell.json``;
- ``create_lm(model_args)``: an lm-eval LM that also records the generated token ids;
- ``environment(spec, cell) -> dict``: environment variables the cell process needs before imports.
"""

from __future__ import annotations

from types import ModuleType

from evalparity.errors import EvalParityError


def get(name: str) -> ModuleType:
    if name == "hf":
        from evalparity.backends import hf  # loaded when picked: hf and vllm import this package

        return hf
    if name == "vllm":
        from evalparity.backends import vllm  # loaded when picked: hf and vllm import this package

        return vllm
    raise EvalParityError(f"unknown backend {name!r}: use hf or vllm")


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
