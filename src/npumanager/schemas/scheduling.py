"""`SchedulingConfig`: how the service tells the driver to rank one uid's work."""

from __future__ import annotations

from typing import Self

from pydantic import model_validator

from .base import SchemaModel
from .limits import MAX_PRIORITY, MIN_PRIORITY
from .types import EffectivePriority, Priority, Uid


class SchedulingConfigV1(SchemaModel):
    """The platform's frozen first form: one priority per uid, job priorities unclamped."""

    uid: Uid
    priority: Priority
    has_direct_access: bool = True
    can_attribute_other_uid: bool = False


class SchedulingConfig(SchemaModel):
    """Per-uid scheduling parameters, field for field as in ``SchedulingConfig.aidl``.

    A job priority is first clamped into ``[min_priority, max_priority]``, then added to
    ``app_priority``; that is how a background app's "urgent" job is pulled down.
    """

    min_priority: Priority = MIN_PRIORITY
    max_priority: Priority = MAX_PRIORITY
    uid: Uid
    app_priority: Priority
    has_direct_access: bool = True
    can_attribute_other_uid: bool = False

    @model_validator(mode="after")
    def _ordered_bounds(self) -> Self:
        if self.min_priority > self.max_priority:
            raise ValueError(
                f"minPriority ({self.min_priority}) must not exceed "
                f"maxPriority ({self.max_priority})"
            )
        return self

    def clamp_job_priority(self, job_priority: int) -> int:
        """The job priority pulled into ``[min_priority, max_priority]``."""
        return min(max(job_priority, self.min_priority), self.max_priority)

    def effective_priority(self, job_priority: int) -> EffectivePriority:
        """The priority the driver schedules by: app priority plus clamped job priority."""
        if not MIN_PRIORITY <= job_priority <= MAX_PRIORITY:
            raise ValueError(
                f"job_priority must be within {MIN_PRIORITY}..{MAX_PRIORITY}; got {job_priority}"
            )
        return self.app_priority + self.clamp_job_priority(job_priority)

    @property
    def is_v1_representable(self) -> bool:
        """True when the bounds are the full range, which is all the v1 form can say."""
        return self.min_priority == MIN_PRIORITY and self.max_priority == MAX_PRIORITY

    def to_v1(self) -> SchedulingConfigV1:
        """The platform's v1 form; refuses a config whose narrowed bounds v1 cannot carry."""
        if not self.is_v1_representable:
            raise ValueError(
                f"SchedulingConfig for uid {self.uid} narrows job priorities to "
                f"{self.min_priority}..{self.max_priority}; the v1 form only carries "
                f"the full range {MIN_PRIORITY}..{MAX_PRIORITY}"
            )
        return SchedulingConfigV1(
            uid=self.uid,
            priority=self.app_priority,
            has_direct_access=self.has_direct_access,
            can_attribute_other_uid=self.can_attribute_other_uid,
        )

    @classmethod
    def from_v1(cls, v1: SchedulingConfigV1) -> SchedulingConfig:
        """The config that schedules exactly as the v1 form does."""
        return cls(
            uid=v1.uid,
            app_priority=v1.priority,
            has_direct_access=v1.has_direct_access,
            can_attribute_other_uid=v1.can_attribute_other_uid,
        )
