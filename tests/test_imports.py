"""No import circles anywhere in the package (DESIGN.md: imports point down only).

Every ``import`` statement of every module counts, wherever it stands (a function-level
import that dodges a circle at runtime is still one), and so does every folder's
``__init__``.
"""

import ast
import pathlib

import agentic_esopt

ROOT = pathlib.Path(agentic_esopt.__file__).parent
PACKAGE = ROOT.name


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(name: str, tree: ast.Module, modules: set[str],
                     is_package: bool) -> set[str]:
    """The package's modules that a module's imports name (``from a import b`` names the
    module ``a.b`` when there is one, else ``a``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # Relative to the importing module's package.
                package = name.split(".")[:len(name.split(".")) - node.level + is_package]
                base = ".".join(package + ([base] if base else []))
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in node.names)
    return {module for module in found if module in modules}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    paths = {module_name(path): path for path in ROOT.rglob("*.py")}
    return {name: imported_modules(name, ast.parse(path.read_text(), str(path)), set(paths),
                                   path.name == "__init__.py")
            for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, and self-importers
    (Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One circle through a component's first module: [m, ..., m]."""
    start, members = component[0], set(component)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for target in sorted(graph[path[-1]] & members):
            if target == start:
                return path + [start]
            if target not in seen:
                seen.add(target)
                paths.append(path + [target])
    raise AssertionError(f"no circle through {start}")


def test_the_checker_finds_circles_and_self_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert cycles(graph) == [["a", "b", "c"], ["d"]]
    assert cycle_path(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_the_graph_resolves_imports_to_modules():
    graph = import_graph()
    assert f"{PACKAGE}.models.sampling" in graph[f"{PACKAGE}.models"]
    assert f"{PACKAGE}.models.decoder" in graph[f"{PACKAGE}.models.sampling"]


def test_no_import_circles():
    graph = import_graph()
    circles = [" -> ".join(cycle_path(graph, component)) for component in cycles(graph)]
    assert not circles, "import circles:\n" + "\n".join(circles)
