"""The suite's own layout: test modules share code through `tests/helpers/` and fixtures
through `tests/conftest.py`, never by importing one another; one `daemon` fixture."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
CONFTEST = TESTS / "conftest.py"


def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _where(path: Path, node: ast.stmt) -> str:
    return f"{path.relative_to(TESTS.parent)}:{node.lineno}"


def _test_module_imports(tree: ast.Module) -> Iterator[tuple[ast.stmt, str]]:
    """Each import (anywhere in the module, lazy ones too) of a `test_*` module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0].startswith("test_"):
                    yield node, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            if node.module is not None and node.module.split(".")[0].startswith("test_"):
                names = ", ".join(alias.name for alias in node.names)
                yield node, f"from {node.module} import {names}"
            elif node.module is None:  # `from . import test_x`
                for alias in node.names:
                    if alias.name.startswith("test_"):
                        yield node, f"from {'.' * node.level} import {alias.name}"


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Attribute) and target.attr == "fixture") or (
        isinstance(target, ast.Name) and target.id == "fixture"
    )


def _fixtures(tree: ast.Module) -> Iterator[tuple[ast.stmt, str]]:
    """Each fixture a module defines, by the name tests ask for it (`name=` if given)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                if not _is_fixture(decorator):
                    continue
                name = node.name
                if isinstance(decorator, ast.Call):
                    for keyword in decorator.keywords:
                        if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                            name = str(keyword.value.value)
                yield node, name


def _module_level_names(tree: ast.Module) -> Iterator[tuple[ast.stmt, str]]:
    """Names a module binds at its top level by assignment or import (a fixture taken from
    another module is bound so: `daemon = other.daemon`, `from other import daemon`)."""
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        yield node, name.id
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                yield node, alias.asname or alias.name


def test_no_test_module_imports_another() -> None:
    found = [
        f"{_where(path, node)}: {path.stem} does `{statement}`"
        for path in sorted(TESTS.glob("test_*.py"))
        for node, statement in _test_module_imports(_parsed(path))
    ]
    assert not found, (
        "a test module imports another test module (share code through tests/helpers/, "
        "fixtures through tests/conftest.py):\n" + "\n".join(found)
    )


def test_the_daemon_fixture_is_defined_only_in_conftest() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == CONFTEST:
            continue
        tree = _parsed(path)
        found += [
            f"{_where(path, node)}: a fixture named `daemon`"
            for node, name in _fixtures(tree)
            if name == "daemon"
        ]
        found += [
            f"{_where(path, node)}: binds the name `daemon` at module level"
            for node, name in _module_level_names(tree)
            if name == "daemon"
        ]
    assert not found, (
        "the `daemon` fixture is tests/conftest.py's alone (a factory: `daemon(*serve_args)`, "
        "`daemon.on_a_thread(service)`):\n" + "\n".join(found)
    )
    assert "daemon" in {name for _, name in _fixtures(_parsed(CONFTEST))}, "conftest.py has none"


def test_a_command_the_suite_starts_can_be_interrupted_with_ctrl_c() -> None:
    """Tests send SIGINT to the commands they start. A shell that runs the suite in the
    background (`pytest &`, as a CI harness may) hands it SIGINT ignored, and children
    inherit that; the suite gives its children the default back."""
    probe = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "True", "a command started by a test ignores Ctrl-C"


def test_the_processes_the_suite_starts_cache_their_bytecode() -> None:
    """`write_bytecode` (conftest.py): with `PYTHONDONTWRITEBYTECODE` set on the machine,
    each of the suite's processes compiled every module it imported from source."""
    probe = "import sys; print(sys.dont_write_bytecode)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False", "a process started by a test writes no bytecode"


def test_auto_runs_one_worker_more_than_the_cpus(request: pytest.FixtureRequest) -> None:
    """`pytest_xdist_auto_num_workers` (conftest.py): `-n auto` gives the CPUs plus one."""
    config = request.config
    asked = [*config.getini("addopts"), *config.invocation_params.args]
    counts = [a for a in asked if a.startswith(("-n", "--numprocesses"))]
    if not counts or counts[-1] not in ("-nauto", "--numprocesses=auto"):
        pytest.skip("this run did not ask for -n auto (pyproject's addopts do)")
    caps = [int(a.split("=")[1]) for a in asked if a.startswith("--maxprocesses=")]
    expected = min(len(os.sched_getaffinity(0)) + 1, *caps)
    assert os.environ["PYTEST_XDIST_WORKER_COUNT"] == str(expected)


def test_the_longest_tests_are_collected_first(request: pytest.FixtureRequest) -> None:
    """`FIRST_MODULES` (conftest.py): when the load test is collected, it starts the run."""
    stems = [item.path.stem for item in request.session.items]
    if "test_daemon_load" not in stems:
        pytest.skip("the load test is not collected in this run")
    first = stems.index("test_daemon_load")
    assert first == 0, f"the load test is collected {first} tests in, after {stems[0]}"
