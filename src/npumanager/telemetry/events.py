"""The telemetry records sinks receive, besides the driver's `WorkEvent`s.

Like `WorkEvent` they are light named tuples, made on the hot path without validation.
`ModelLoadRequested` and `ModelLoadStateChanged` follow the platform's statsd atoms
NPU_MODEL_LOAD_REQUESTED and NPU_MODEL_LOAD_STATE_CHANGED; `DeviceSample` is one reading
of a device's health. Times are microseconds on the driver's clock, the clock of the
work events' `time_us`.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple, TypeAlias

from npumanager.core.driver.events import WorkEvent
from npumanager.schemas import ModelLoadRequestStatus, ModelLoadStatus

NO_VALUE = -1
"""An absent unload reason, device or byte count."""


class ModelLoadState(IntEnum):
    """Where a model-load request went: the platform's statuses, then our own steps.

    The first five carry the values of `ModelLoadStatus` and `ModelLoadRequestStatus`.
    """

    CAN_LOAD_NOW = ModelLoadStatus.CAN_LOAD_NOW
    WAIT_FOR_UNLOAD = ModelLoadStatus.WAIT_FOR_UNLOAD
    NOT_PRIORITIZED = ModelLoadStatus.NOT_PRIORITIZED
    CANCELLED = ModelLoadRequestStatus.CANCELLED
    COMPLETE = ModelLoadRequestStatus.COMPLETE
    LOADED = 10
    """The client reported the model fully in driver memory."""
    UNLOAD_REQUESTED = 11
    """The service asked the client to unload (`~npumanager.ModelLoadStateChanged.unload_reason`
    says why)."""
    UNLOADED = 12
    """The client reported the model unloaded."""
    REVOKED = 13
    """The service took the models off the device itself
    (`~npumanager.ModelLoadStateChanged.unload_reason` says why)."""


class ModelLoadRequested(NamedTuple):
    """A client asked to load a model (the platform's NPU_MODEL_LOAD_REQUESTED)."""

    uid: int
    client: int
    request_id: int
    size: int
    priority: int
    weight_bytes: int
    """The bytes the client declared, or ``NO_VALUE``."""
    time_us: int


class ModelLoadStateChanged(NamedTuple):
    """A request moved on (the platform's NPU_MODEL_LOAD_STATE_CHANGED)."""

    uid: int
    client: int
    request_id: int
    size: int
    priority: int
    state: int
    """A `ModelLoadState`."""
    unload_reason: int
    """An `UnloadReason` for UNLOAD_REQUESTED and REVOKED, else ``NO_VALUE``."""
    device: int
    """The device the model is (to be) on, or ``NO_VALUE`` before the service placed it."""
    time_us: int


class DeviceSample(NamedTuple):
    """One reading of a device's health: the driver's, with the health sources' beside it.

    `severity` and `temperature_mc` are the most severe of the driver and the sources.
    """

    device: int
    temperature_mc: int
    severity: int
    """A `ThermalSeverity`."""
    weight_memory_used_bytes: int
    weight_memory_bytes: int
    busy_channels: int
    time_us: int
    memory_pressure: int = NO_VALUE
    """The memory level in force (0..2), or ``NO_VALUE`` where nothing reads it."""
    busy_time_us: int = NO_VALUE
    """The accelerator's own busy-time counter (a health source's), or ``NO_VALUE``."""
    device_memory_used_bytes: int = NO_VALUE
    """Memory in use as the accelerator's driver counts it (a health source's), or ``NO_VALUE``."""
    frequency_mhz: int = NO_VALUE
    """The accelerator's clock now (a health source's), or ``NO_VALUE``."""
    max_frequency_mhz: int = NO_VALUE
    """The clock the accelerator can reach (a health source's), or ``NO_VALUE``."""


TelemetryEvent: TypeAlias = WorkEvent | ModelLoadRequested | ModelLoadStateChanged | DeviceSample
"""Anything a sink's `handle(batch)` may find in a batch."""
