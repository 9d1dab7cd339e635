"""The pytest plugin (entry point `pytest11`: `npumanager`), loaded in every pytest run.

It imports nothing heavy itself: the driver registry (and with it any driver's own
modules, e.g. the cffi extension of `vnpu`) is loaded only when a fixture asks for it.

- option ``--npu-driver NAME``: the driver a `DriverSuite` subclass without a
  ``driver_name`` runs on;
- option ``--npu-seed N``: another seed than the suite's fixed one (also in
  ``PYTEST_ADDOPTS``);
- option ``--npu-driver-options JSON``: options every `DriverSuite` driver is built with
  (a JSON object; `npu-manager vts --driver-option KEY=VALUE` passes them), over the
  suite's own `driver_options`;
- fixture ``npu_registry``: the installed plugins (session-scoped);
- fixture ``npu_driver_record``: the record of ``--npu-driver``;
- marker ``npu_driver``: documents that a test runs on a vendor driver;
- a `DriverSuite` test stopped by a driver's exception fails with the rule's name first.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from npumanager.core.plugins.registry import PluginRegistry
    from npumanager.schemas import DriverRecord


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("npumanager", "npu-manager driver conformance")
    group.addoption(
        "--npu-driver",
        dest="npu_driver",
        default=None,
        metavar="NAME",
        help="the installed driver a DriverSuite subclass without driver_name runs on",
    )
    group.addoption(
        "--npu-driver-options",
        dest="npu_driver_options",
        type=_options_object,
        default={},
        metavar="JSON",
        help="options every DriverSuite driver is built with, as a JSON object",
    )
    group.addoption(
        "--npu-seed",
        dest="npu_seed",
        type=int,
        default=None,
        metavar="N",
        help="the seed of the suite's state machine and random sequences (default: fixed)",
    )


def _options_object(text: str) -> dict[str, Any]:
    """A JSON object of driver options (argparse's type: a ValueError is a usage error)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"a JSON object of driver options; got {text!r}")
    return value


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "npu_driver(name): the test runs the conformance suite on a vendor driver"
    )


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> object:
    """A suite test that a driver's exception stops fails naming its rule, like the others."""
    try:
        return (yield)
    except Exception as exc:
        cls = pyfuncitem.cls
        if isinstance(exc, AssertionError) or cls is None:
            raise
        if not any(c.__module__ == "npumanager.testing.base" for c in cls.__mro__):
            raise
        from npumanager.testing.rules import RULES

        rule = next((r.rule for r in RULES if r.test == pyfuncitem.originalname), None)
        if rule is None:
            raise
        raise AssertionError(
            f"{rule}: expected the driver to raise nothing here; observed "
            f"{type(exc).__name__}: {exc}"
        ) from exc


@pytest.fixture(scope="session")
def npu_registry() -> PluginRegistry:
    """Every installed npu-manager plugin, loaded once per session."""
    from npumanager.core.plugins.registry import load_plugins

    return load_plugins()


@pytest.fixture
def npu_driver_record(request: pytest.FixtureRequest, npu_registry: PluginRegistry) -> DriverRecord:
    """The record of the driver named by ``--npu-driver``."""
    name = request.config.getoption("npu_driver")
    if name is None:
        pytest.fail("no driver named: pass --npu-driver NAME")
    return npu_registry.driver(name)
