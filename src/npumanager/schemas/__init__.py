"""Pydantic models and constants that mirror the NPU scheduling HAL, defined once.

Models are frozen and strict and forbid extra keys; field names are snake_case in
Python and the AIDL's camelCase on the wire and in JSON Schema.
"""

from __future__ import annotations

from pydantic import BaseModel

from . import limits
from .constants import *  # noqa: F403
from .constants import __all__ as _constant_names
from .enums import (
    DriverCapability,
    EndReason,
    Importance,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    ModelPolicy,
    ModelPriority,
    ModelSize,
    PluginKind,
    StartReason,
    ThermalSeverity,
    UnloadReason,
)
from .health import DeviceReading, HealthSample, MemoryReading, ThermalReading
from .npu_uuid import NpuUuid
from .plugins import (
    DriverRecord,
    HealthSourceRecord,
    ImportanceSourceRecord,
    PluginRecord,
    PolicyRecord,
    SinkRecord,
)
from .requests import ModelLoadRequest
from .scheduling import SchedulingConfig, SchedulingConfigV1
from .work import WorkInfo

SCHEMA_MODELS: dict[str, type[BaseModel]] = {
    "SchedulingConfig": SchedulingConfig,
    "SchedulingConfigV1": SchedulingConfigV1,
    "WorkInfo": WorkInfo,
    "NpuUuid": NpuUuid,
    "ModelLoadRequest": ModelLoadRequest,
}
"""The models a driver author in another language needs, by name (`npu-manager schema`)."""

__all__ = [  # noqa: PLE0604
    *_constant_names,
    "SCHEMA_MODELS",
    "DriverCapability",
    "DeviceReading",
    "DriverRecord",
    "EndReason",
    "HealthSample",
    "HealthSourceRecord",
    "ImportanceSourceRecord",
    "Importance",
    "ModelLoadRequest",
    "ModelLoadRequestStatus",
    "ModelLoadStatus",
    "ModelPolicy",
    "ModelPriority",
    "MemoryReading",
    "ModelSize",
    "NpuUuid",
    "PluginKind",
    "PluginRecord",
    "PolicyRecord",
    "SchedulingConfig",
    "SchedulingConfigV1",
    "SinkRecord",
    "StartReason",
    "ThermalReading",
    "ThermalSeverity",
    "UnloadReason",
    "WorkInfo",
    "limits",
]
