"""``evalparity doctor``: what works on this machine, and the fix for each known snag it finds."""

from __future__ import annotations

import importlib
import importlib.metadata as md

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from evalparity import backends, config
from evalparity import tasks as tasks_mod
from evalparity.data import embedded, mirrors
from evalparity.devices import cpu_flags, resolve_device, unsupported_dtypes
from evalparity.errors import EXIT_DOCTOR_PROBLEMS, EvalParityError
from evalparity.spec import split_list


def _check_import(name: str) -> tuple[bool, str]:
    try:
        mod = importlib.import_module(name)
        return True, str(getattr(mod, "__version__", "ok"))
    except Exception as err:  # noqa: BLE001 - report any import failure
        return False, f"{type(err).__name__}: {str(err).splitlines()[0][:100] if str(err) else ''}"


def snags() -> list[tuple[str, str]]:
    """(problem, fix) for each known snag present here."""
    found = []
    for pkg in ("torchvision", "torchaudio", "torchcodec"):
        try:
            v = md.version(pkg)
        except md.PackageNotFoundError:
            continue
        torch_v = md.version("torch") if _has("torch") else ""
        if "+cpu" in torch_v and "+cpu" not in v:
            found.append((f"{pkg} {v} is a CUDA build beside CPU torch {torch_v}; it breaks `import transformers`",
                          "pip uninstall -y torchvision torchaudio torchcodec"))
    for name in backends.names():  # each backend's own (Backend.snags)
        found += backends.get(name).snags()
    return found


def _has(dist: str) -> bool:
    try:
        md.version(dist)
        return True
    except md.PackageNotFoundError:
        return False


def interpreters(console: Console, pythons: tuple[tuple[str, str], ...]) -> int:
    """Each ``--python`` interpreter asked whether it can run a cell of every backend (``cells.probe``, the
    check ``run`` makes before any cell starts), in a table with the versions that differ from this one's;
    returns the number that cannot."""
    from evalparity.cells import InterpreterProbes, versions  # heavy: pandas (cells -> samples)

    if not pythons:
        return 0
    probes = InterpreterProbes(dict(pythons), {name: set(backends.names()) for name, _ in pythons})
    here = versions()
    t = Table(title="interpreters (--python)")
    for column in ("name", "ok", "interpreter", "differs from this one"):
        t.add_column(column)
    problems = 0
    for name, path in pythons:
        try:
            answer = probes.answer(name)
        except EvalParityError as err:
            problems += 1
            t.add_row(name, "[red]no[/red]", path, str(err))
            continue
        theirs = answer.get("versions") or {}
        differ = ", ".join(f"{k} {v}" for k, v in sorted(theirs.items()) if here.get(k) != v) or "nothing"
        t.add_row(name, "yes", f"{answer['executable']} (Python {answer['python']})", differ)
    console.print(t)
    return problems


def diagnose(console: Console, tasks: str | None, datasets_dir: str | None,
             pythons: tuple[tuple[str, str], ...] = ()) -> int:
    problems = 0
    t = Table(title="backends")
    t.add_column("import / backend")
    t.add_column("ok")
    t.add_column("version / error")
    for name in ("torch", "transformers", "lm_eval"):  # what every backend runs on
        ok, info = _check_import(name)
        problems += not ok
        t.add_row(name, "yes" if ok else "[red]no[/red]", info)
    for name in backends.names():
        backend = backends.get(name)
        ok, info = backend.installed()
        problems += not ok
        t.add_row(f"backend {name}", "yes" if ok else "[red]no[/red]",
                  info if ok else f"{info}; install: {backend.install_hint}")
    console.print(t)
    problems += interpreters(console, pythons)
    dev = resolve_device("auto")
    dtypes = ["float32", "bfloat16", "float16"]
    bad = unsupported_dtypes(dev, dtypes, list(backends.names()))
    console.print(f"device: {dev}" + (f" (CPU flags: avx2={'avx2' in cpu_flags()}, avx512f={'avx512f' in cpu_flags()})"
                                      if dev == "cpu" else ""))
    console.print("dtypes: " + ", ".join(f"{d} {'no: ' + bad[d] if d in bad else 'yes'}" for d in dtypes))
    console.print(f"cache: {config.cache_dir()}")
    try:  # the files a preparation copies, and the manifest it must give (data/embedded.py)
        pin = embedded.shipped_files_fit() and embedded.pinned_manifest()
        console.print("embedded model files: " + ("shipped, pinned" if pin else
                                                  "made by this transformers (the shipped ones need transformers 5)"))
    except EvalParityError as err:
        problems += 1
        console.print(f"embedded model files: [red]{escape(str(err))}[/red]")
    try:
        console.print(f"embedded model: {embedded.model_path(prepare=False)}")
    except Exception:  # noqa: BLE001
        console.print("embedded model: not prepared (`evalparity models prepare`, or any run without --model)")
    emb = embedded.dataset_mirror(prepare=False)
    console.print(f"embedded datasets: {emb or 'not prepared'}")
    roots = mirrors.mirror_roots(datasets_dir)
    console.print("dataset mirrors searched: " + (", ".join(map(str, roots)) or "none"))
    console.print(f"hub reachable: {mirrors.hub_reachable()}")
    if tasks:
        tm = tasks_mod.task_manager()
        for typed in split_list(tasks):
            name = tasks_mod.split_suffixed(typed, tm) or typed
            if name != typed:
                console.print(f"task {typed!r} is lm-eval's group {name!r}")
            try:
                plan = tasks_mod.preflight([name], tm, roots, None, 0)
                console.print(f"task {name}: data available ({sum(plan.leaves.values()):,} docs in "
                              f"{len(plan.leaves)} task(s))")
            except EvalParityError as err:
                problems += 1
                console.print(f"task {name}: [red]{err}[/red]")
    for problem, fix in snags():
        problems += "nothing to do" not in fix
        console.print(f"[yellow]snag[/yellow]: {problem}\n  fix: {fix}")
    console.print("[green]all good[/green]" if not problems else f"[red]{problems} problem(s)[/red]")
    return 0 if not problems else EXIT_DOCTOR_PROBLEMS
