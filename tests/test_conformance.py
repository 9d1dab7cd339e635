"""The conformance suite (`npumanager.testing`) on the shipped drivers."""

from __future__ import annotations

import pytest

from npumanager.schemas import DriverCapability
from npumanager.testing import DriverSuite
from npumanager.vendor_drivers.vnpu import CAPABILITIES as VNPU_CAPABILITIES


class TestReferenceConformance(DriverSuite):
    __test__ = True
    driver_name = "reference"


class TestVnpuConformance(DriverSuite):
    __test__ = True
    driver_name = "vnpu"


class TestVnpuRealClockConformance(DriverSuite):
    """The C driver on the real clock: no virtual time, so no timing is asserted.

    Thread-safe there: submits from several threads at once get distinct, increasing ids.
    """

    __test__ = True
    thread_safe = True
    driver_name = "vnpu"
    driver_options = {"clock": "real"}  # noqa: RUF012 - read only

    @pytest.fixture
    def driver_capabilities(self) -> frozenset[DriverCapability]:
        return VNPU_CAPABILITIES - {DriverCapability.VIRTUAL_TIME}


def test_the_base_suite_is_not_collected_on_its_own() -> None:
    assert DriverSuite.__test__ is False
    assert TestReferenceConformance.__test__ is True
