"""The package's rooms stay as the docs describe them: no import cycles between its modules, no module importing the
package that contains it, and the layers import only downwards (the rendezvous never imports the Trainer's side).
Around it, the repository's other code (benchmarks, examples, tests) imports nothing around a loop either, and the
package imports none of it.

Read from the source with ``ast``, so the imports counted are the ones a module makes when it is imported: those at
its top level, those under ``if TYPE_CHECKING:`` included (a loop of types is a loop for its reader all the same),
not those inside a function, where the package defers a few on purpose. Outside the package, and for what the
package may never import, the imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lightning_dist_hooks

pytestmark = pytest.mark.unit

PACKAGE_DIR = Path(lightning_dist_hooks.__file__).parent
REPO = Path(__file__).resolve().parents[1]
# Lower layers first; a module may import from its own layer and the ones before it: the launchers' variables, then
# what talks to Lightning, torch's backends and the rendezvous, then what the user configures (flags, hooks), then
# the process group's life. The top (the Trainer, Fabric, strategy, sampler, doctor) may import anything.
LAYERS = [
    [
        "lightning_dist_hooks.launcher_variables",
        "lightning_dist_hooks.supported_versions",
        "lightning_dist_hooks.listening_sockets",
        "lightning_dist_hooks.verdict",
        "lightning_dist_hooks.torch_rendezvous",
        "lightning_dist_hooks.wait_schedule",
        "lightning_dist_hooks.outside_watchdog",
    ],
    [
        "lightning_dist_hooks._lightning_internals",
        "lightning_dist_hooks.environments",
        "lightning_dist_hooks.environment_plugin",
        "lightning_dist_hooks.backends",
        "lightning_dist_hooks.mpi",
        "lightning_dist_hooks.init_methods",
        "lightning_dist_hooks.transports",
    ],
    ["lightning_dist_hooks.bootstrap_plan", "lightning_dist_hooks.hooks"],
    ["lightning_dist_hooks.process_group"],
]


def module_names(directory: Path, package: str | None = None) -> dict[str, Path]:
    """The modules in ``directory`` by the names they are imported as: ``package.sub.module`` in a package; in a
    folder of scripts (run with the folder on ``sys.path``, as tests/ and examples/ are), each file's own name."""
    if package is None:
        return {path.stem: path for path in directory.glob("*.py")}
    names = {}
    for path in directory.rglob("*.py"):
        parts = (package, *path.relative_to(directory).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


MODULES = module_names(PACKAGE_DIR, "lightning_dist_hooks")
# The repository around the package: a package run with ``python -m``, and folders of scripts.
AROUND = {"benchmarks": module_names(REPO / "benchmarks", "benchmarks")} | {
    folder: module_names(REPO / folder) for folder in ("examples", "tests", "tests/mpi", "tests/jobs")
}


def _absolute(module: str, node: ast.ImportFrom, modules: dict[str, Path]) -> str:
    if not node.level:
        return node.module or ""
    package = module if modules[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports(module: str, modules: dict[str, Path] = MODULES, deferred: bool = False) -> set[str]:
    """Every module (of ``modules`` or not) that importing ``module`` imports directly; with ``deferred``, also those
    that its functions import when they run."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node, modules)
            for alias in node.names:  # "from package import submodule" imports the submodule
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
        elif deferred or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.iter_child_nodes(node):
                visit(inner)

    visit(ast.parse(modules[module].read_text(encoding="utf-8")))
    return found - {module}


def eager_imports(module: str) -> set[str]:
    """The package's modules that importing ``module`` imports directly."""
    return imports(module) & MODULES.keys()


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop (Tarjan's strongly connected components).

    >>> cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}})
    [['a', 'b']]
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

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
            group: list[str] = []
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


@pytest.mark.parametrize("folder", AROUND)
def test_no_module_of_the_repository_around_the_package_imports_itself_around_a_loop(folder):
    """Counting the imports inside functions: a loop closed only when a function runs is a loop all the same."""
    modules = AROUND[folder]
    assert cycles({module: imports(module, modules, deferred=True) & modules.keys() for module in modules}) == []


def test_the_package_imports_nothing_of_the_repository_around_it():
    """Not even inside a function: benchmarks/, examples/ and tests/ are not installed with the package."""
    around = {"benchmarks", "examples", "tests"} | {
        name.partition(".")[0] for modules in AROUND.values() for name in modules
    }
    reached = [
        f"{module} -> {target}"
        for module in MODULES
        for target in imports(module, deferred=True)
        if target.partition(".")[0] in around
    ]
    assert reached == []


@pytest.mark.parametrize("package", ["lightning_dist_hooks", "benchmarks"])
def test_no_module_imports_a_package_that_contains_it(package):
    """A subpackage's modules never import their package's ``__init__`` (the public face, made of them); nor do the
    benchmarks' modules import ``benchmarks/__init__.py``, imports inside functions included."""
    modules = MODULES if package == "lightning_dist_hooks" else AROUND[package]
    deferred = package != "lightning_dist_hooks"  # the package defers a few imports on purpose (module docstring)
    upward = [
        f"{module} -> {target}"
        for module in modules
        for target in imports(module, modules, deferred=deferred) & modules.keys()
        if module.startswith(target + ".") and target != "lightning_dist_hooks"
    ]
    assert upward == []


def test_each_layer_imports_only_itself_and_the_layers_below():
    upward = [
        f"{module} (layer {layer_of(module)}) -> {target} (layer {layer_of(target)})"
        for module in MODULES
        for target in eager_imports(module)
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []


def test_the_rooms_are_found_where_the_docs_say():
    assert {
        "lightning_dist_hooks.process_group.create",
        "lightning_dist_hooks.init_methods._shared_filesystem.claims",
        "lightning_dist_hooks.init_methods._shared_filesystem.directory_store",
    } <= set(MODULES)
    assert eager_imports("lightning_dist_hooks.process_group.create") >= {
        "lightning_dist_hooks.process_group.progress",
        "lightning_dist_hooks.process_group.rendezvous_deadline",
    }


def _closed_within(module: str) -> str | None:
    """The package a module is closed within (docs/how-it-works.md, Conventions): the one holding its innermost part
    with a leading underscore (``lightning_dist_hooks.mpi._engine``: ``lightning_dist_hooks.mpi``); None if open."""
    parts = module.split(".")
    for index in range(len(parts) - 1, 0, -1):
        if parts[index].startswith("_") and not parts[index].startswith("__"):
            return ".".join(parts[:index])
    return None


def test_a_closed_module_is_imported_only_from_inside_the_package_that_holds_it():
    reaching_in = []
    for module in MODULES:
        for imported in imports(module, deferred=True) & MODULES.keys():
            package = _closed_within(imported)
            if package is not None and module != package and not module.startswith(f"{package}."):
                reaching_in.append(f"{module} imports {imported}, closed within {package}")
    assert reaching_in == [], "import it from the package's __init__, which re-exports what others need:\n" + "\n".join(
        reaching_in
    )
