"""Telemetry events as JSON-ready dicts: the form written to files and the wire.

Keys are camelCase; a work event's `WorkInfo` fields carry the AIDL's names, taken from
the schema. Enum values are written by name (`"kind": "ENDED"`, `"reason": "COMPLETED"`),
group ids as UUID strings. Each type's key list is worked out once, not per event.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from enum import IntEnum
from typing import Any

from npumanager.core.events import NO_REASON, EventKind, WorkEvent
from npumanager.schemas import (
    EndReason,
    ModelPriority,
    ModelSize,
    StartReason,
    ThermalSeverity,
    UnloadReason,
    WorkInfo,
)
from npumanager.telemetry.events import (
    NO_VALUE,
    DeviceSample,
    ModelLoadRequested,
    ModelLoadState,
    ModelLoadStateChanged,
    TelemetryEvent,
)

TYPE_NAMES: dict[type, str] = {
    WorkEvent: "work",
    ModelLoadRequested: "model_load_requested",
    ModelLoadStateChanged: "model_load_state_changed",
    DeviceSample: "device_sample",
}
"""The `type` written with each record."""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _keys(kind: type) -> tuple[str, ...]:
    aliases = {name: field.alias or name for name, field in WorkInfo.model_fields.items()}
    fields: tuple[str, ...] = kind._fields  # type: ignore[attr-defined]
    return tuple(aliases.get(name) or _camel(name) for name in fields)


_KEYS = {kind: _keys(kind) for kind in TYPE_NAMES}


def _name(enum: type[IntEnum], value: int) -> str | None:
    if value == NO_VALUE:
        return None
    try:
        return enum(value).name
    except ValueError:
        return str(value)


def _work(record: dict[str, Any], event: Any) -> None:
    kind = EventKind(event.kind)
    record["kind"] = kind.name
    reasons: type[IntEnum] = StartReason if kind == EventKind.STARTED else EndReason
    record["reason"] = None if event.reason == NO_REASON else _name(reasons, event.reason)
    if event.group_id is not None:
        record["groupId"] = str(uuid.UUID(bytes=event.group_id))


def _model(record: dict[str, Any], event: Any) -> None:
    record["size"] = _name(ModelSize, event.size)
    record["priority"] = _name(ModelPriority, event.priority)
    if isinstance(event, ModelLoadRequested):
        record["weightBytes"] = None if event.weight_bytes == NO_VALUE else event.weight_bytes
    else:
        record["device"] = None if event.device == NO_VALUE else event.device
        record["state"] = _name(ModelLoadState, event.state)
        record["unloadReason"] = _name(UnloadReason, event.unload_reason)


def _sample(record: dict[str, Any], event: Any) -> None:
    record["severity"] = _name(ThermalSeverity, event.severity)


_NAMES: dict[type, Callable[[dict[str, Any], Any], None]] = {
    WorkEvent: _work,
    ModelLoadRequested: _model,
    ModelLoadStateChanged: _model,
    DeviceSample: _sample,
}


def to_record(event: TelemetryEvent) -> dict[str, Any]:
    """The JSON-ready dict of one event, with its `type` first."""
    kind = type(event)
    record: dict[str, Any] = {"type": TYPE_NAMES[kind]}
    record.update(zip(_KEYS[kind], event, strict=True))
    _NAMES[kind](record, event)
    return record
