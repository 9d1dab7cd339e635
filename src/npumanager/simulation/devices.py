"""Which device a simulation runs on: the scenario's `[[devices]]` when it has them (in place
of the driver's own), else the driver's own; and a line that says which."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from npumanager.core.plugins.registry import PluginRegistry
from npumanager.errors import NpuManagerError
from npumanager.schemas.device import DeviceSpec
from npumanager.simulation.scenario import Scenario, check_budget

_GIB = 1 << 30


def driver_devices(registry: PluginRegistry, driver: str) -> list[DeviceSpec]:
    """The devices the driver opens when given none: its specs if it keeps them (an
    `EngineDriver`), else what `describe_devices()` says, on the defaults for the rest."""
    made: Any = registry.driver(driver).factory()
    try:
        specs = getattr(made, "specs", None)
        if isinstance(specs, Sequence) and all(isinstance(s, DeviceSpec) for s in specs):
            return list(specs)
        return [
            DeviceSpec(
                channels=d.channels,
                weight_memory_bytes=d.weight_memory_bytes,
                **({"sram_bytes": d.sram_bytes} if d.sram_bytes else {}),
                **({"clock_mhz": d.clock_mhz} if d.clock_mhz else {}),
            )
            for d in made.describe_devices()
        ]
    finally:
        made.close()


def describe(specs: Sequence[DeviceSpec]) -> str:
    """`4 channels, 6.00 GiB of weight memory, 1000 MHz`, one such part a device."""
    parts = [
        f"{s.channels} channels, {s.weight_memory_bytes / _GIB:.2f} GiB of weight memory, "
        f"{s.clock_mhz} MHz"
        for s in specs
    ]
    return "; ".join(parts) if len(parts) == 1 else f"{len(parts)} devices: " + "; ".join(parts)


def on_devices(
    scenario: Scenario, registry: PluginRegistry, driver: str, origin: str
) -> tuple[Scenario, str]:
    """The scenario to play on `driver`, with the devices it will run on, and a phrase that
    says whose they are (`with the driver's own device (...)`)."""
    try:
        own = driver_devices(registry, driver)
    except NpuManagerError as exc:
        raise NpuManagerError(f"driver {driver!r} did not open its own device: {exc}") from None
    if "devices" not in scenario.model_fields_set:
        scenario = scenario.model_copy(update={"devices": own})
        check_budget(scenario, origin)
        return scenario, f"with the driver's own device ({describe(own)})"
    theirs = describe(scenario.devices)
    if theirs == describe(own):
        return scenario, f"with the scenario's device ({theirs})"
    return scenario, (
        f"with the scenario's device ({theirs}) in place of the driver's own ({describe(own)})"
    )
