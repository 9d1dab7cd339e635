"""The description of a simulated device: channels, memories, clock, slice, thermal model,
and how it shares its channels (priority bands, fair share, a floor for the lower bands).

Both simulated drivers (`vnpu` in C and `reference` in Python) take these, so one
description means one behaviour. All quantities are integers (microseconds, bytes,
milli-degrees Celsius, cycles) so the two compute the same numbers exactly.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .enums import ThermalSeverity
from .limits import MAX_CHANNELS, MAX_EFFECTIVE_PRIORITY

_MIB = 1 << 20
_GIB = 1 << 30

Positive = Annotated[int, Field(gt=0)]
"""An integer above 0."""
NonNegative = Annotated[int, Field(ge=0)]
"""An integer, 0 or more."""


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


class ThermalSpec(_Spec):
    """A first-order thermal model, stepped every ``tick_us`` of device time.

    Each tick: ``temp += heat_per_busy_channel_mc * busy_channels``, then temp moves toward
    ``ambient_mc`` by ``(temp - ambient) * cooling_permille / 1000`` (at least 1 m°C).
    Severity is the highest level whose threshold the temperature has reached; each level
    runs the clock at its `throttle_percent`, and SHUTDOWN stops the device.
    """

    ambient_mc: int = 35_000
    tick_us: Positive = 1_000
    heat_per_busy_channel_mc: NonNegative = 25
    cooling_permille: Annotated[int, Field(ge=1, le=1000)] = 2
    thresholds_mc: tuple[int, int, int, int, int, int] = Field(
        default=(60_000, 70_000, 80_000, 90_000, 100_000, 110_000), strict=False
    )
    """Temperatures at which LIGHT, MODERATE, SEVERE, CRITICAL, EMERGENCY, SHUTDOWN begin."""
    throttle_percent: tuple[int, int, int, int, int, int] = Field(
        default=(100, 80, 60, 40, 20, 10), strict=False
    )
    """Clock percentage at LIGHT..EMERGENCY; NONE runs at 100 and SHUTDOWN at 0."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if list(self.thresholds_mc) != sorted(set(self.thresholds_mc)):
            raise ValueError(
                f"thresholds_mc must strictly increase from LIGHT to SHUTDOWN; "
                f"got {list(self.thresholds_mc)}"
            )
        if self.thresholds_mc[0] <= self.ambient_mc:
            raise ValueError(
                f"the LIGHT threshold ({self.thresholds_mc[0]}) must be above "
                f"ambient_mc ({self.ambient_mc})"
            )
        if any(not 1 <= p <= 100 for p in self.throttle_percent):
            raise ValueError(
                f"throttle_percent values must be within 1..100; got {list(self.throttle_percent)}"
            )
        return self

    def severity_of(self, temp_mc: int) -> ThermalSeverity:
        """The throttling severity at a temperature."""
        level = sum(1 for threshold in self.thresholds_mc if temp_mc >= threshold)
        return ThermalSeverity(level)

    def clock_percent(self, severity: ThermalSeverity) -> int:
        """How fast the clock runs at a severity: 100 at NONE, 0 at SHUTDOWN."""
        if severity == ThermalSeverity.NONE:
            return 100
        if severity == ThermalSeverity.SHUTDOWN:
            return 0
        return self.throttle_percent[severity - 1]


MAX_BANDS: Final = 8
"""Priority bands one device may have."""
FAIR_WEIGHT_BASE: Final = 100
"""Fair share charges `FAIR_WEIGHT_BASE + offset in band` per microsecond run."""
MAX_FLOOR_PERCENT: Final = 50
"""Largest floor: a lower band never gets more than half the device by its floor."""
MAX_FLOOR_WINDOW_US: Final = 10**12
"""Largest floor window: credits stay far inside int64."""


class Scheduler(StrEnum):
    """How a device shares its channels."""

    FAIR = "fair"
    """Priority bands; fair share between uids inside a band; a floor for lower bands."""
    STRICT = "strict"
    """Strict priority, global FIFO among equals (the device before bands existed)."""


class Band(_Spec):
    """A range of effective priorities scheduled as one tier, from ``first_priority`` up to
    the next band's."""

    name: Annotated[str, Field(min_length=1, max_length=32)]
    first_priority: Annotated[int, Field(ge=0, le=MAX_EFFECTIVE_PRIORITY)]


DEFAULT_BANDS: Final = (
    Band(name="realtime", first_priority=0),
    Band(name="focus", first_priority=100),
    Band(name="normal", first_priority=300),
    Band(name="idle", first_priority=1000),
)
"""After ivpu's hardware scheduler: pinned system work below 100 and foreground apps
(100 plus small job priorities) are the two top bands; cached and unknown uids the lower."""


class DeviceSpec(_Spec):
    """One simulated NPU: how many channels, how much memory, how fast, how hot, and how
    it shares its channels between uids."""

    channels: Annotated[int, Field(ge=1, le=MAX_CHANNELS)] = 4
    sram_bytes: Positive = 8 * _MIB
    """On-chip scratch; a model whose per-job SRAM need exceeds it cannot be loaded."""
    weight_memory_bytes: Positive = 6 * _GIB
    """Memory for model weights; loads beyond it fail."""
    clock_mhz: Annotated[int, Field(ge=1, le=1_000_000)] = 1_000
    """Cycles per microsecond at full speed; a job's cost is in cycles."""
    slice_us: Positive = 100
    """Preemption granularity: running work is paused only at a slice boundary, so a more
    important job waits at most this long; fair share also time-slices at it."""
    thermal: ThermalSpec = ThermalSpec()
    scheduler: Scheduler = Field(default=Scheduler.FAIR, strict=False)
    """``fair`` (bands, fair share, floor) or ``strict`` (priority, then global FIFO)."""
    bands: tuple[Band, ...] = Field(default=DEFAULT_BANDS, strict=False, min_length=1)
    """Effective-priority bands, most important first; the first starts at 0."""
    floor_percent: Annotated[int, Field(ge=0, le=MAX_FLOOR_PERCENT)] = 10
    """Share of the device a lower band with waiting work gets at least; 0 turns it off."""
    floor_window_us: Annotated[int, Field(ge=1, le=MAX_FLOOR_WINDOW_US)] = 100_000
    """About the window the floor is kept over: a band banks at most one window's credit."""

    @model_validator(mode="after")
    def _bands_valid(self) -> Self:
        firsts = [band.first_priority for band in self.bands]
        names = [band.name for band in self.bands]
        if len(self.bands) > MAX_BANDS:
            raise ValueError(f"at most {MAX_BANDS} bands; got {len(self.bands)}")
        if firsts[0] != 0 or firsts != sorted(set(firsts)):
            raise ValueError(
                "bands must start at effective priority 0 and strictly increase; "
                f"got first priorities {firsts}"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"band names must be unique; got {names}")
        return self

    def band_of(self, effective_priority: int) -> int:
        """The index of the band an effective priority falls in (0 is the most important)."""
        index = 0
        for n, band in enumerate(self.bands):
            if effective_priority >= band.first_priority:
                index = n
        return index


class DeviceDescription(_Spec):
    """What a driver says about one of its devices when it is opened."""

    number: Annotated[int, Field(ge=0)]
    channels: Annotated[int, Field(ge=1, le=MAX_CHANNELS)]
    weight_memory_bytes: Positive
    sram_bytes: NonNegative = 0
    clock_mhz: NonNegative = 0
    """0 when the driver has no notion of a clock rate."""


class DeviceStatus(_Spec):
    """A reading of one device: memory, queue, what runs, how hot."""

    number: Annotated[int, Field(ge=0)]
    now_us: NonNegative
    weight_memory_bytes: Positive
    weight_memory_used_bytes: NonNegative
    sram_used_bytes: NonNegative
    models_loaded: NonNegative
    queue_depth: NonNegative
    running: tuple[int, ...] = Field(strict=False)
    """The work id on each channel, -1 where the channel is free."""
    temperature_mc: int
    peak_temperature_mc: int
    severity: ThermalSeverity = Field(strict=False)
    throttled_us: NonNegative
    """Total device time spent with the clock below full speed."""
    shutdown: bool
