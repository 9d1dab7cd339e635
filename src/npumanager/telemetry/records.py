"""Telemetry events as JSON-ready dicts: the form written to files and the wire.

Keys are camelCase; a work event's `WorkInfo` fields carry the AIDL's names, taken from
the schema. Enum values are written by name (`"kind": "ENDED"`, `"reason": "COMPLETED"`),
group ids as UUID strings. Each type's key list is worked out once, not per event.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from enum import IntEnum
from typing import Any

from npumanager.core.driver.events import NO_REASON, EventKind, WorkEvent
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


def _name(enum: type[IntEnum], value: int) -> str | int | None:
    """A member's name; an unknown value stays a number."""
    if value == NO_VALUE:
        return None
    try:
        return enum(value).name
    except ValueError:
        return value


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


_SAMPLE_OPTIONAL = (
    ("memory_pressure", "memoryPressure"),
    ("busy_time_us", "busyTimeUs"),
    ("device_memory_used_bytes", "deviceMemoryUsedBytes"),
    ("frequency_mhz", "frequencyMhz"),
    ("max_frequency_mhz", "maxFrequencyMhz"),
)


def _sample(record: dict[str, Any], event: Any) -> None:
    record["severity"] = _name(ThermalSeverity, event.severity)
    for field, key in _SAMPLE_OPTIONAL:
        value = getattr(event, field)
        record[key] = None if value == NO_VALUE else value


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


_TEXT_FIELDS = frozenset(
    {"kind", "reason", "group_id", "debug_feature_id", "size", "priority", "state"}
    | {"unload_reason", "severity", "weight_bytes", "device"}
    | {"memory_pressure", "busy_time_us", "device_memory_used_bytes"}
    | {"frequency_mhz", "max_frequency_mhz"}
)
"""Fields written as a JSON fragment (a name, a string, null) rather than a bare int."""


def _line_template(kind: type) -> str:
    fields: tuple[str, ...] = kind._fields  # type: ignore[attr-defined]
    parts = [f'"type":"{TYPE_NAMES[kind]}"']
    for field, key in zip(fields, _KEYS[kind], strict=True):
        parts.append(f'"{key}":' + ("%s" if field in _TEXT_FIELDS else "%d"))
    return "{" + ",".join(parts) + "}\n"


_TEMPLATES = {kind: _line_template(kind) for kind in TYPE_NAMES}


def _names_json(enum: type[IntEnum]) -> dict[int, str]:
    return {member.value: f'"{member.name}"' for member in enum} | {NO_VALUE: "null"}


_KIND_JSON = _names_json(EventKind)
_START_JSON = _names_json(StartReason)
_END_JSON = _names_json(EndReason)
_SIZE_JSON = _names_json(ModelSize)
_PRIORITY_JSON = _names_json(ModelPriority)
_STATE_JSON = _names_json(ModelLoadState)
_UNLOAD_JSON = _names_json(UnloadReason)
_SEVERITY_JSON = _names_json(ThermalSeverity)
_strings: dict[str, str] = {}


def _string(value: str | None) -> str:
    if value is None:
        return "null"
    encoded = _strings.get(value)
    if encoded is None:
        if len(_strings) > 4096:
            _strings.clear()
        encoded = _strings[value] = json.dumps(value)
    return encoded


def _int_or_null(value: int) -> str:
    return "null" if value == NO_VALUE else str(value)


def _enum_json(table: dict[int, str], value: int) -> str:
    found = table.get(value)
    return found if found is not None else str(value)


def to_json_line(event: TelemetryEvent) -> str:
    """`json.dumps(to_record(event))` plus a newline, written without the dict (hot path)."""
    kind = type(event)
    template = _TEMPLATES[kind]
    if kind is WorkEvent:
        e: Any = event
        reasons = _START_JSON if e.kind == EventKind.STARTED else _END_JSON
        reason = "null" if e.reason == NO_REASON else _enum_json(reasons, e.reason)
        group = "null" if e.group_id is None else f'"{uuid.UUID(bytes=e.group_id)}"'
        return template % (
            _KIND_JSON[e.kind], reason, e.id, group, e.uid, e.debug_pid, e.original_uid,
            _string(e.debug_feature_id), e.job_priority, e.effective_priority,
            e.timestamp_ms, e.device_number, e.time_us, e.model,
        )  # fmt: skip
    if kind is DeviceSample:
        s: Any = event
        return template % (
            s.device, s.temperature_mc, _enum_json(_SEVERITY_JSON, s.severity),
            s.weight_memory_used_bytes, s.weight_memory_bytes, s.busy_channels, s.time_us,
            _int_or_null(s.memory_pressure), _int_or_null(s.busy_time_us),
            _int_or_null(s.device_memory_used_bytes), _int_or_null(s.frequency_mhz),
            _int_or_null(s.max_frequency_mhz),
        )  # fmt: skip
    m: Any = event
    head = (
        m.uid, m.client, m.request_id,
        _enum_json(_SIZE_JSON, m.size), _enum_json(_PRIORITY_JSON, m.priority),
    )  # fmt: skip
    if kind is ModelLoadRequested:
        return template % (*head, _int_or_null(m.weight_bytes), m.time_us)
    return template % (
        *head, _enum_json(_STATE_JSON, m.state), _enum_json(_UNLOAD_JSON, m.unload_reason),
        _int_or_null(m.device), m.time_us,
    )  # fmt: skip
