"""The package's layout holds: no import circles, no private names across modules, one door to storage.

Values (jobs, options, errors) at the bottom, storage above them, the JobManager
above storage, the Queue, the worker and the front ends on top. Imports made
only for type checking count too: a circle of types is still a circle to read.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nbqueue"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def resolve(current: str, node: ast.ImportFrom) -> str:
    """The absolute module an `from . import x` / `from .x import y` names."""
    if node.level == 0:
        return node.module or ""
    package = current if MODULES[current].name == "__init__.py" else current.rsplit(".", 1)[0]
    for _ in range(node.level - 1):
        package = package.rsplit(".", 1)[0]
    return f"{package}.{node.module}" if node.module else package


@cache  # the layout tests ask for every module's imports many times over
def imports(name: str) -> list[tuple[str, str, int]]:
    """(imported module, imported name, line) for every import in a module of the package."""
    tree = ast.parse(MODULES[name].read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = resolve(name, node)
            for alias in node.names:
                whole = f"{target}.{alias.name}"
                if whole in MODULES:  # `from . import policy`: the module itself
                    found.append((whole, "", node.lineno))
                else:
                    found.append((target, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, "", node.lineno) for alias in node.names)
    return [(module, what, line) for module, what, line in found if module.startswith("nbqueue")]


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for name in MODULES:
        for module, _, _ in imports(name):
            if module != name and module in MODULES and not name.startswith(module + "."):
                edges[name].add(module)
    return edges


def test_no_module_imports_a_private_name_of_another() -> None:
    private = [
        f"{name}:{line} imports {what} from {module}"
        for name in MODULES
        for module, what, line in imports(name)
        if what.startswith("_") and module != name
    ]
    assert not private, private


def test_there_is_no_import_circle() -> None:
    edges = graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                circle = [*path[path.index(nxt) :], nxt]
                pytest.fail(f"import circle: {' -> '.join(circle)}")
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("nbqueue.worker", {"nbqueue.queue", "nbqueue.storage.sqlite", "nbqueue.storage.postgres"}),
        ("nbqueue.context", {"nbqueue.queue", "nbqueue.manager", "nbqueue.storage"}),
        ("nbqueue.queue", {"nbqueue.jupyter", "nbqueue.storage.sqlite", "nbqueue.storage.postgres"}),
        ("nbqueue.manager", {"nbqueue.queue", "nbqueue.worker", "nbqueue.jupyter"}),
        ("nbqueue.jobs", {"nbqueue.queue", "nbqueue.manager", "nbqueue.storage", "nbqueue.tasks"}),
        ("nbqueue.cli", {"nbqueue.storage", "nbqueue.manager"}),
        ("nbqueue.jupyter.magics", {"nbqueue.storage", "nbqueue.manager"}),
        ("nbqueue.jupyter.views", {"nbqueue.storage", "nbqueue.manager"}),
        # The views' HTML is rendered from data alone: no queue, no widgets (test below).
        (
            "nbqueue.jupyter.render",
            {"nbqueue.queue", "nbqueue.manager", "nbqueue.storage", "nbqueue.jupyter.views"},
        ),
    ],
)
def test_layers(module: str, forbidden: set[str]) -> None:
    """Lower layers never reach up; the front ends and the worker never reach into storage."""
    reached = {m for m, _, _ in imports(module)}
    crossing = {m for m in reached for f in forbidden if m == f or m.startswith(f + ".")}
    assert not crossing, f"{module} imports {crossing}"


# The JobManager and its rooms (each holds the storage the manager hands it): the one door.
MANAGER = {
    "nbqueue.manager",
    *("nbqueue.intake", "nbqueue.admin", "nbqueue.journal", "nbqueue.periodic", "nbqueue.links"),
    "nbqueue.lifeline",
    "nbqueue.inbox",
    "nbqueue.checkpoints",
}


def test_only_the_manager_and_the_queue_open_storage() -> None:
    """Above the storage package, only the manager and its rooms (its one door) and the Queue
    (which opens it) import it."""
    users = {
        name
        for name in MODULES
        if not name.startswith("nbqueue.storage")
        for module, _, _ in imports(name)
        if module == "nbqueue.storage" or module.startswith("nbqueue.storage.")
    }
    # (the worker and its batches name the claim request they hand the manager)
    assert users <= {*MANAGER, "nbqueue.queue", "nbqueue.worker", "nbqueue.batches"}, users


def test_no_storage_attribute_is_used_above_the_manager() -> None:
    """`.storage` is touched only by the manager and its rooms: the worker, the views and the CLI
    go through them."""
    offenders = []
    for name, path in MODULES.items():
        if name.startswith("nbqueue.storage") or name in MANAGER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "storage":
                offenders.append(f"{name}:{node.lineno}")
    assert not offenders, offenders


def test_rendering_imports_no_widgets() -> None:
    """jupyter/render.py is pure HTML: it imports neither ipywidgets nor IPython, so its
    functions are tested (and reused) without a kernel."""
    tree = ast.parse(MODULES["nbqueue.jupyter.render"].read_text())
    named = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    named += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [n for n in named if n.split(".")[0] in ("ipywidgets", "IPython", "anywidget")], named


FRONT_ENDS = [name for name in MODULES if name.startswith("nbqueue.jupyter") or name == "nbqueue.cli"]


@pytest.mark.parametrize("module", FRONT_ENDS)
def test_front_ends_go_through_the_queue_s_public_methods(module: str) -> None:
    """The board, the magics and the CLI call what a user can call: never `.manager` or
    `.storage`, nor a private name of the Queue."""
    offenders = [
        f"{module}:{node.lineno} .{node.attr}"
        for node in ast.walk(ast.parse(MODULES[module].read_text()))
        if isinstance(node, ast.Attribute)
        and (node.attr in ("manager", "storage") or (node.attr.startswith("_") and _on_a_queue(node)))
    ]
    assert not offenders, offenders


def _on_a_queue(node: ast.Attribute) -> bool:
    """`queue._x`, `self.queue._x`, `q._x`: a private name reached on something called a queue."""
    owner = node.value
    name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
    return name in ("queue", "q")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_longer_than_700_lines(module: str) -> None:
    """A module a reader can hold: the longest were split by concern (the manager's rooms,
    the views' rendering, the Queue's reads)."""
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= 700, f"{module} has {lines} lines"
