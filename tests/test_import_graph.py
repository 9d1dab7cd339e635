"""The import graph of `npumanager`: no cycles, and none of the directions design.md forbids.

Every import statement counts, wherever it is: at the top, inside a function (a lazy
import), and under `if TYPE_CHECKING:`. A typing-only import is still a dependency of the
module's meaning, and a cycle through one is what a lazy import would hide; so a cycle
is a cycle whichever imports make it. An import names the module it reads from: `from
a.b import c` is an edge to `a.b.c` when that is a module and to `a.b` otherwise; the
parent packages Python initialises on the way are not edges of their own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import npumanager

ROOT = Path(npumanager.__file__).parent
PACKAGE = "npumanager"

SERVICE = f"{PACKAGE}.core.service"
"""The service and its parts (a package)."""
DRIVER_SIDE = (f"{PACKAGE}.core.driver", f"{PACKAGE}.core.plugins.hookspecs")
"""What of the core a driver may import: the contract and what it needs."""
LEAVES = {
    f"{PACKAGE}.errors",
    f"{PACKAGE}.checks",
    f"{PACKAGE}.modelfiles",
    f"{PACKAGE}.runtime_options",
    f"{PACKAGE}.sortedlist",
    f"{PACKAGE}.apps.identity",
    f"{PACKAGE}.apps.device_users",
    f"{PACKAGE}.core.plugins.factories",
}
"""Errors and leaf helpers: they import only the schemas (and a helper the errors it raises)."""
LEAVES_ON_LEAVES = {f"{PACKAGE}.apps.device_users": {f"{PACKAGE}.apps.identity"}}
"""Leaf helpers built on another leaf: what each may import beyond the schemas and errors."""
LAYERED = (f"{PACKAGE}.core", f"{PACKAGE}.daemon")
"""Packages whose subpackages are components of their own (`core.arbiter`, `daemon.wire`)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every module of the package this one imports, by any import statement anywhere."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                target = f"{source}.{alias.name}"
                yield target if target in known else source


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {
        name: {target for target in imports(name, path, known) if target != name}
        for name, path in found.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
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


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def forbidden(source: str, target: str) -> str | None:
    """Why design.md's "What must never be" forbids `source` importing `target`, or None."""
    schemas = f"{PACKAGE}.schemas"
    drivers = f"{PACKAGE}.vendor_drivers"
    if within(source, schemas) and not within(target, schemas):
        return "schemas import nothing of the package but schemas"
    allowed = LEAVES_ON_LEAVES.get(source, set())
    if source in LEAVES and not (
        within(target, schemas) or target == f"{PACKAGE}.errors" or target in allowed
    ):
        return "errors and leaf helpers import only schemas"
    decides = within(source, f"{PACKAGE}.core.arbiter", f"{PACKAGE}.plugins.policies")
    if decides and within(target, SERVICE, drivers, f"{PACKAGE}.daemon", f"{PACKAGE}.cli"):
        return "the arbiter and the policies import neither the service, drivers, daemon nor CLI"
    if within(target, drivers) and not within(source, drivers):
        oracle = within(source, f"{PACKAGE}.testing") and within(target, f"{drivers}.reference")
        # A model host runs a real driver's sessions in a process of their own.
        hosts = within(source, f"{PACKAGE}.daemon.host") and within(target, f"{drivers}.realexec")
        if source != PACKAGE and not oracle and not hosts:
            return "nothing outside vendor_drivers imports a driver"
    if within(source, drivers) and not (
        within(target, schemas, drivers, *DRIVER_SIDE) or target in LEAVES
    ):
        return "a driver imports only schemas, errors, leaf helpers and the driver side of core"
    if within(source, f"{PACKAGE}.core") and within(target, f"{PACKAGE}.daemon", f"{PACKAGE}.cli"):
        return "the core imports neither the daemon nor the CLI"
    return None


def component(module: str) -> str:
    """The component a module belongs to: a subpackage of `core` or `daemon`
    (`npumanager.core.arbiter`), else a top-level module or package of npumanager."""
    parts = module.split(".")
    depth = 3 if ".".join(parts[:2]) in LAYERED else 2
    return ".".join(parts[:depth])


def component_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for source, targets in graph().items():
        mine = component(source)
        edges.setdefault(mine, set()).update(
            component(t) for t in targets if component(t) != mine and t != PACKAGE
        )
    return edges


def test_the_graph_sees_every_kind_of_import() -> None:
    edges = graph()
    assert f"{PACKAGE}.schemas.enums" in edges[f"{PACKAGE}.schemas"]  # relative
    service, arbiter = f"{PACKAGE}.core.service.service", f"{PACKAGE}.core.arbiter.arbiter"
    assert arbiter in edges[service]  # from-import
    assert f"{PACKAGE}.errors" in edges[f"{PACKAGE}.daemon.client.client"]  # package import
    assert f"{PACKAGE}.testing.suite" in edges[f"{PACKAGE}.testing"]  # under TYPE_CHECKING


def test_cycles_are_found_through_lazy_and_typing_only_imports() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_no_cycles_between_components() -> None:
    """Layers and roles import one way: no component (`core.service`, `telemetry`,
    `daemon.wire`, `plugins`...) reaches back to one that imports it."""
    assert component("npumanager.core.arbiter.arbiter") == "npumanager.core.arbiter"
    assert component("npumanager.telemetry.hub") == "npumanager.telemetry"
    assert cycles(component_graph()) == []


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (f"{PACKAGE}.schemas.device", f"{PACKAGE}.core.driver.events"),
        (f"{PACKAGE}.checks", f"{PACKAGE}.core.driver.contract"),
        (f"{PACKAGE}.apps.device_users", f"{PACKAGE}.apps.registry"),
        (f"{PACKAGE}.apps.identity", f"{PACKAGE}.apps.device_users"),
        (f"{PACKAGE}.core.arbiter.arbiter", f"{PACKAGE}.core.service.service"),
        (f"{PACKAGE}.plugins.policies.budget", f"{PACKAGE}.vendor_drivers.vnpu"),
        (f"{PACKAGE}.core.service.backend", f"{PACKAGE}.vendor_drivers.simulated"),
        (f"{PACKAGE}.vendor_drivers.vnpu", f"{PACKAGE}.core.service.service"),
        (f"{PACKAGE}.vendor_drivers.vnpu", f"{PACKAGE}.core.client.manager"),
        (f"{PACKAGE}.vendor_drivers.vnpu", f"{PACKAGE}.telemetry.hub"),
        (f"{PACKAGE}.core.client.manager", f"{PACKAGE}.daemon.client.client"),
    ],
)
def test_each_never_is_recognised(source: str, target: str) -> None:
    assert forbidden(source, target) is not None


def test_no_forbidden_direction() -> None:
    broken = [
        f"{source} -> {target}: {why}"
        for source, targets in sorted(graph().items())
        for target in sorted(targets)
        if (why := forbidden(source, target)) is not None
    ]
    assert broken == []


OWNER = {f"{PACKAGE}.core.service.{name}" for name in ("state", "carrying", "clocks")}
"""The service's one owner (`state.ServiceState` on its base `carrying`) and its clocks."""
OWNED = {"_lock", "_arbiter", "_records", "_driver", "locked"}
"""What the owner holds: nothing else reaches for them on another object."""
FACADES = (f"{PACKAGE}.core.service.service", f"{PACKAGE}.core.service.backend")
"""Thin facades over the owner, with the daemon's server: they call no method of the
arbiter or the driver and take no lock of the service."""


def reaches(path: Path, facade: bool) -> Iterator[str]:
    """Where a module reaches into what only the owner may touch."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute):
            continue
        on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
        if node.attr in OWNED and not on_self:
            yield f"{path.name}:{node.lineno}: .{node.attr} of another object"
        inner = node.value
        if facade and isinstance(inner, ast.Attribute) and inner.attr in ("arbiter", "driver"):
            yield f"{path.name}:{node.lineno}: .{inner.attr}.{node.attr}"


def test_nothing_but_the_owner_touches_the_services_state() -> None:
    found = {
        name: list(reaches(path, within(name, *FACADES, f"{PACKAGE}.daemon.server")))
        for name, path in modules().items()
        if name not in OWNER
    }
    assert {name: where for name, where in found.items() if where} == {}


def test_reaching_into_the_owner_is_recognised(tmp_path: Path) -> None:
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("def f(state, service):\n    state._lock\n    service.arbiter.tick(0)\n")
    assert len(list(reaches(sneaky, facade=True))) == 2
    assert len(list(reaches(sneaky, facade=False))) == 1


MAX_PARAMETERS = 8
"""Beyond this a function takes a record (a `Job`, a config) instead of loose values."""


def test_no_function_but_a_public_constructor_takes_more_than_eight_parameters() -> None:
    crowded = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = node.args
            given = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            count = len([a for a in given if a.arg not in ("self", "cls")])
            if count > MAX_PARAMETERS and node.name != "__init__":
                crowded.append(f"{name}.{node.name} takes {count}")
    assert crowded == []
