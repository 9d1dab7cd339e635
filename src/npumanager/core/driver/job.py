"""One piece of work as the driver contract carries it: who it is for and how it ranks
(`Job`), and who runs and waits for a real inference (`WorkMode`)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from npumanager.checks import GroupId
from npumanager.schemas.limits import MIN_PRIORITY


@dataclass(frozen=True, slots=True)
class Job:
    """The fields of one piece of work that the submitter gives (the HAL's ``WorkInfo``
    takes them): its uid, job priority, the uid it is done for, its group and feature, and
    the submitting process."""

    uid: int
    job_priority: int = MIN_PRIORITY
    original_uid: int | None = None
    group_id: GroupId | None = None
    feature_id: str | None = None
    debug_pid: int = 0


class WorkMode(enum.Flag):
    """Who runs a submitted real inference, and who waits for it."""

    QUEUED = 0
    """The driver's workers run it; any thread may wait on its future."""
    INLINE = enum.auto()
    """If it is next in line and a channel is free, it takes the channel at once and the
    caller runs it (``outputs`` or ``run_admitted``); else the workers do."""
    FOREGROUND_ONLY = enum.auto()
    """With ``INLINE``: work of a background band is left to the workers all the same."""
    SYNC = enum.auto()
    """With ``INLINE``: only the calling thread waits, with ``outputs`` and no timeout, so
    work it runs itself needs no future other threads could wait on."""


@dataclass(eq=False, slots=True)
class DirectRun:
    """A real inference whose inputs and outputs its model's host handles itself (the data
    plane, out of the daemon): a real driver schedules it as any work, checks no inputs,
    and when it runs calls `grant(session, call)`, which lets the host go and waits until
    the host says the run ended (`call`, the driver's, cancels it)."""

    grant: Callable[[Any, Any], list[Any]]
    work_id: int = -1
    """Set by the driver as it takes the work, before any worker can run it."""


class Arrivals(NamedTuple):
    """Periodic arrivals made inside a simulated device: ``burst`` jobs every
    ``period_us`` from ``start_us``, ``times`` times."""

    period_us: int
    start_us: int
    times: int
    burst: int
