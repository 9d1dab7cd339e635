"""`WorkInfo`: one piece of work on the NPU, as the driver reports it."""

from __future__ import annotations

from .base import SchemaModel
from .npu_uuid import NpuUuid
from .types import EffectivePriority, Int32, NonNegativeInt32, NonNegativeInt64, Priority, Uid


class WorkInfo(SchemaModel):
    """Field for field as in ``WorkInfo.aidl``, in the same order.

    ``job_priority`` is what the client submitted; ``effective_priority`` is what the
    driver scheduled by. ``timestamp_ms`` is on the monotonic clock.
    """

    id: NonNegativeInt32
    group_id: NpuUuid | None = None
    uid: Uid
    debug_pid: Int32 = 0
    original_uid: Uid
    debug_feature_id: str | None = None
    job_priority: Priority
    effective_priority: EffectivePriority
    timestamp_ms: NonNegativeInt64
    device_number: NonNegativeInt32 = 0
