"""The import graph of python/tvm_ollie by floor (DESIGN.md, "Layout: floors").

``python tests/import_graph.py`` prints every floor's modules and the imports that leave the
module's own package, then the offending edges (none, when the layout holds). ``--counts`` adds
the deferred imports (an import inside a function body) and the functions over 60 lines;
``--long`` prints only the count of those functions and their list.
``tests/test_layers.py`` runs the same scan and fails on an offending edge.

The scan reads the source with :mod:`ast` and imports nothing: top-level imports, imports under
``if``/``try`` and imports inside functions all count; relative imports are resolved, and
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "tvm_ollie"
ROOT = Path(__file__).resolve().parent.parent / "python" / PACKAGE

# The one table: a module's floor is that of its longest prefix here. A module may import from
# its own floor or below, never from above; transform/ and orchestrate/ never import each other.
FLOORS: dict[str, int] = {
    "config": 0, "target": 0, "compat": 0, "library_loader": 0, "_callable": 0,
    "compile_profile": 0,
    "ir": 1, "models": 1,
    "lift": 2, "verify": 2,
    "derive": 3,
    "codegen": 4, "native": 4, "native_cuda": 4, "native_openmp": 4, "runtime": 4,
    "tune": 5,
    "transform": 6, "orchestrate": 6,
    "pipeline": 7,
    "frontend": 8,
    "cli": 9, "bench": 9, "bundle": 9, "demo": 9, "profiler": 9,
}
TOP = 10  # the package's __init__.py, above every floor
SIDE_BY_SIDE = ("transform", "orchestrate")  # same floor, never importing each other
LONG_FUNCTION = 60


@dataclass(frozen=True)
class Edge:
    src: str  # importing module, dotted
    dst: str  # imported module (or package), dotted
    line: int
    deferred: bool  # inside a function body

    def __str__(self) -> str:
        where = "in a function" if self.deferred else "top level"
        return (f"{self.src} (floor {floor(self.src)}) -> {self.dst} (floor {floor(self.dst)})"
                f"  [line {self.line}, {where}]")


def modules() -> dict[str, Path]:
    """Every module of the package, dotted name -> path (a package is its ``__init__.py``)."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def floor(module: str) -> int:
    """The floor of a dotted module name of the package (the table's longest prefix)."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in FLOORS:
            return FLOORS[key]
    if not parts:
        return TOP
    raise KeyError(f"{module} has no floor: add it to FLOORS in tests/import_graph.py")


def side(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _deferred_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes that sit inside a function body."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    inside.add(id(sub))
    return inside


def _is_package(module: str, known: dict[str, Path]) -> bool:
    return module in known and known[module].name == "__init__.py"


def imports(module: str, path: Path, known: dict[str, Path]):
    """(edges into the package, number of deferred imports of any module) for one module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    inside = _deferred_nodes(tree)
    base = module if _is_package(module, known) else module.rpartition(".")[0]
    edges, deferred = [], 0
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        is_deferred = id(node) in inside
        deferred += is_deferred
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                anchor = base.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                origin = ".".join(anchor + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                sub = f"{origin}.{alias.name}"
                targets.append(sub if sub in known else origin)
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                while target not in known and "." in target:  # a name inside a module
                    target = target.rpartition(".")[0]
                edges.append(Edge(module, target, node.lineno, is_deferred))
    return edges, deferred


def scan():
    """(all edges, each once, deferred-import count per module) over the package."""
    known = modules()
    edges, deferred = [], {}
    for module, path in known.items():
        found, n = imports(module, path, known)
        edges += [e for i, e in enumerate(found) if e not in found[:i]]
        deferred[module] = n
    return edges, deferred


def offending(edges) -> list[Edge]:
    """Edges from a lower floor to a higher one, and between transform/ and orchestrate/."""
    bad = []
    for e in edges:
        if floor(e.dst) > floor(e.src):
            bad.append(e)
        elif {side(e.src), side(e.dst)} == set(SIDE_BY_SIDE):
            bad.append(e)
    return bad


def long_functions(limit: int = LONG_FUNCTION) -> list[tuple[str, str, int]]:
    """(module, function, lines) for every function over ``limit`` lines."""
    out = []
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append((module, node.name, n))
    return out


def print_long_functions() -> None:
    """The count of functions over :data:`LONG_FUNCTION` lines, then each (longest first)."""
    longs = long_functions()
    print(f"functions over {LONG_FUNCTION} lines: {len(longs)}")
    for module, name, n in sorted(longs, key=lambda t: -t[2]):
        print(f"  {n:4d}  {module}.{name}")


def main(argv: list[str]) -> int:
    if "--long" in argv:
        print_long_functions()
        return 0
    edges, deferred = scan()
    by_floor: dict[int, list[str]] = {}
    for module in modules():
        by_floor.setdefault(floor(module), []).append(module)
    outgoing: dict[str, set[str]] = {}
    for e in edges:
        if e.dst.split(".")[:2] != e.src.split(".")[:2]:
            outgoing.setdefault(e.src, set()).add(e.dst)
    for level in sorted(by_floor, reverse=True):
        print(f"floor {level}" if level != TOP else "package __init__ (above every floor)")
        for module in by_floor[level]:
            dsts = sorted(outgoing.get(module, ()), key=lambda m: (-floor(m), m))
            print(f"  {module}" + (":" if dsts else ""))
            for d in dsts:
                print(f"      -> {d} ({floor(d)})")
    bad = offending(edges)
    print(f"\n{len(bad)} offending edge(s)" + (":" if bad else ""))
    for e in bad:
        print(f"  {e}")
    if "--counts" in argv:
        internal = sum(e.deferred for e in edges)
        print(f"\ndeferred imports (inside a function): {sum(deferred.values())}, of which "
              f"{internal} import from {PACKAGE}")
        print_long_functions()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
