"""The package's rooms stay as the docs describe them: no import cycles between its modules, no module importing the
package that contains it, and the layers import only downwards (the rendezvous never imports the Trainer's side).

Read from the source with ``ast``, so the imports counted are the ones a module makes when it is imported: those at
its top level (not under ``if TYPE_CHECKING:``, not inside a function, where a few are deferred on purpose)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lightning_dist_hooks

pytestmark = pytest.mark.unit

PACKAGE_DIR = Path(lightning_dist_hooks.__file__).parent
# Lower layers first; a module may import from its own layer and the ones before it: the launchers' variables, then
# what talks to Lightning, torch's backends and the rendezvous, then what the user configures (flags, hooks), then
# the process group's life. The top (the Trainer, Fabric, strategy, sampler, doctor) may import anything.
LAYERS = [
    ["lightning_dist_hooks.launcher_variables", "lightning_dist_hooks.supported_versions",
     "lightning_dist_hooks.listening_sockets"],
    ["lightning_dist_hooks._lightning_internals", "lightning_dist_hooks.environments", "lightning_dist_hooks.backends",
     "lightning_dist_hooks.mpi", "lightning_dist_hooks.init_methods"],
    ["lightning_dist_hooks.config", "lightning_dist_hooks.hooks"],
    ["lightning_dist_hooks.process_group"],
]


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = ("lightning_dist_hooks", *path.relative_to(PACKAGE_DIR).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


MODULES = module_names()


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def eager_imports(module: str) -> set[str]:
    """The package's modules that importing ``module`` imports directly."""
    found = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, node)
                for alias in node.names:  # "from package import submodule" imports the submodule
                    found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for block in ("body", "orelse", "finalbody", "handlers"):
                    for inner in getattr(node, block, []):
                        visit(inner.body if isinstance(inner, ast.ExceptHandler) else [inner])

    visit(ast.parse(MODULES[module].read_text(encoding="utf-8")).body)
    return {name for name in found if name in MODULES and name != module}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop (Tarjan's strongly connected components).

    >>> cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}})
    [['a', 'b']]
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for neighbour in graph.get(node, ()):
            if neighbour not in index:
                connect(neighbour)
                low[node] = min(low[node], low[neighbour])
            elif neighbour in stack:
                low[node] = min(low[node], index[neighbour])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def layer_of(module: str) -> int:
    for number, layer in enumerate(LAYERS):
        if any(module == room or module.startswith(room + ".") for room in layer):
            return number
    return len(LAYERS)


def test_no_module_of_the_package_imports_itself_around_a_loop():
    assert cycles({module: eager_imports(module) for module in MODULES}) == []


def test_no_module_imports_a_package_that_contains_it():
    """A subpackage's modules never import their package's ``__init__`` (the public face, made of them)."""
    upward = [f"{module} -> {target}" for module in MODULES for target in eager_imports(module)
              if module.startswith(target + ".") and target != "lightning_dist_hooks"]
    assert upward == []


def test_each_layer_imports_only_itself_and_the_layers_below():
    upward = [f"{module} (layer {layer_of(module)}) -> {target} (layer {layer_of(target)})"
              for module in MODULES for target in eager_imports(module) if layer_of(target) > layer_of(module)]
    assert upward == []


def test_the_rooms_are_found_where_the_docs_say():
    assert {"lightning_dist_hooks.process_group.create", "lightning_dist_hooks.init_methods._shared_filesystem.claims",
            "lightning_dist_hooks.init_methods._shared_filesystem.directory_store"} <= set(MODULES)
    assert eager_imports("lightning_dist_hooks.process_group.create") >= {
        "lightning_dist_hooks.process_group.progress", "lightning_dist_hooks.process_group.rendezvous_deadline"}
