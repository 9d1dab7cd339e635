"""Mutation testing of the conformance suite: every broken driver in `mutant_drivers` must
fail the suite's rules for its bug, on the virtual clock and on the real clock.

The rules run in-process (a suite instance, its `make` done by hand), only those named for
each mutant, so the whole matrix stays a few seconds; the unbroken reference driver passes
the same rules on both clocks, so a catch is the bug's and not the harness's.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from helpers import mutant_drivers
from helpers.mutant_drivers import MUTANTS, REAL, VIRTUAL, MutantDriver, on_wall_clock, records
from npumanager.core.plugins.registry import PluginRegistry, PluginSource
from npumanager.schemas import DriverCapability
from npumanager.schemas.limits import VTS_SEED
from npumanager.testing.rules import RULES
from npumanager.testing.suite import DriverSuite

PASSED = "passed"


def run_rule(factory: Any, capabilities: frozenset[Any], test: str) -> str:
    """Run one suite test on drivers from `factory`: PASSED, 'skipped: ...' or the failure."""
    suite = DriverSuite()
    suite._caps = frozenset(capabilities)
    method = getattr(suite, test)
    for cap in getattr(method, "_npu_requires", ()):
        if cap not in suite._caps:
            return f"skipped: driver does not claim {cap}"
    made: list[Any] = []

    def make(devices: Any = None) -> Any:
        driver = factory() if devices is None else factory(devices=devices)
        made.append(driver)
        return driver

    offered = {"make": make, "driver_factory": factory, "npu_seed": VTS_SEED}
    wanted = inspect.signature(method).parameters
    try:
        method(**{name: offered[name] for name in wanted})
    except (AssertionError, pytest.fail.Exception) as exc:
        return str(exc)
    except pytest.skip.Exception as exc:
        return f"skipped: {exc}"
    except Exception as exc:  # the driver broke the test: caught, though not by a message
        return f"error: {type(exc).__name__}: {exc}"
    finally:
        for driver in made:
            driver.close()
    return PASSED


CLOCKS = {"virtual": (lambda d: d, VIRTUAL), "real": (on_wall_clock, REAL)}
MATRIX = [(m, clock) for m in MUTANTS for clock in CLOCKS]


@pytest.fixture(scope="module")
def registry() -> PluginRegistry:
    """The mutants registered as a plugin, the way an installed vendor package is."""
    plugins = PluginRegistry()
    assert plugins.register(mutant_drivers, PluginSource("mutants", "npu-mutants", "0"))
    return plugins


@pytest.mark.parametrize(("mutant", "clock"), MATRIX, ids=[f"{m.name}-{c}" for m, c in MATRIX])
def test_the_suite_catches_the_mutant(mutant: Any, clock: str, registry: PluginRegistry) -> None:
    record = registry.driver(f"mutant-{mutant.name}-{clock}")
    outcomes = {
        test: run_rule(record.factory, frozenset(record.capabilities), test)
        for test in mutant.rules
    }
    caught = {t: o for t, o in outcomes.items() if o != PASSED and not o.startswith("skipped")}
    assert caught, f"mutant {mutant.name} survived on the {clock} clock: {outcomes}"
    names = {r.test: r.rule for r in RULES}
    for test, message in caught.items():
        assert message.startswith(names[test]), (test, message)


RULES_USED = sorted({t for m in MUTANTS for t in m.rules})


@pytest.mark.parametrize("clock", CLOCKS)
@pytest.mark.parametrize("test", RULES_USED)
def test_the_unbroken_driver_passes_the_same_rules(test: str, clock: str) -> None:
    wrap, caps = CLOCKS[clock]
    assert run_rule(wrap(MutantDriver), caps, test) == PASSED


def test_enough_mutants_each_registered_on_both_clocks(registry: PluginRegistry) -> None:
    assert len(MUTANTS) >= 24
    names = [r.name for r in records()]
    assert len(names) == len(set(names)) == 2 * len(MUTANTS)
    for name in names:
        caps = registry.driver(name).capabilities
        clock = DriverCapability.VIRTUAL_TIME if name.endswith("-virtual") else "real_time"
        assert clock in caps, (name, caps)


class TestUnbrokenOnWallClock(DriverSuite):
    """The whole suite on the mutants' real clock with no bug: every rule holds there."""

    __test__ = True

    @pytest.fixture
    def driver_factory(self) -> Any:
        return on_wall_clock(MutantDriver)

    @pytest.fixture
    def driver_capabilities(self) -> frozenset[DriverCapability]:
        return REAL
