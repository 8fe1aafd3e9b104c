"""The package's layering, read from the source with ast so it stays true as code moves:

- no circle of imports between modules (lazy imports inside functions count: they still tie the modules);
- `config/` and `formats/` import nothing of the package outside themselves (they are the floor), but the
  leaves (exit_codes.py), which import nothing at all;
- only `launch/` imports the vLLM argv builder (launch/command.py): one package knows vLLM's command line.

Imports under `if TYPE_CHECKING:` are left out: they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "hyperqwen"
BUILDER = "hyperqwen.launch.command"
# Leaves every package may import, the floor included: they import nothing of the package themselves.
LEAVES = ("hyperqwen.exit_codes",)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(tree: ast.AST, here: str, is_package: bool) -> set[tuple[str, str]]:
    """(module named, name taken from it or "") for every import statement of this module."""
    found: set[tuple[str, str]] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update((alias.name, "") for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".") if is_package else here.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.update((base, alias.name) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {(base, name) for base, name in found if base == "hyperqwen" or base.startswith("hyperqwen.")}


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (a `from pkg import name` counts for pkg.name when that is
    a module, else for pkg)."""
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = {
            f"{base}.{taken}" if f"{base}.{taken}" in files else base
            for base, taken in imported_names(tree, name, path.name == "__init__.py")
        }
        graph[name] = {target for target in targets if target in files and target != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
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

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


GRAPH = import_graph()


def test_the_graph_is_read():
    """A reader that finds nothing would pass every rule below: known arrows must be there."""
    assert "hyperqwen.config.settings" in GRAPH["hyperqwen.launch.command"]
    assert BUILDER in GRAPH["hyperqwen.launch.serve"]
    assert len(GRAPH) > 60


def test_no_circles_between_modules():
    assert circles(GRAPH) == []


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("floor", ["hyperqwen.config", "hyperqwen.formats"])
def test_the_floor_imports_nothing_above_it(floor):
    above = {
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if module.startswith(floor + ".")
        for target in targets
        if not target.startswith(floor + ".") and target != floor and target not in LEAVES
    }
    assert sorted(above) == []


@pytest.mark.parametrize("leaf", LEAVES)
def test_leaves_import_nothing_of_the_package(leaf):
    assert GRAPH[leaf] == set()


def test_only_launch_knows_the_vllm_command_line():
    outside = sorted(module for module, targets in GRAPH.items() if BUILDER in targets)
    assert [module for module in outside if not module.startswith("hyperqwen.launch.")] == []
