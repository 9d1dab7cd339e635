"""Device health from sources beside the driver: the source contract and their combination.

A health source (a plugin, see `hookspecs.npumanager_register_health_sources`) reads
the machine: memory pressure, thermal zones, the accelerator's counters. `HealthBoard`
keeps each source's latest `HealthSample` and answers what the service asks: a device's
severity and the memory level, the most severe of every source winning. It is plain data
under the service lock; the thread that reads the sources is `health_monitor`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from npumanager.core.plugins.registry import PluginRegistry
from npumanager.errors import IllegalArgumentError, NpuManagerError
from npumanager.schemas import HealthSample, ThermalSeverity
from npumanager.schemas.limits import MEMORY_PRESSURE_NONE


@runtime_checkable
class HealthSource(Protocol):
    """What every health source has: `read()`. ``interval_ms``, ``descriptors()``, ``ready(fd)``
    and ``close()`` are optional (see the hook's documentation)."""

    def read(self) -> HealthSample | Mapping[str, Any]:
        """Everything the source can read now; readings it cannot make are left out."""


HealthSpec = str | tuple[str, Mapping[str, Any]] | HealthSource
"""How a service is given a source: a registered name, a name with options, or an object."""


def build_health_source(registry: PluginRegistry, spec: HealthSpec) -> tuple[str, HealthSource]:
    """The source's name and object: a registered one built with its options, or an object."""
    if isinstance(spec, str):
        spec = (spec, {})
    if isinstance(spec, tuple):
        name, options = spec
        factory = registry.health_source(name).factory
        try:
            made = factory(**dict(options))
        except NpuManagerError:
            raise
        except Exception as exc:
            raise IllegalArgumentError(
                f"health source {name!r} did not start: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(made, HealthSource):
            raise IllegalArgumentError(f"health source {name!r} built an object without read()")
        return name, made
    if not isinstance(spec, HealthSource):
        raise IllegalArgumentError(
            f"a health source is a registered name, (name, options) or an object with read(); "
            f"got {type(spec).__name__}"
        )
    return type(spec).__name__, spec


@dataclass
class SourceState:
    """One source's latest sample, when it was read, and its last problem."""

    name: str
    sample: HealthSample | None = None
    read_at_ms: int | None = None
    error: str | None = None


@dataclass
class HealthBoard:
    """Every source's latest sample, combined: the most severe reading wins."""

    sources: list[SourceState] = field(default_factory=list)

    def add(self, name: str) -> SourceState:
        """Make room for a source; a name already taken gets a `#n` suffix."""
        taken = {s.name for s in self.sources}
        unique, n = name, 1
        while unique in taken:
            n += 1
            unique = f"{name}#{n}"
        state = SourceState(unique)
        self.sources.append(state)
        return state

    def severity(self, device: int) -> ThermalSeverity:
        """The most severe thermal reading of any source for the device (NONE without one)."""
        read = self.read_severity(device)
        return ThermalSeverity.NONE if read is None else read

    def read_severity(self, device: int) -> ThermalSeverity | None:
        """The most severe thermal reading of any source for the device, or None when no
        source read one (unknown, never guessed as NONE)."""
        found = [s.sample.severity(device) for s in self.sources if s.sample is not None]
        return max((f for f in found if f is not None), default=None)

    def memory_pressure(self) -> int:
        """The highest memory level any source read (0 without one)."""
        found = [s.sample.memory_pressure for s in self.sources if s.sample is not None]
        return max((f for f in found if f is not None), default=MEMORY_PRESSURE_NONE)

    def hottest_mc(self, device: int) -> int | None:
        """The highest temperature any source read for the device, or None."""
        found = [s.sample.hottest_mc(device) for s in self.sources if s.sample is not None]
        return max((f for f in found if f is not None), default=None)

    def device_reading(self, device: int) -> dict[str, int | None]:
        """The device's counters, from the first source that has them."""
        for state in self.sources:
            reading = state.sample.device(device) if state.sample is not None else None
            if reading is not None:
                return reading.model_dump(exclude={"device", "name"})
        return {}

    def describe(self, devices: Sequence[int]) -> dict[str, Any]:
        """The readings of every source and what they combine to, as JSON-ready data."""
        return {
            "memory_pressure": self.memory_pressure(),
            "severity": {str(d): _name(self.read_severity(d)) for d in devices},
            "sources": [
                {
                    "name": s.name,
                    "read_at_ms": s.read_at_ms,
                    "error": s.error,
                    **(s.sample.model_dump(mode="json") if s.sample is not None else {}),
                }
                for s in self.sources
            ],
        }


def _name(severity: ThermalSeverity | None) -> str | None:
    return None if severity is None else severity.name
