"""The layers of ember/ as its imports draw them: no import cycle (function-level imports
included), and the code generators and runtimes (backend/) and the compiler below the frontend."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ember"
FRONTEND = {"ember.tensor", "ember.nn", "ember.functional", "ember.distributed", "ember.optim", "ember.train",
            "ember.cli", "ember.grading"}


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Each ember module -> the ember modules it imports anywhere in its body (a package's
    own __init__ counts as the package)."""
    modules = {_module(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                deps |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_ember_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_backend_and_compiler_sit_below_the_frontend() -> None:
    graph = import_graph()
    low = [m for m in graph if m.startswith(("ember.backend", "ember.compiler")) or m == "ember.target"]
    bad = {m: sorted(d for d in graph[m] if d.split(".")[:2] and ".".join(d.split(".")[:2]) in FRONTEND)
           for m in low}
    assert {m: d for m, d in bad.items() if d} == {}


def test_a_cycle_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "ember"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from ..a import x\n")
    assert cycles(import_graph(pkg)) == [["ember.a", "ember.b", "ember.sub.c"]]
