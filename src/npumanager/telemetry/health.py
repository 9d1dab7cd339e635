"""When a device reading becomes a `DeviceSample`: on a period, and at once on a change.

A sample is emitted for a device's first reading, when its thermal severity or its used
weight memory changed, and otherwise every `period_us`; so steps show exactly where they
happen while smooth curves (temperature) cost one sample a period.
"""

from __future__ import annotations

from npumanager.schemas.device import DeviceStatus
from npumanager.telemetry.events import DeviceSample


class HealthSampler:
    """Decides, per device, which readings are worth a sample."""

    def __init__(self, period_us: int) -> None:
        self.period_us = period_us
        self._last: dict[int, DeviceSample] = {}

    def sample(self, status: DeviceStatus, now_us: int) -> DeviceSample | None:
        """The sample of this reading, or None if the last one still describes it."""
        last = self._last.get(status.number)
        if (
            last is not None
            and now_us - last.time_us < self.period_us
            and last.severity == status.severity
            and last.weight_memory_used_bytes == status.weight_memory_used_bytes
        ):
            return None
        sample = DeviceSample(
            device=status.number,
            temperature_mc=status.temperature_mc,
            severity=int(status.severity),
            weight_memory_used_bytes=status.weight_memory_used_bytes,
            weight_memory_bytes=status.weight_memory_bytes,
            busy_channels=sum(1 for work in status.running if work >= 0),
            time_us=now_us,
        )
        self._last[status.number] = sample
        return sample
