"""`DriverSuite`: the HAL conformance tests every vendor driver runs on itself.

See the package docstring for what a driver package sets and which driver calls the
suite makes. Test names follow the platform's `VtsHalNpuSchedulingTargetTest`; the rules
are grouped by family in `hal`, `ordering` and `resources`, and listed in `rules.RULES`.
"""

from __future__ import annotations

from typing import ClassVar

from npumanager.testing.base import (
    Driver,
    Factory,
    Recorder,
    completion_order,
    final_reason,
    lifecycle,
    requires,
)
from npumanager.testing.hal import HalRules
from npumanager.testing.ordering import OrderRules
from npumanager.testing.resources import ResourceRules

__all__ = [
    "Driver",
    "DriverSuite",
    "Factory",
    "Recorder",
    "completion_order",
    "final_reason",
    "lifecycle",
    "requires",
]


class DriverSuite(HalRules, OrderRules, ResourceRules):
    """The conformance tests; subclass with ``__test__ = True`` and a ``driver_name``."""

    __test__: ClassVar[bool] = False
