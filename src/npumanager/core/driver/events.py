"""The light record a driver's work events travel in, and its conversion to `WorkInfo`.

Drivers hand events over in batches of `WorkEvent` tuples: cheap to make, no
validation. `WorkInfo` models are built, a batch at a time, only where trust or a
format demands it (`to_work_infos`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum
from typing import NamedTuple

from npumanager.schemas import EndReason, NpuUuid, StartReason, WorkInfo


class EventKind(IntEnum):
    """Which ``ISchedulingCallback`` method an event stands for."""

    REQUESTED = 0
    STARTED = 1
    ENDED = 2


NO_REASON = -1
"""The `reason` of a REQUESTED event."""


class WorkEvent(NamedTuple):
    """One lifecycle event: the kind, its reason, the `WorkInfo` fields, and the exact time.

    `reason` is a `StartReason` for STARTED, an `EndReason` for ENDED, ``NO_REASON``
    otherwise. `time_us` is the device time in microseconds (`timestamp_ms` is it in
    whole milliseconds); `model` is the driver's handle of the model the work ran.
    """

    kind: int
    reason: int
    id: int
    group_id: bytes | None
    uid: int
    debug_pid: int
    original_uid: int
    debug_feature_id: str | None
    job_priority: int
    effective_priority: int
    timestamp_ms: int
    device_number: int
    time_us: int
    model: int

    def describe(self) -> str:
        """A short human form, e.g. ``ENDED(COMPLETED) #12 uid 10001``."""
        kind = EventKind(self.kind)
        if kind == EventKind.STARTED:
            detail = f"({StartReason(self.reason).name})"
        elif kind == EventKind.ENDED:
            detail = f"({EndReason(self.reason).name})"
        else:
            detail = ""
        return f"{kind.name}{detail} #{self.id} uid {self.uid} at {self.time_us} us"


def to_work_info(event: WorkEvent) -> WorkInfo:
    """The validated `WorkInfo` of one event."""
    return WorkInfo(
        id=event.id,
        group_id=NpuUuid(value=event.group_id) if event.group_id is not None else None,
        uid=event.uid,
        debug_pid=event.debug_pid,
        original_uid=event.original_uid,
        debug_feature_id=event.debug_feature_id,
        job_priority=event.job_priority,
        effective_priority=event.effective_priority,
        timestamp_ms=event.timestamp_ms,
        device_number=event.device_number,
    )


def to_work_infos(events: Iterable[WorkEvent]) -> list[WorkInfo]:
    """Validated `WorkInfo` models for a batch of events, in order."""
    return [to_work_info(event) for event in events]
