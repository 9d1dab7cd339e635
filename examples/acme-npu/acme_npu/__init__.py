"""`acme`: an npu-manager vendor driver for the (imaginary) Acme N1, in pure Python.

Written against npu-manager's public API only (`import npumanager`). The Acme N1 is one
NPU with two execution channels, 2 GiB of weight memory and 4 MiB of SRAM at 800 MHz; its
firmware schedules like npu-manager's reference device (priority bands, fair share between
uids inside a band, preemption at slice boundaries, a thermal model), so the driver is an
`npumanager.EngineDriver` on `npumanager.ReferenceEngine`, in virtual time: it gets the
whole `npumanager.Driver` protocol and the `VirtualClock` and `ThermalModel` capabilities
from that base. What the driver itself decides: the device it models, that there is
exactly one of it, and what it claims.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from npumanager import (
    DeviceSpec,
    DriverCapability,
    DriverRecord,
    Engine,
    EngineDriver,
    IllegalArgumentError,
    ReferenceEngine,
    hookimpl,
)

__version__ = "0.1.0"

ACME_N1 = DeviceSpec(
    channels=2,
    weight_memory_bytes=2 << 30,
    sram_bytes=4 << 20,
    clock_mhz=800,
    slice_us=2000,
)
"""The one device an Acme board carries."""

CAPABILITIES = frozenset(
    {
        DriverCapability.PREEMPTION,
        DriverCapability.THERMAL_MODEL,
        DriverCapability.VIRTUAL_TIME,
        DriverCapability.FAIR_SHARE,
    }
)
"""What the Acme driver claims: no MULTI_DEVICE (a board has one N1), no real time."""


class AcmeDriver(EngineDriver):
    """The Acme N1 driver; `devices` may override the N1's spec, but there is only one."""

    def __init__(
        self, devices: int | Sequence[DeviceSpec | Mapping[str, Any]] = (ACME_N1,), **options: Any
    ) -> None:
        count = devices if isinstance(devices, int) else len(devices)
        if count != 1:
            raise IllegalArgumentError(f"an Acme board has exactly one N1; asked for {count}")
        if isinstance(devices, int):
            devices = [ACME_N1]
        super().__init__(devices, **options)

    def _make_engine(self) -> Engine:
        return ReferenceEngine(self.specs, self.max_live_work, self.max_models)


@hookimpl
def npumanager_register_drivers() -> Iterable[DriverRecord]:
    """Register the Acme driver under the name `acme`."""
    return [
        DriverRecord(
            name="acme",
            factory=AcmeDriver,
            capabilities=CAPABILITIES,
            version=__version__,
            description="the Acme N1 NPU (an example third-party driver)",
        )
    ]
