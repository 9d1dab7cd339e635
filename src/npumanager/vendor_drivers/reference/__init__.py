"""The `reference` driver: the simulated NPU in plain Python, the oracle for `vnpu`."""

from __future__ import annotations

from collections.abc import Iterable

from npumanager.core.plugins.hookspecs import hookimpl
from npumanager.schemas import DriverCapability, DriverRecord
from npumanager.vendor_drivers.reference.engine import ReferenceEngine
from npumanager.vendor_drivers.simulated import Engine, EngineDriver


class ReferenceDriver(EngineDriver):
    """The simulated NPU, every rule written out in Python; virtual time only."""

    def _make_engine(self) -> Engine:
        return ReferenceEngine(self.specs, self.max_live_work, self.max_models)


CAPABILITIES = frozenset(
    {
        DriverCapability.PREEMPTION,
        DriverCapability.THERMAL_MODEL,
        DriverCapability.VIRTUAL_TIME,
        DriverCapability.MULTI_DEVICE,
        DriverCapability.FAIR_SHARE,
    }
)


@hookimpl
def npumanager_register_drivers() -> Iterable[DriverRecord]:
    """Register the reference driver."""
    return [
        DriverRecord(
            name="reference",
            factory=ReferenceDriver,
            capabilities=CAPABILITIES,
            description="the simulated NPU in plain Python (the oracle for vnpu)",
        )
    ]
