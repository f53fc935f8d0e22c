"""The import graph of the project's own packages: imports point down, nothing circles back.

Every import counts: at module level, inside functions and under ``TYPE_CHECKING`` (a cycle hidden in a
function is still a cycle, and the annotations name what the module depends on).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Lower layers first. A package may import its own modules and any package of a lower layer, never one of
# its own layer or above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("inference",),
    ("tenancy",),
    ("ledger",),
    ("carbon",),
    ("reports", "jobs"),
    ("api", "dashboard"),
    ("demo",),
    ("carbonledger",),
)
RANK = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}
# Framework-free cores: they must stay importable (and testable) without Django.
DJANGO_FREE = (
    "inference",
    "carbon.co2e",
    "carbon.intensity_csv",
    "carbon.providers",
    "carbon.hourly",
    "carbon.energy_mix",
    "carbon.certificate_csv",
)


def project_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in RANK:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts or "demo_repository" in parts:
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def imports_of(module: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of ``path``, resolved to the most
    specific module that exists (``from carbon import co2e`` is carbon.co2e, not carbon)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[str, int, bool]]:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child.lineno, in_function
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    candidate = f"{base}.{alias.name}"
                    yield (candidate if candidate in known else base), child.lineno, in_function
            yield from walk(child, nested)

    for target, line, in_function in walk(tree, False):
        # ``import ledger.records.x`` or ``from ledger.records import NAME``: the module that exists.
        while target not in known and "." in target:
            target = target.rpartition(".")[0]
        yield target, line, in_function


def graph() -> tuple[dict[str, set[str]], list[str]]:
    known = project_modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    lazy: list[str] = []
    for name, path in known.items():
        for target, line, in_function in imports_of(name, path, known):
            if target in known and target != name:
                edges[name].add(target)
                if in_function:
                    lazy.append(f"{path.relative_to(ROOT)}:{line} imports {target} inside a function")
    return edges, lazy


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def top(module: str) -> str:
    return module.split(".")[0]


def test_no_cycle_between_modules() -> None:
    edges, _ = graph()
    # A package's __init__ is imported whenever one of its modules is, so the edge from a module up to its
    # own package is not a dependency to count.
    own = {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in edges.items()}
    assert cycles(own) == []


def test_no_cycle_between_packages() -> None:
    edges, _ = graph()
    packages: dict[str, set[str]] = {}
    for module, targets in edges.items():
        packages.setdefault(top(module), set()).update(top(t) for t in targets if top(t) != top(module))
    assert cycles(packages) == []


def test_imports_point_down_the_layers() -> None:
    edges, _ = graph()
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        for target in targets
        if top(target) != top(module) and RANK[top(target)] >= RANK[top(module)]
    )
    assert upward == []


def test_no_project_import_inside_a_function() -> None:
    _, lazy = graph()
    assert lazy == []


def test_the_framework_free_cores_import_no_django() -> None:
    known = project_modules()
    offenders = []
    for name, path in known.items():
        if not any(name == core or name.startswith(core + ".") for core in DJANGO_FREE):
            continue
        for target, line, _ in imports_of(name, path, known):
            if top(target) in ("django", "rest_framework", "celery") or (
                target in known and not any(target == c or target.startswith(c + ".") for c in DJANGO_FREE)
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert offenders == []


def test_the_graph_sees_imports_in_functions_and_under_type_checking(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ledger import records\n"
        "def f():\n    from carbon import co2e\n"
    )
    path = tmp_path / "m.py"
    path.write_text(source)
    known = {"ledger.records": path, "carbon.co2e": path, "tenancy.m": path}
    found = sorted(i for i in imports_of("tenancy.m", path, known) if i[0] in known)
    assert found == [("carbon.co2e", 5, True), ("ledger.records", 3, False)]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
