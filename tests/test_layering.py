"""gawee's layers only point down: every import in gawee/ (inside functions too) goes to its own layer or below.

The layers, lowest first, are ``LAYERS`` (docs/architecture.md, "Layers", draws them). A module belongs to the
layer of its package (``gawee.ops.nn`` to ``ops``); ``gawee`` itself (``gawee/__init__.py``, the public API)
is the top. Imports are read from the source with ``ast``, not by importing: a lazy import inside a function
hides a dependency from Python's import machinery, not from a reader, so it counts like any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gawee"

LAYERS: list[tuple[str, ...]] = [
    # leaf utilities: errors, torch's thread count, bundled files, CPU flags, the engine's compiled modules' finder
    # and the stand-in for Cython's declarations where Cython is absent
    ("errors", "threads", "resources", "cpu", "accel", "cython_shim"),
    ("ir",),  # types, symbols, Value/Node/Graph, the op-registry table ops fill in
    ("ops",),  # one OpDef per op: semantics, inference, cost, sampling; no lowering
    ("analysis", "interp"),  # shapes, constants, cost, liveness; the reference interpreter
    ("numerics",),  # tolerances, float64 upcasts, awkward values: shared by the harness and equivalence
    ("dsl",),  # rule text -> AST -> compiled rules and their matchers
    ("rewrite",),  # rule sets, the worklist driver, explain
    ("equivalence", "accuracy"),  # two graphs compared on numbers; outputs' error against a float model
    ("testing",),  # the soundness harness
    ("frontend",),  # torch.export capture
    ("machine", "cache"),  # this machine: timing, CPU facts, answers kept between processes
    ("backend",),  # runtimes and their lowering tables; gawee.compile
    ("profile", "report"),  # runtime profile; before/after tables
    ("viz",),  # pictures
    ("cli", "gawee"),  # gawee-rewrite; the public API
]
"""Each entry is one layer: the top-level modules or packages of gawee/ in it. A module may import its own
layer and those below."""

ALLOWED: dict[tuple[str, str], str] = {}
"""Upward imports still to be removed, (importer, imported module) -> why it is still there. Empty is the goal."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def owner(module: str) -> str:
    """The top-level module or package of gawee/ that ``module`` belongs to ("gawee" for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gawee"


def rank(module: str) -> int:
    for i, layer in enumerate(LAYERS):
        if owner(module) in layer:
            return i
    raise AssertionError(f"{module} is in no layer: add {owner(module)!r} to LAYERS (and to docs/architecture.md)")


def _target(module: str, node: ast.ImportFrom | ast.Import, alias: ast.alias, is_package: bool) -> str | None:
    if isinstance(node, ast.Import):
        name = alias.name
    else:
        if node.level:
            base = module.split(".")[: None if is_package else -1]
            base = base[: len(base) - (node.level - 1)]
            name = ".".join(base + ([node.module] if node.module else []))
        else:
            name = node.module or ""
        if f"{name}.{alias.name}" in MODULES:  # from gawee.ops import nn: the submodule
            name = f"{name}.{alias.name}"
    if name.split(".")[0] != "gawee":
        return None
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports() -> dict[str, dict[str, int]]:
    """module -> {imported gawee module: line of the first such import}, every import statement counted."""
    edges: dict[str, dict[str, int]] = {}
    for module, path in MODULES.items():
        found = edges.setdefault(module, {})
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    target = _target(module, node, alias, path.name == "__init__.py")
                    if target is not None and target != module:
                        found.setdefault(target, node.lineno)
    return edges


def upward_imports() -> list[tuple[str, str, int]]:
    return [(a, b, line) for a, targets in imports().items() for b, line in targets.items() if rank(b) > rank(a)]


def test_every_module_is_in_a_layer():
    for module in MODULES:
        rank(module)


def test_imports_point_down():
    found = {(a, b): line for a, b, line in upward_imports()}
    unexpected = sorted(
        f"{MODULES[a].relative_to(ROOT)}:{line} imports {b}" for (a, b), line in found.items() if (a, b) not in ALLOWED
    )
    assert not unexpected, "imports that point up a layer:\n" + "\n".join(unexpected)
    stale = sorted(f"{a} -> {b}" for a, b in ALLOWED if (a, b) not in found)
    assert not stale, "ALLOWED lists imports that are gone (remove them):\n" + "\n".join(stale)


MAX_LINES = 1000
"""No module of gawee's is this long: one module holds one idea (issue 38 split the ones that held several)."""


def test_no_module_is_a_thousand_lines_long():
    long = sorted(
        f"{p.relative_to(ROOT)}: {n}" for p in MODULES.values() if (n := len(p.read_text().splitlines())) >= MAX_LINES
    )
    assert not long, f"split these modules (each under {MAX_LINES} lines):\n" + "\n".join(long)


def test_no_import_circle_spans_two_packages():
    """Strongly connected components of the module graph (Tarjan's): each lies inside one package."""
    edges = {a: [b for b in targets if (a, b) not in ALLOWED] for a, targets in imports().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len({owner(m) for m in component}) > 1:
                circles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not circles, "import circles across packages:\n" + "\n".join(", ".join(c) for c in circles)


def test_architecture_md_draws_these_layers():
    """docs/architecture.md's "Layers" drawing lists LAYERS, top first."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    drawing = text.split("## Layers", 1)[1].split("```", 2)[1]
    drawn = [tuple(re.split(r",\s*", re.split(r"\s{2,}", line.strip())[0])) for line in drawing.strip().splitlines()]
    drawn = [tuple("gawee" if n == "gawee (the public API)" else n for n in layer) for layer in drawn]
    assert drawn == LAYERS[::-1]
