"""The package's import structure (docs/architecture.md, "Imports"): no cycle among the modules' top-level
imports, imports that flow one way through the pipeline's stages, leaf modules that import nothing above
them, and a CLI that starts without the heavy libraries.

The graph is read from the source with ``ast``: an edge A -> B for every ``import evalparity.B`` or ``from
evalparity[.X] import ...`` that runs when A is imported (at module level, in a class body, under a
module-level ``if`` or ``try``), not for one inside a function. A submodule's implicit import of its own
package (importing ``report.build`` first runs ``report/__init__``) is not an edge: Python initialises the
package first, so a package that imports its submodules is no cycle.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "evalparity"

# The pipeline's stages, in the order imports may flow: a module may import its own stage and those
# before it, never one after it. A module's stage is that of the longest name here that is its name or
# a package above it.
STAGES: list[tuple[str, ...]] = [
    ("evalparity", "evalparity.errors", "evalparity.config", "evalparity.files", "evalparity.quiet",  # leaves
     "evalparity.backends.registry"),  # backend names only: spec checks them; the modules load when picked
    ("evalparity.spec", "evalparity.rundir", "evalparity.runlog", "evalparity.stats.options"),
    ("evalparity.data", "evalparity.task_index", "evalparity.tasks", "evalparity.models", "evalparity.devices",
     "evalparity.memplan"),
    ("evalparity.backends",),
    ("evalparity.samples",),
    ("evalparity.phases", "evalparity.lmeval_patches", "evalparity.cells", "evalparity.shards",
     "evalparity.placement", "evalparity.matrix", "evalparity.importer"),
    ("evalparity.stats",),
    ("evalparity.report",),
    ("evalparity.drift",),
    ("evalparity.doctor", "evalparity.cli"),
]
# Leaf modules: what the whole package shares, importing nothing of it but these.
LEAVES = {"evalparity.errors": set(), "evalparity.config": set(), "evalparity.quiet": set(),
          "evalparity.files": {"evalparity.config"}}
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


def top_level_imports(module: str, known: dict[str, Path]) -> set[str]:
    """The evalparity modules that importing ``module`` imports."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.update(_targets(child, module, known))
            visit(child)

    visit(ast.parse(known[module].read_text(encoding="utf-8")))
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {m: top_level_imports(m, known) for m in known}


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
    best = None
    for i, names in enumerate(STAGES):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (i, name)
    return best[0] if best else None


def test_the_finder_names_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"x": {"y"}, "y": {"x"}, "z": set()}) == [["x", "y", "x"]]


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles among top-level imports: " + "; ".join(" -> ".join(c) for c in found)


def test_imports_flow_one_way_through_the_stages():
    graph = import_graph()
    unplaced = sorted(m for m in graph if stage_of(m) is None)
    assert not unplaced, f"modules in no stage: {unplaced}: add each to STAGES here and to docs/architecture.md"
    upstream = [f"{m} (stage {stage_of(m)}) imports {t} (stage {stage_of(t)})"
                for m, targets in sorted(graph.items()) for t in sorted(targets) if stage_of(t) > stage_of(m)]
    assert not upstream, "imports against the pipeline's direction: " + "; ".join(upstream)


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
