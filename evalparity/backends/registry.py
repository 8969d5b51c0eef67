"""The backends by name: the built-in ones, and those that plugin modules register.

Names map to lazy targets (``"package.module"`` or ``"package.module:attribute"``, like lm-eval's own model
registry), so that listing or checking names imports no backend, let alone its engine: ``import
evalparity.cli`` stays light, and a run whose spec names only ``hf`` never imports vLLM's module.

A backend that is not part of the package registers itself from a plugin module:

    # my_backend.py, importable (on PYTHONPATH) in every process of the run
    from evalparity.backends import registry
    registry.register("mine", "my_backend")   # or an object that implements base.Backend

and the run names that module in ``EVALPARITY_PLUGINS`` (comma-separated module names). Every process
imports the listed modules on its first lookup: the CLI, each cell process (``python -m evalparity.cells``)
and each drift worker inherit the variable from the CLI's environment, and ``plugin_environment`` hands it
to cells started elsewhere (Ray), where the module must be importable too. An environment variable rather
than Python entry points: it needs no installed distribution, so a test file can register a backend.
"""

from __future__ import annotations

import importlib
import os

from evalparity.backends.base import Backend
from evalparity.errors import EvalParityError

PLUGINS_ENV = "EVALPARITY_PLUGINS"

# One line per backend: its name and the module that implements base.Backend.
_TARGETS: dict[str, object] = {
    "hf": "evalparity.backends.hf",
    "vllm": "evalparity.backends.vllm",
    "server": "evalparity.backends.server",
}
_resolved: dict[str, Backend] = {}
_plugins: set[str] = set()  # plugin modules imported into this process


def register(name: str, target: object) -> None:
    """Make ``name`` a backend: ``target`` implements ``base.Backend``, or names the module (or
    ``module:attribute``) that does, imported on first use. Registering a name again replaces it."""
    key = name.strip().lower()
    if not key or "-" in key or "," in key:
        raise EvalParityError(f"backend name {name!r} is not usable: it becomes the first part of cell names "
                              "(hf-fp32), so use letters, digits or '_' without '-' or ','")
    _TARGETS[key] = target
    _resolved.pop(key, None)


def load_plugins() -> None:
    """Import the plugin modules named in ``EVALPARITY_PLUGINS`` that this process has not imported yet."""
    for module in [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]:
        if module in _plugins:
            continue
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - any failure is the plugin's, named as such
            raise EvalParityError(f"cannot import {module!r} from {PLUGINS_ENV} ({type(err).__name__}: "
                                  f"{str(err).splitlines()[0] if str(err) else ''}): make it importable (e.g. "
                                  f"on PYTHONPATH) or remove it from {PLUGINS_ENV}") from None
        _plugins.add(module)


def names() -> tuple[str, ...]:
    """Every backend name known here, built-in ones first."""
    load_plugins()
    return tuple(_TARGETS)


def check_name(name: str) -> str:
    """The backend name as spelled in cell names (lower case); an unknown one is a one-line error that lists
    the available ones."""
    key = name.strip().lower()
    if key not in names():
        raise EvalParityError(f"unknown backend {name!r}: use one of {', '.join(names())}")
    return key


def get(name: str) -> Backend:
    """The backend called ``name``, imported on first use and checked against ``base.Backend``."""
    key = check_name(name)
    if key in _resolved:
        return _resolved[key]
    target = _TARGETS[key]
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = importlib.import_module(module)
        if attr:
            target = getattr(target, attr)
    missing = [m for m in _members(Backend) if not hasattr(target, m)]
    if missing:
        raise EvalParityError(f"backend {key!r} ({_TARGETS[key]}) does not implement {', '.join(missing)} of "
                              "evalparity.backends.base.Backend: add them")
    if getattr(target, "name", None) != key:
        raise EvalParityError(f"backend registered as {key!r} calls itself {getattr(target, 'name', None)!r}: "
                              "register it under its own name")
    _resolved[key] = target  # type: ignore[assignment]
    return target  # type: ignore[return-value]


def plugin_environment() -> dict[str, str]:
    """What a process started elsewhere (a Ray worker on another host) needs to find this process's plugin
    backends: ``EVALPARITY_PLUGINS`` as set here, or nothing."""
    value = os.environ.get(PLUGINS_ENV, "")
    return {PLUGINS_ENV: value} if value.strip() else {}


def _members(protocol: type) -> list[str]:
    """The protocol's members: its annotated attributes and its methods."""
    return sorted(n for n in {*protocol.__annotations__, *vars(protocol)} if not n.startswith("_"))
