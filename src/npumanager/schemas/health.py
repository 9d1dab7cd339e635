"""What a health source reports: memory pressure, thermal readings and device readings.

A source's `read()` returns a `HealthSample` (or a dict of the same shape, validated at
the boundary). A reading it cannot make is left out, never guessed: an absent severity
or memory level counts for nothing, so a broken sensor never raises or lowers pressure.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from .enums import ThermalSeverity
from .limits import MAX_DEVICES, MEMORY_PRESSURE_CRITICAL, MEMORY_PRESSURE_NONE

Name = Annotated[str, Field(min_length=1, max_length=128)]
Count = Annotated[int, Field(ge=0)]
"""A count: an integer, 0 or more."""
Percent = Annotated[float, Field(ge=0, le=100)]
"""A share in percent, 0 to 100."""
DeviceNumber = Annotated[int, Field(ge=0, le=MAX_DEVICES - 1)]
"""A device's number, 0 up to `~npumanager.schemas.limits.MAX_DEVICES` minus one."""


class _Health(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


class MemoryReading(_Health):
    """Memory pressure from one place (the system, a cgroup), as a level and its inputs."""

    name: Name
    path: str | None = None
    """The file read, as the machine names it, if any."""
    level: Annotated[int, Field(ge=MEMORY_PRESSURE_NONE, le=MEMORY_PRESSURE_CRITICAL)]
    """0 none, 1 moderate, 2 critical: what the ``pressure`` policy takes."""
    some_avg10: Percent | None = None
    """Share of the last 10 s in which some task stalled on memory (PSI), if read."""
    full_avg10: Percent | None = None
    """Share of the last 10 s in which every task stalled on memory (PSI), if read."""
    trigger: bool = False
    """True while a pressure trigger fired within its window (it raised `level`)."""
    triggers: Count = 0
    """Pressure triggers armed on this place (0: its level comes from avg10 alone)."""


class ThermalReading(_Health):
    """One temperature sensor and the severity it maps to, for one device or for all."""

    name: Name
    device: DeviceNumber | None = None
    """The device it counts for; None: every device."""
    temperature_mc: int | None = None
    severity: ThermalSeverity = Field(strict=False)

    @field_serializer("severity", when_used="json")
    def _severity_name(self, severity: ThermalSeverity) -> str:
        return severity.name


class DeviceReading(_Health):
    """An accelerator's own counters, where its driver exposes them."""

    device: DeviceNumber
    name: Name
    busy_time_us: Count | None = None
    """Time the device spent executing since it was probed (a counter)."""
    memory_used_bytes: Count | None = None
    frequency_mhz: Count | None = None
    """The clock now; 0 while the device is idle."""
    max_frequency_mhz: Count | None = None
    """The clock the hardware can reach; below it while busy is a throttle signal."""


class HealthSample(_Health):
    """Everything one health source read at one moment."""

    memory: tuple[MemoryReading, ...] = Field(default=(), strict=False)
    thermal: tuple[ThermalReading, ...] = Field(default=(), strict=False)
    devices: tuple[DeviceReading, ...] = Field(default=(), strict=False)

    @property
    def memory_pressure(self) -> int | None:
        """The highest memory level read, or None without a memory reading."""
        return max((m.level for m in self.memory), default=None)

    def severity(self, device: int) -> ThermalSeverity | None:
        """The most severe reading that counts for `device`, or None without one."""
        found = [t.severity for t in self.thermal if t.device is None or t.device == device]
        return max(found, default=None)

    def device(self, device: int) -> DeviceReading | None:
        """The device's own readings, if the source has them."""
        return next((d for d in self.devices if d.device == device), None)

    def hottest_mc(self, device: int) -> int | None:
        """The highest temperature that counts for `device`, or None."""
        temps = [
            t.temperature_mc
            for t in self.thermal
            if t.temperature_mc is not None and (t.device is None or t.device == device)
        ]
        return max(temps, default=None)
