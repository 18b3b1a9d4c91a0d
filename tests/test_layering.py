"""The import layering of rlx_triton, read from its source with ast (nothing is imported).

Two graphs of the package's modules: the module-level imports (what `import rlx_triton.x` runs) and the same
with the imports made inside functions too (imports under `if TYPE_CHECKING:` never run and count in
neither). Neither graph has a cycle: each module imports only modules below it, even lazily, so every
piece two modules share lives below both. The named circles of the layering issue (router registry <->
backends, explaining <-> integrations, cli <-> bench) are checked by area too, and the package imports
neither bench/ nor tests/, not even through a computed importlib.import_module name. An import names the
module it imports (`from a.b import c` names a.b.c where c is a module, else a.b): a package's own __init__
re-exporting its submodules is not a circle.

    python -m tests.test_layering      # prints every cycle of both graphs; exit 1 on any
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rlx_triton"
# the circles named in the layering issue: areas (a module and the modules inside it) that import each other
NAMED_CIRCLES = (("rlx_triton.router.registry", "rlx_triton.backends"),
                 ("rlx_triton.explaining", "rlx_triton.integrations"),
                 ("rlx_triton.cli", "bench"))
FORBIDDEN_TOP_LEVEL = ("bench", "tests")


def module_names() -> Dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _imported(node: ast.AST, module: str, is_package: bool, known: Set[str]) -> List[str]:
    """The modules one import statement names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".")
        base = base if is_package else base[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source for alias in node.names]


def import_graph(function_level: bool) -> Dict[str, Set[str]]:
    """module -> the modules it imports (rlx_triton's, and the top-level name of any other)."""
    names = module_names()
    known = set(names)
    graph: Dict[str, Set[str]] = {}
    for module, path in names.items():
        tree = ast.parse(path.read_text(), str(path))
        statements = _everywhere(tree) if function_level else _module_level(tree.body)
        targets: Set[str] = set()
        for node in statements:
            names: List[str] = []
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = _imported(node, module, path.name == "__init__.py", known)
            elif function_level and _is_import_module_call(node):
                names = [node.args[0].value]   # type: ignore[attr-defined]
            for name in names:
                targets.add(name if name.startswith("rlx_triton") else name.split(".")[0])
        graph[module] = {target for target in targets if target != module}
    return graph


def _is_import_module_call(node: ast.AST) -> bool:
    """importlib.import_module("a.b") with a constant name (a computed name cannot be read from the source)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def _everywhere(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under `node`, function bodies included, except what `if TYPE_CHECKING:` guards (its else
    branch runs)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _everywhere(other)
            continue
        yield child
        yield from _everywhere(child)


def _module_level(body: List[ast.stmt]) -> Iterator[ast.AST]:
    """The statements run at import: the module body and its if/try/with blocks, not functions or classes'
    methods (a class body runs at import too)."""
    for node in body:
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            continue   # typing-only imports never run
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from _module_level(getattr(node, field, []) or [])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def reaches(graph: Dict[str, Set[str]], start: str, goal: str) -> bool:
    """Whether an import path leads from `start` to `goal` or to a module inside it."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        for target in graph.get(module, ()):
            if target == goal or target.startswith(goal + "."):
                return True
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return False


def _inside(module: str, area: str) -> bool:
    return module == area or module.startswith(area + ".")


def imports_between(graph: Dict[str, Set[str]], source: str, target: str) -> List[str]:
    """The imports a module of area `source` makes of a module of area `target` ("a -> b" each)."""
    return sorted(f"{module} -> {imported}" for module, imports in graph.items() if _inside(module, source)
                  for imported in imports if _inside(imported, target))


def circle_between(graph: Dict[str, Set[str]], first: str, second: str) -> bool:
    """Whether the two areas import each other (a module of each imports a module of the other)."""
    return bool(imports_between(graph, first, second)) and bool(imports_between(graph, second, first))


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle per strongly connected group of modules (Tarjan), each as a closed path."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    groups: List[List[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [_closed_path(graph, sorted(group)) for group in groups]


def _closed_path(graph: Dict[str, Set[str]], group: List[str]) -> List[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        module = todo.pop(0)
        for target in sorted(graph[module] & members):
            if target == start:
                return paths[module] + [start]
            if target not in paths:
                paths[target] = paths[module] + [target]
                todo.append(target)
    return group


def test_module_level_imports_have_no_cycle():
    assert cycles(import_graph(function_level=False)) == []


def test_no_cycle_even_through_imports_inside_functions():
    assert cycles(import_graph(function_level=True)) == []


@pytest.mark.parametrize("first, second", NAMED_CIRCLES, ids=lambda name: name.rsplit(".", 1)[-1])
def test_no_named_circle_even_through_imports_inside_functions(first, second):
    graph = import_graph(function_level=True)
    graph["bench"] = {"rlx_triton.cli"} if _bench_imports_cli() else set()
    assert not circle_between(graph, first, second), (imports_between(graph, first, second),
                                                      imports_between(graph, second, first))


def _bench_imports_cli() -> bool:
    """Whether any bench/ module imports rlx_triton.cli (the other half of the cli <-> bench circle)."""
    for path in (ROOT / "bench").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlx_triton"):
                if node.module == "rlx_triton.cli" or any(alias.name == "cli" for alias in node.names):
                    return True
            if isinstance(node, ast.Import) and any(alias.name == "rlx_triton.cli" for alias in node.names):
                return True
    return False


def test_the_package_never_imports_bench_or_tests():
    graph = import_graph(function_level=True)
    offenders = sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                       if target in FORBIDDEN_TOP_LEVEL)
    assert offenders == []


def test_the_package_computes_no_import_of_bench_or_tests():
    offenders = sorted(f"{module}:{getattr(node, 'lineno', 0)}" for module, path in module_names().items()
                       for node in ast.walk(ast.parse(path.read_text(), str(path)))
                       if (_computed_import_prefix(node) or "").split(".")[0] in FORBIDDEN_TOP_LEVEL)
    assert offenders == []


def _computed_import_prefix(node: ast.AST) -> Optional[str]:
    """The constant text an import_module / __import__ call's computed name starts with (f"bench.{name}" ->
    "bench."), None for anything else."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.JoinedStr)):
        return None
    function = node.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
    if name not in ("import_module", "__import__"):
        return None
    first = node.args[0].values[0] if node.args[0].values else None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""


def test_a_typing_only_import_and_a_computed_bench_import_are_told_apart():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
                     "def f():\n    import c\n    importlib.import_module(f'bench.{name}')\n")
    imported = {alias.name for node in _everywhere(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert imported == {"b", "c"}
    assert [_computed_import_prefix(node) for node in ast.walk(tree) if _computed_import_prefix(node) is not None] \
        == ["bench."]


def test_a_cycle_is_found_and_printed_as_a_closed_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert not circle_between(graph, "d", "a")
    assert circle_between({"p.x": {"q"}, "q.y": {"p.z"}}, "p", "q")


def main() -> int:
    for label, function_level in (("module-level imports", False), ("with imports inside functions", True)):
        found = cycles(import_graph(function_level))
        print(f"{label}: {len(found)} cycle(s)")
        for cycle in found:
            print("  " + " -> ".join(cycle))
    graph = import_graph(function_level=True)
    graph["bench"] = {"rlx_triton.cli"} if _bench_imports_cli() else set()
    for first, second in NAMED_CIRCLES:
        there, back = imports_between(graph, first, second), imports_between(graph, second, first)
        print(f"{first} <-> {second}: " + (f"CIRCLE {there} / {back}" if there and back else "none"))
    return 1 if cycles(import_graph(function_level=False)) or cycles(import_graph(function_level=True)) else 0


if __name__ == "__main__":
    sys.exit(main())
