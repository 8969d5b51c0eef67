"""The package's import structure (docs/architecture.md, "Imports"): no cycle among the modules' top-level
imports, imports that flow one way through the pipeline's stages, leaf modules that import nothing above
them, and a CLI that starts without the heavy libraries.

The graph is read from the source with ``ast``: an edge A -> B for every ``import evalparity.B`` or ``from
evalparity[.X] import ...`` that runs when A is imported (at module level, in a class body, under a
module-level ``if`` or ``try``). Imports inside functions are read too, as a second set of edges: they run
later, but an import of a later stage there is the same cycle in disguise, so they follow the same order.
What sits under ``if TYPE_CHECKING`` never runs and is no edge. A submodule's implicit import of its own
package (importing ``report.build`` first runs ``report/__init__``) is not an edge: Python initialises the
package first, so a package that imports its submodules is no cycle.

An import inside a function is there to defer a heavy library (or for a rare path); one of a heavy
library says so in a comment that names it (``# heavy: torch``, ``# optional: vllm``), on its line or the
line above, or on an earlier import of the same function (one comment for a group).
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "evalparity"

# The pipeline's stages, in the order imports may flow: a module may import its own stage and those
# before it, never one after it. A module's stage is that of the longest name here that is its name or
# a package above it.
STAGES: list[tuple[str, ...]] = [
    ("evalparity", "evalparity.errors", "evalparity.config", "evalparity.files", "evalparity.quiet",  # leaves
     "evalparity.printable",  # user text shown, not obeyed: control characters written out
     "evalparity.hostenv",  # what a cell ran on (stdlib only; torch only if the cell imported it)
     "evalparity.hostuse",  # what a process used of its host over a phase: CPU, switches, faults (stdlib only)
     "evalparity.procs",  # child processes that die with their parent (stdlib only)
     "evalparity.progress_file",  # what a worker tells its parent (progress.json, phase lines; procs, files)
     "evalparity.mps",  # the run's own CUDA MPS server for cells that share a GPU (procs only)
     "evalparity.shapes",  # what the memory plan and the backends share: model shapes, dtype sizes
     "evalparity.slim",  # transformers without scikit-learn in processes that load models (stdlib only)
     "evalparity.backends.registry",  # backend names only: spec checks them; the modules load when picked
     "evalparity.backends.base"),  # the contract the registry checks: a Protocol, typing only at run time
    ("evalparity.spec", "evalparity.rundir", "evalparity.runlog", "evalparity.stats.options"),
    ("evalparity.data", "evalparity.task_index", "evalparity.tasks", "evalparity.models", "evalparity.devices",
     "evalparity.memplan",
     "evalparity.cellenv",  # the variables a cell's process starts with (spec, backend registry)
     "evalparity.variants"),  # named cell variants (--cell) and how two cells differ in words
    ("evalparity.backends",),
    ("evalparity.samples",),
    ("evalparity.stats", "evalparity.staging"),  # a staged run's looks (staging) and their statistics
    ("evalparity.phases", "evalparity.lmeval_patches", "evalparity.cells", "evalparity.shards",
     "evalparity.placement", "evalparity.progress", "evalparity.stager", "evalparity.matrix", "evalparity.importer",
     "evalparity.failures",  # why cells failed, from the run folder's attempt history
     "evalparity.warmup"),  # a backend's caches, warmed while a run sets up
    ("evalparity.plan", "evalparity.report",
     "evalparity.signoff"),  # the statistics and report published, the reference, the exit code
    ("evalparity.drift", "evalparity.hidden"),  # probes of chosen layers: drift against a reference, hidden alone
    ("evalparity.doctor", "evalparity.cli"),
]
# Leaf modules: what the whole package shares, importing nothing of it but these.
LEAVES = {"evalparity.errors": set(), "evalparity.config": set(), "evalparity.quiet": set(),
          "evalparity.hostenv": set(), "evalparity.hostuse": set(),
          "evalparity.printable": set(), "evalparity.procs": set(),
          "evalparity.mps": {"evalparity.procs", "evalparity.files", "evalparity.config"},
          "evalparity.files": {"evalparity.config"}, "evalparity.shapes": set(), "evalparity.slim": set(),
          "evalparity.progress_file": {"evalparity.procs", "evalparity.files"}}
# What `import evalparity.cli` must not load (seconds of start-up each; the verbs load them when they run).
HEAVY = ("torch", "lm_eval", "vllm", "pandas", "scipy", "numpy", "transformers", "datasets", "pyarrow",
         "statsmodels", "matplotlib", "ray", "jinja2", "huggingface_hub")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module ``name`` refers to: itself, or for ``package.attribute`` the package."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, module: str, known: dict[str, Path]) -> set[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the module's package, up level - 1 packages
            package = module if known[module].name == "__init__.py" else module.rpartition(".")[0]
            parts = package.split(".")
            parts = parts[:len(parts) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        names = [f"{base}.{a.name}" for a in node.names]
    out = {_resolve(n, known) for n in names if n == "evalparity" or n.startswith("evalparity.")}
    return {t for t in out if t and t != module}


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, ast.AST | None]]:
    """Every import statement that can run, with the innermost function around it (None: it runs when the
    module is imported). Those under ``if TYPE_CHECKING`` never run and are left out."""

    def visit(node: ast.AST, function: ast.AST | None) -> Iterator[tuple[ast.Import | ast.ImportFrom, ast.AST | None]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, function
            inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else function
            yield from visit(child, inner)

    yield from visit(tree, None)


def _parse(module: str, known: dict[str, Path]) -> ast.Module:
    return ast.parse(known[module].read_text(encoding="utf-8"))


def top_level_imports(module: str, known: dict[str, Path]) -> set[str]:
    """The evalparity modules that importing ``module`` imports."""
    return {t for node, function in _imports(_parse(module, known)) if function is None
            for t in _targets(node, module, known)}


def function_imports(module: str, known: dict[str, Path]) -> set[str]:
    """The evalparity modules that ``module``'s functions import when they run."""
    return {t for node, function in _imports(_parse(module, known)) if function is not None
            for t in _targets(node, module, known)}


def import_graph(inside_functions: bool = False) -> dict[str, set[str]]:
    """Module -> the evalparity modules it imports when imported, and with ``inside_functions`` also those
    its functions import."""
    known = modules()
    graph = {m: top_level_imports(m, known) for m in known}
    if inside_functions:
        for m in known:
            graph[m] |= function_imports(m, known)
    return graph


def unexplained_heavy_imports(source: str) -> list[tuple[int, str]]:
    """(line, library) for each import of a heavy library inside a function that no comment names as the
    reason (one that says ``heavy`` or ``optional``) on its lines, on the line above, or on an earlier
    import of the same function."""
    comments = {tok.start[0]: tok.string.lower() for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    said: dict[int, str] = {}  # id of a function -> the reasons its imports have given so far
    out = []
    for node, function in _imports(ast.parse(source)):
        if function is None:
            continue
        lines = range(node.lineno - 1, (node.end_lineno or node.lineno) + 1)
        reasons = [c for i in lines if (c := comments.get(i)) and re.search(r"\b(heavy|optional)\b", c)]
        said[id(function)] = " ".join([said.get(id(function), ""), *reasons])
        if isinstance(node, ast.Import):
            libraries = {a.name.split(".")[0] for a in node.names}
        else:
            libraries = {node.module.split(".")[0]} if node.module and not node.level else set()
        out += [(node.lineno, lib) for lib in sorted(libraries & set(HEAVY))
                if not re.search(rf"\b{lib}\b", said[id(function)])]
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path that returns to its start) through each strongly connected group of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    out = []
    for group in groups:
        start = min(group)
        path, seen = [start], {start}
        while True:  # walk inside the group until a module repeats: that stretch is a cycle
            nxt = min(w for w in graph[path[-1]] if w in group)
            if nxt in seen:
                out.append(path[path.index(nxt):] + [nxt])
                break
            path.append(nxt)
            seen.add(nxt)
    return out


def stage_of(module: str) -> int | None:
    """The stage of the longest name in ``STAGES`` that is ``module`` or a package above it; None when there
    is none. ``evalparity`` names the package's ``__init__`` only, so that a new module is reported as placed
    nowhere instead of passing for a leaf."""
    best = None
    for i, names in enumerate(STAGES):
        for name in names:
            inside = module.startswith(name + ".") and name != "evalparity"
            if (module == name or inside) and (best is None or len(name) > len(best[1])):
                best = (i, name)
    return best[0] if best else None


def test_the_finder_names_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"x": {"y"}, "y": {"x"}, "z": set()}) == [["x", "y", "x"]]


def test_the_reader_finds_imports_inside_functions_and_their_reasons():
    source = """
import torch

def f():
    import pandas as pd  # heavy: pandas
    import pandas.api
    from evalparity import memplan

def g():
    try:  # optional: vllm
        import vllm
    except ImportError:
        import torch
    if TYPE_CHECKING:
        import scipy

    def inner():
        import ray  # noqa: F401 - not a reason
        # heavy: jinja2 (the report only)
        import jinja2
"""
    found = {(n.lineno, f.name if f else None) for n, f in _imports(ast.parse(source))}
    assert found == {(2, None), (5, "f"), (6, "f"), (7, "f"), (11, "g"), (13, "g"), (18, "inner"), (20, "inner")}
    assert unexplained_heavy_imports(source) == [(13, "torch"), (18, "ray")]


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles among top-level imports: " + "; ".join(" -> ".join(c) for c in found)
    found = cycles(import_graph(inside_functions=True))
    assert not found, "import cycles through imports inside functions: " + "; ".join(" -> ".join(c) for c in found)


def _against_the_stages(graph: dict[str, set[str]]) -> list[str]:
    """An import of a later stage, for each one (modules in no stage are reported on their own)."""
    return [f"{m} (stage {stage_of(m)}) imports {t} (stage {stage_of(t)})"
            for m, targets in sorted(graph.items()) for t in sorted(targets)
            if stage_of(m) is not None and stage_of(t) is not None and stage_of(t) > stage_of(m)]


def test_imports_flow_one_way_through_the_stages():
    graph = import_graph()
    unplaced = sorted(m for m in graph if stage_of(m) is None)
    assert not unplaced, f"modules in no stage: {unplaced}: add each to STAGES here and to docs/architecture.md"
    upstream = _against_the_stages(graph)
    assert not upstream, "imports against the pipeline's direction: " + "; ".join(upstream)


def test_imports_inside_functions_flow_one_way_too():
    known = modules()
    upstream = _against_the_stages({m: function_imports(m, known) for m in known})
    assert not upstream, ("imports inside functions against the pipeline's direction (a cycle in disguise: "
                          "move what both sides need into an earlier stage): " + "; ".join(upstream))


def test_heavy_imports_inside_functions_say_why():
    missing = [f"{path.relative_to(ROOT)}:{line} ({lib})" for path in modules().values()
               for line, lib in unexplained_heavy_imports(path.read_text(encoding="utf-8"))]
    assert not missing, ("imports of a heavy library inside a function without a comment naming it "
                         "(add '# heavy: <library>' or '# optional: <library>'): " + ", ".join(missing))


def test_leaf_modules_import_only_leaves():
    graph = import_graph()
    for leaf, allowed in LEAVES.items():
        assert graph[leaf] <= allowed | {"evalparity.errors"}, f"{leaf} imports {sorted(graph[leaf] - allowed)}"


def test_the_cli_starts_without_heavy_libraries():
    code = "import json, sys; import evalparity.cli; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = {name.split(".")[0] for name in json.loads(proc.stdout)}
    assert not loaded & set(HEAVY), f"import evalparity.cli loads {sorted(loaded & set(HEAVY))}"


@pytest.mark.parametrize("bad", [["--backends", "tgi"], ["--dtypes", "int8"], ["--repeat", "hf:fp32:dp0"]])
def test_a_run_with_a_mistaken_argument_is_refused_without_heavy_libraries(bad, tmp_path):
    """``evalparity run`` refuses a mistake in its arguments or cells before it loads pandas, scipy or torch
    (``--device cpu``: auto asks torch for a GPU): the error in well under a second, not 2.5 s, which a CI
    job's typo and this suite's many such cases pay each time. Only the run's lock and its folder's
    removal happen before the checks: the embedded model's first preparation (a process that imports torch,
    started early in the setup) does not start for a run that is refused; an empty cache makes it due."""
    code = ("import json, sys\nfrom evalparity.cli import main\nsys.argv = ['evalparity', 'run', '--tasks', "
            f"'hellaswag', '--device', 'cpu', '--out', {str(tmp_path / 'r')!r}, *{bad!r}]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
            "print(json.dumps([code, sorted(sys.modules)]))")
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=os.environ | {"EVALPARITY_CACHE": str(cache)})
    code, mods = json.loads(proc.stdout.strip().splitlines()[-1])
    assert code == 2 and proc.stderr.strip().startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1, \
        proc.stderr
    assert not (cache / "models").exists() and not (cache / "prepare.log").exists()
    loaded = {name.split(".")[0] for name in mods}
    assert not loaded & set(HEAVY), f"a refused run loaded {sorted(loaded & set(HEAVY))}"
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- the verbs: one module each, none calling another
CLI = "evalparity.cli"


def verb_modules() -> set[str]:
    """The cli modules that hold a verb: those ``cli/__init__`` registers with the app
    (``app.command(...)(module.function)``, ``app.add_typer(module.app, ...)``)."""
    tree = ast.parse((PACKAGE / "cli" / "__init__.py").read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Call) and isinstance(f.func, ast.Attribute) and f.func.attr == "command":
            registered = node.args
        elif isinstance(f, ast.Attribute) and f.attr == "add_typer":
            registered = node.args[:1]
        else:
            continue
        out |= {f"{CLI}.{a.value.id}" for a in registered
                if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name)}
    return out


def verbs_calling_verbs(graph: dict[str, set[str]], verbs: set[str]) -> list[str]:
    """Each import of a verb's module by another cli module (the app itself, ``cli/__init__``, excepted):
    what verbs share belongs in a module of its own (``cli/options``, ``cli/output``, ``cli/finish``) or
    outside the CLI (``signoff``)."""
    return [f"{m} imports {t}" for m, targets in sorted(graph.items()) if m.startswith(CLI + ".")
            for t in sorted(targets) if t in verbs and t != m]


def test_no_cli_module_imports_a_verbs_module():
    verbs = verb_modules()
    assert {f"{CLI}.run", f"{CLI}.report", f"{CLI}.compare", f"{CLI}.plan", f"{CLI}.models"} <= verbs, verbs
    bad = verbs_calling_verbs(import_graph(inside_functions=True), verbs)
    assert not bad, "a cli module imports a verb's module (move what they share out of the verb): " + "; ".join(bad)


def test_the_verb_check_finds_a_verb_importing_another():
    graph = {f"{CLI}.run": {f"{CLI}.report", f"{CLI}.options"}, CLI: {f"{CLI}.run", f"{CLI}.report"},
             f"{CLI}.finish": {f"{CLI}.output", "evalparity.signoff"}, f"{CLI}.output": {f"{CLI}.plan"}}
    assert verbs_calling_verbs(graph, {f"{CLI}.run", f"{CLI}.report", f"{CLI}.plan"}) == [
        f"{CLI}.output imports {CLI}.plan", f"{CLI}.run imports {CLI}.report"]


# ---------------------------------------------------------------- the run folder's one door
RUN_FOLDER_NAMES = {"CELLS", "SHARDS", "ATTEMPTS", "STATS", "REPORT", "DRIFT", "SPEC_FILE", "COMPARE_FILE", "RUN_FILE",
                    "CELL_FILE", "TABLE_FILE", "LOG_FILE", "PROGRESS_FILE", "LM_EVAL_DIR", "LM_EVAL_RESULTS",
                    "VERDICTS_FILE", "FAILED_SUFFIX", "TMP_PREFIX"}
RUN_FOLDER_STRINGS = {"cells", "shards", "attempts", "stats", "report", "drift", "figures", "spec.json",
                      "compare.json", "run.json", "cell.json", "samples.parquet", "cell.log", "progress.json",
                      "lm_eval", "lm_eval_results.json", "verdicts.json", "prompts.json"}


def _path_spellings(tree: ast.AST) -> list[tuple[int, str]]:
    """``x / NAME`` or ``x / "name"`` where the right side names a part of a run folder."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            r = node.right
            if isinstance(r, ast.Name) and r.id in RUN_FOLDER_NAMES:
                out.append((node.lineno, r.id))
            elif isinstance(r, ast.Constant) and r.value in RUN_FOLDER_STRINGS:
                out.append((node.lineno, repr(r.value)))
            elif isinstance(r, ast.JoinedStr) and any(
                    isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name)
                    and v.value.id in RUN_FOLDER_NAMES for v in r.values):
                out.append((node.lineno, ast.unparse(r)))
    return out


def test_only_the_run_folder_package_spells_run_folder_paths():
    """Issue 25: every path in a run folder comes from ``evalparity.rundir.layout`` (and every read and write
    of its records from ``evalparity.rundir``), so no module outside the package joins a run folder's names
    itself."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("evalparity/rundir/") or rel == "evalparity/config.py":
            continue
        bad += [f"{rel}:{line}: / {what}" for line, what in _path_spellings(ast.parse(path.read_text()))]
    assert not bad, "run-folder paths spelt outside evalparity/rundir (use rundir.layout):\n" + "\n".join(bad)


def test_the_path_finder_finds_what_it_looks_for():
    tree = ast.parse('a = run / CELLS / name\nb = run / "spec.json"\nc = run / f"{CELLS}"\nd = run / "other"\n')
    assert sorted(w for _, w in _path_spellings(tree)) == sorted(["CELLS", "'spec.json'", "f'{CELLS}'"])
