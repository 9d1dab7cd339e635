"""When a device reading becomes a `DeviceSample`: on a period, and at once on a change.

A sample is emitted for a device's first reading, when its thermal severity or its used
weight memory changed, and otherwise every `period_us`; so steps show exactly where they
happen while smooth curves (temperature) cost one sample a period.
"""

from __future__ import annotations

from collections.abc import Mapping

from npumanager.schemas.device import DeviceStatus
from npumanager.telemetry.events import NO_VALUE, DeviceSample


class HealthSampler:
    """Decides, per device, which readings are worth a sample."""

    def __init__(self, period_us: int) -> None:
        self.period_us = period_us
        self._last: dict[int, DeviceSample] = {}

    def sample(
        self,
        status: DeviceStatus,
        now_us: int,
        *,
        severity: int | None = None,
        temperature_mc: int | None = None,
        memory_pressure: int = NO_VALUE,
        readings: Mapping[str, int | None] | None = None,
    ) -> DeviceSample | None:
        """The sample of this reading, or None if the last one still describes it.

        `severity`, `temperature_mc`, `memory_pressure` and `readings` (a health source's
        device counters) override or add to what the driver's `status` says.
        """
        last = self._last.get(status.number)
        severity = int(status.severity) if severity is None else severity
        if (
            last is not None
            and now_us - last.time_us < self.period_us
            and last.severity == severity
            and last.weight_memory_used_bytes == status.weight_memory_used_bytes
            and last.memory_pressure == memory_pressure
        ):
            return None
        counters = readings or {}

        def counter(key: str) -> int:
            value = counters.get(key)
            return NO_VALUE if value is None else value

        sample = DeviceSample(
            device=status.number,
            temperature_mc=status.temperature_mc if temperature_mc is None else temperature_mc,
            severity=severity,
            weight_memory_used_bytes=status.weight_memory_used_bytes,
            weight_memory_bytes=status.weight_memory_bytes,
            busy_channels=sum(1 for work in status.running if work >= 0),
            time_us=now_us,
            memory_pressure=memory_pressure,
            busy_time_us=counter("busy_time_us"),
            device_memory_used_bytes=counter("memory_used_bytes"),
            frequency_mhz=counter("frequency_mhz"),
            max_frequency_mhz=counter("max_frequency_mhz"),
        )
        self._last[status.number] = sample
        return sample
