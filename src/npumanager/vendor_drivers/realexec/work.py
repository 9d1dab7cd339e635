"""One real inference (`Work`) and its future, a loaded model's record, and the scheduling
rules a driver applies per uid.

`effective_priority` and `permitted` are the reference device's rules: an unknown uid is
least important with direct access and no attribution; work attributed to a configured
uid schedules by that uid's config.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from concurrent.futures import CancelledError, Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from npumanager.core.driver.job import DirectRun
from npumanager.core.driver.scheduler import ScheduledJob
from npumanager.schemas import SchedulingConfig
from npumanager.schemas.limits import REAL_UNKNOWN_CONFIGS_KEPT, UNKNOWN_UID_PRIORITY
from npumanager.vendor_drivers.realexec.session import Call, Session


class _Canceller(Protocol):
    def cancel(self, work_id: int) -> None: ...


def _config(configs: Mapping[int, SchedulingConfig], uid: int) -> SchedulingConfig:
    return configs.get(uid) or _unknown(uid)


@functools.lru_cache(maxsize=REAL_UNKNOWN_CONFIGS_KEPT)
def _unknown(uid: int) -> SchedulingConfig:
    """The config of a uid the driver was given none for (built once: it is pydantic)."""
    return SchedulingConfig(uid=uid, app_priority=UNKNOWN_UID_PRIORITY)


def effective_priority(
    configs: Mapping[int, SchedulingConfig], uid: int, original_uid: int, job_priority: int
) -> int:
    """The app priority of the uid the work counts for plus its clamped job priority."""
    config = _config(configs, uid)
    if original_uid != uid and original_uid in configs:
        config = configs[original_uid]
    return config.app_priority + config.clamp_job_priority(job_priority)


def permitted(configs: Mapping[int, SchedulingConfig], uid: int, original_uid: int) -> bool:
    """True if `uid` has direct access and may attribute its work to `original_uid`."""
    config = _config(configs, uid)
    if not config.has_direct_access:
        return False
    return original_uid == uid or config.can_attribute_other_uid


def priority_and_permission(
    configs: Mapping[int, SchedulingConfig], uid: int, original_uid: int, job_priority: int
) -> tuple[int, bool]:
    """`effective_priority` and `permitted` at once (one look-up of the uid's config)."""
    config = configs.get(uid) or _unknown(uid)  # _config
    allowed = config.has_direct_access and (original_uid == uid or config.can_attribute_other_uid)
    if original_uid != uid and original_uid in configs:
        config = configs[original_uid]
    return config.app_priority + config.clamp_job_priority(job_priority), allowed


class _Outcome(Protocol):
    work_id: int

    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...


def _cancel(outcome: _Outcome, driver: _Canceller) -> bool:
    """Cancel live work through the driver: True if it ended CANCELLED_USER now, False if
    it had ended (before, or while this ran)."""
    if outcome.done():
        return outcome.cancelled()
    try:
        driver.cancel(outcome.work_id)
    except LookupError:
        return outcome.cancelled()
    return True


class WorkFuture(Future[list[np.ndarray]]):
    """The outputs of one inference; `cancel()` cancels the work in the driver, queued or
    running (the runtime's own cancel), and `work_id` names it in the events."""

    def __init__(self, work_id: int, driver: _Canceller, keep: bool) -> None:
        super().__init__()
        self.work_id = work_id
        self.keep = keep
        self.inline: Any = None
        """The work, when the submitting thread is to run it itself (`run_inference`)."""
        self._driver = driver

    def cancel(self) -> bool:
        """Cancel the work: True if it ended CANCELLED_USER now, False if it had ended."""
        return _cancel(self, self._driver)

    def cancelled_by_driver(self) -> None:
        """The driver ended the work cancelled (by the client, a revoke or an unload)."""
        Future.cancel(self)
        self.set_running_or_notify_cancel()

    def succeed(self, outputs: list[np.ndarray]) -> None:
        """The inference completed with `outputs` (nothing if the future is done already)."""
        try:
            self.set_result(outputs)
        except InvalidStateError:  # cheaper than asking `done()` first, which takes its lock
            return

    def fail(self, error: BaseException) -> None:
        """The inference failed (or was refused)."""
        if not self.done():
            self.set_exception(error)


class SyncOutcome:
    """How work ended that only its submitting thread waits for (`WorkMode.SYNC` work,
    then `outputs` with no timeout): what a `WorkFuture` records, without the lock and
    condition that let other threads wait on one."""

    __slots__ = ("_callbacks", "_driver", "_error", "_outputs", "inline", "keep", "work_id")

    def __init__(self, work_id: int, driver: _Canceller) -> None:
        self.work_id = work_id
        self.keep = False
        self.inline: Any = None
        self._driver = driver
        self._outputs: list[np.ndarray] | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Any], object]] | None = None

    def cancel(self) -> bool:
        """Cancel the work: True if it ended CANCELLED_USER now, False if it had ended."""
        return _cancel(self, self._driver)

    def cancelled(self) -> bool:
        """True if the work ended cancelled."""
        return isinstance(self._error, CancelledError)

    def done(self) -> bool:
        """True once the work ended."""
        return self._outputs is not None or self._error is not None

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        """Call `fn(self)` once the work ended (at once if it has)."""
        if self.done():
            fn(self)
        elif self._callbacks is None:
            self._callbacks = [fn]
        else:
            self._callbacks.append(fn)

    def cancelled_by_driver(self) -> None:
        """The driver ended the work cancelled."""
        if not self.done():
            self._error = CancelledError()
            self._ended()

    def succeed(self, outputs: list[np.ndarray]) -> None:
        """The inference completed with `outputs`."""
        if not self.done():
            self._outputs = outputs
            self._ended()

    def fail(self, error: BaseException) -> None:
        """The inference failed (or was refused)."""
        if not self.done():
            self._error = error
            self._ended()

    def _ended(self) -> None:
        callbacks, self._callbacks = self._callbacks, None
        for fn in callbacks or ():
            fn(self)

    def result(self, timeout: float | None = None) -> list[np.ndarray]:
        """The outputs, or the work's failure or cancellation raised (it has ended: its
        thread ran it or saw it end; it never waits)."""
        if isinstance(self._error, CancelledError):
            # A new one, as `Future.result` raises: the one kept here would take the
            # caller's frame (a lane's, holding a client's segment) into its traceback,
            # a cycle only the collector breaks.
            raise CancelledError(*self._error.args)
        if self._error is not None:
            raise self._error
        if self._outputs is None:
            raise RuntimeError(f"work {self.work_id} has not ended")  # never: see `outputs`
        return self._outputs


@dataclass(eq=False, slots=True, kw_only=True)
class Work(ScheduledJob):
    """One live inference."""

    model: int
    device: int
    original_uid: int
    job_priority: int
    group_id: bytes | None
    feature_id: str | None
    debug_pid: int
    feeds: dict[str, np.ndarray] | DirectRun | None
    future: WorkFuture | SyncOutcome
    head: tuple[Any, ...] = field(init=False, repr=False)
    """What its events say of it besides kind, reason, priority and time: (id, group_id,
    uid, debug_pid, original_uid, feature_id, job_priority, device, model), fixed for its
    life and so built once."""
    call: Call | None = None
    stopping: bool = False
    """Being stopped to make room (restart preemption): it goes back to the queue."""
    restarts: int = 0

    def __post_init__(self) -> None:
        self.head = (
            self.id, self.group_id, self.uid, self.debug_pid, self.original_uid,
            self.feature_id, self.job_priority, self.device, self.model,
        )  # fmt: skip


@dataclass(eq=False)
class Model:
    """A loaded model: its device, bytes and session (None: accounted only)."""

    id: int
    device: int
    weight_bytes: int
    session: Session | None
    row_us: float = 0.0
    uid: int | None = None


__all__ = [
    "Any",
    "Model",
    "SyncOutcome",
    "Work",
    "WorkFuture",
    "effective_priority",
    "permitted",
    "priority_and_permission",
]
