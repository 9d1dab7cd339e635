"""Telemetry: the events sinks receive, the hub that delivers them, the built-in sinks.

Sinks take batches of `WorkEvent`, `ModelLoadRequested`, `ModelLoadStateChanged` and
`DeviceSample` tuples (see `events`). `hub` debounces and queues them per registration.
The built-in sinks (`jsonl`, `perfetto`, `prometheus`, `memory`) are registered by
`npumanager.plugins.sinks` like any third party's.
"""

from npumanager.telemetry.base import EventSink
from npumanager.telemetry.events import (
    NO_VALUE,
    DeviceSample,
    ModelLoadRequested,
    ModelLoadState,
    ModelLoadStateChanged,
    TelemetryEvent,
)
from npumanager.telemetry.hub import Sink, SinkHandle, SinkStats, TelemetryHub

__all__ = [
    "NO_VALUE",
    "DeviceSample",
    "EventSink",
    "ModelLoadRequested",
    "ModelLoadState",
    "ModelLoadStateChanged",
    "Sink",
    "SinkHandle",
    "SinkStats",
    "TelemetryEvent",
    "TelemetryHub",
]
