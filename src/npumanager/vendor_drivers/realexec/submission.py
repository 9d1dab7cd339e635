"""`Submission`: how work enters a real driver, and the lean path of `run_inference`.

An inference submitted `inline` that is next in line and finds a channel it may take goes
straight onto that channel and runs on the submitting thread: no worker hand-over, no
timer thread when there is no timeout; when nothing waits it does not even pass through
the queue (`DeviceScheduler.admit`). That is the common case of a foreground app beside
a background one: the background work held back for want of a channel (`_held_back`)
waits, the foreground inference takes the free channel on its own thread. Everything else
is queued for the device's workers. Either way the events are the same (REQUESTED,
STARTED, ENDED) and so are the checks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from npumanager.checks import check_int, group_bytes
from npumanager.core.driver.events import NO_REASON
from npumanager.core.driver.job import DirectRun, Job, WorkMode
from npumanager.errors import IllegalArgumentError, UnknownModelError
from npumanager.schemas.limits import (
    INT32_MAX,
    INT32_MIN,
    MAX_PRIORITY,
    MIN_PRIORITY,
    REAL_PRIORITIES_KEPT,
)
from npumanager.vendor_drivers.realexec.channels import (
    ENDED,
    FAILED,
    REQUESTED,
    Channels,
    ExecutionError,
)
from npumanager.vendor_drivers.realexec.session import InputSpec, check_feeds
from npumanager.vendor_drivers.realexec.work import (
    SyncOutcome,
    Work,
    WorkFuture,
    priority_and_permission,
)

_JOB_DETAILS = frozenset({"job_priority", "original_uid", "group_id", "feature_id", "debug_pid"})


class Submission(Channels):
    """Submitting inferences: queued for the workers, or run inline by the caller."""

    def submit(
        self,
        model: int,
        *,
        uid: int,
        cost_cycles: int | None = None,
        inputs: Mapping[str, Any] | None = None,
        **details: Any,
    ) -> int:
        """Queue one inference with ``inputs`` (by name); its work id. Outputs: ``result``.
        ``details`` are the rest of its `Job` (``job_priority``, ``original_uid``,
        ``group_id``, ``feature_id``, ``debug_pid``), as the `Driver` contract names them."""
        unknown = sorted(set(details) - _JOB_DETAILS)
        if unknown:
            raise IllegalArgumentError(
                f"submit takes no {', '.join(unknown)}; a job's details are "
                f"{', '.join(sorted(_JOB_DETAILS))}"
            )
        return self.submit_future(
            model, Job(uid, **details), inputs, cost_cycles=cost_cycles, keep=True
        ).work_id

    def submit_future(
        self,
        model: int,
        job: Job,
        inputs: Mapping[str, Any] | DirectRun | None,
        mode: WorkMode = WorkMode.QUEUED,
        *,
        cost_cycles: int | None = None,
        keep: bool = False,
    ) -> WorkFuture | SyncOutcome:
        """Queue one inference of ``job``; a future of its outputs (``cancel()`` cancels
        the work). ``mode`` (`WorkMode`): with ``INLINE``, if it is next in line and a
        channel is free, it takes the channel now and ``outputs`` (or ``run_admitted``)
        runs it on the calling thread (with ``FOREGROUND_ONLY``, background work is left to
        the workers, at their lower OS priority, all the same); with ``SYNC`` too, only the
        calling thread waits, with ``outputs`` and no timeout, and work it runs itself then
        needs no `WorkFuture`. ``keep``: the outputs stay for ``result``."""
        inline = WorkMode.INLINE in mode
        inline_background = WorkMode.FOREGROUND_ONLY not in mode
        sync = WorkMode.SYNC in mode
        feature_id = job.feature_id
        self._check_open()
        uid, original, job_priority, gid, debug_pid = _checked(job)
        plain = type(model) is int and 0 <= model <= INT32_MAX
        with self._mutex:
            entry = self._models.get(model if plain else check_int("model", model, 0, INT32_MAX))
            if entry is None:
                raise UnknownModelError(f"model {model} is not loaded")
            if entry.session is None:
                raise IllegalArgumentError(
                    f"model {model} was loaded with weight_bytes only and has no runtime "
                    "session; load it with model= or path= (cost_cycles is for simulated drivers)"
                )
            if cost_cycles is not None:
                raise IllegalArgumentError(
                    "cost_cycles is for simulated drivers; a real driver runs inputs="
                )
            if inputs is None:
                raise IllegalArgumentError(
                    "inputs= is required: "
                    + ", ".join(spec.describe() for spec in entry.session.inputs)
                )
            work_id, device = self._next_work, entry.device
            feeds = _feeds(entry.session.inputs, inputs, work_id)
            self._next_work += 1
            priority, allowed = self._priority_and_permission(uid, original, job_priority)
            future: WorkFuture | SyncOutcome = (
                SyncOutcome(work_id, self) if sync and inline else WorkFuture(work_id, self, keep)
            )
            work = Work(
                id=work_id,
                uid=uid,
                effective_priority=priority,
                model=model,
                device=device,
                original_uid=original,
                job_priority=job_priority,
                group_id=gid,
                feature_id=feature_id,
                debug_pid=debug_pid,
                feeds=feeds,
                future=future,
            )
            t = (time.monotonic_ns() - self._t0) // 1000  # now_us
            self._event(REQUESTED, NO_REASON, work, t)
            if not allowed or len(self._work) >= self.max_live_work:
                self._event(ENDED, FAILED, work, t)
                future.fail(
                    ExecutionError(
                        f"uid {uid} may not run this work (no direct access, "
                        "no permission to attribute, or too much live work)"
                    )
                )
                return future
            self._work[work_id] = work
            sched = self._scheds[device]
            inline = inline and (inline_background or not self._in_background(work))
            channel = self._inline_channel(work) if inline and not sched.queued else None
            if channel is not None:
                sched.admit(work, channel, t)
            else:
                sched.enqueue(work, t)
                choice, below = self._choice(device, t) if inline else (None, None)
                if choice is work:  # next in line, before any held-back background work
                    channel = self._inline_channel(work)
                if channel is None:
                    if type(future) is SyncOutcome:  # the workers run it: a real future
                        work.future = future = WorkFuture(work_id, self, keep)
                    self._wake(device)
                    self._preempt(device)
                    return future
                sched.pick(t, below)
                sched.start(work, channel, t)
            self._start(work, channel, t)
            self._preempt(device)  # shared_cores: background work beside it stops
            future.inline = work
            return future

    def _priority_and_permission(
        self, uid: int, original: int, job_priority: int
    ) -> tuple[int, bool]:
        """`priority_and_permission` under the configs in force, kept while they are (lock
        held)."""
        configs, known = self._configs, self._priorities
        if self._priorities_of is not configs:
            self._priorities_of, known = configs, {}
            self._priorities = known
        key = (uid, original, job_priority)
        found = known.get(key)
        if found is None:
            found = priority_and_permission(configs, uid, original, job_priority)
            if len(known) >= REAL_PRIORITIES_KEPT:
                known.clear()
            known[key] = found
        return found

    def _inline_channel(self, work: Work) -> int | None:
        """The free channel new work may take at once, being next in line (lock held): the
        first free one, unless background work is held back (`_held_back`)."""
        device = work.device
        running = self._scheds[device].running
        if None not in running:
            return None
        if work.effective_priority >= self._background_from[device] and self._held_back(work):
            return None
        return running.index(None)

    def run_inference(
        self,
        model: int,
        *,
        uid: int,
        inputs: Mapping[str, Any] | None,
        job_priority: int = MIN_PRIORITY,
        timeout: float | None = None,
        **details: Any,
    ) -> list[np.ndarray]:
        """Run one inference and return its outputs (``WorkMode.INLINE``, then
        ``outputs``); ``details`` are the rest of its `Job`."""
        mode = WorkMode.INLINE | (WorkMode.SYNC if timeout is None else WorkMode.QUEUED)
        future = self.submit_future(model, Job(uid, job_priority, **details), inputs, mode)
        return self.outputs(future, timeout)

    def run_admitted(self, future: WorkFuture | SyncOutcome) -> None:
        """Run work submitted `WorkMode.INLINE` that took a channel here, on the calling
        thread, and end it as it went (its future says how); nothing if it took none."""
        work, future.inline = future.inline, None
        if work is not None:
            self._execute(work)

    def outputs(
        self, future: WorkFuture | SyncOutcome, timeout: float | None = None
    ) -> list[np.ndarray]:
        """The outputs of submitted work. Work submitted `inline` that took a channel runs
        here, on the calling thread (no hand-over to a worker). After `timeout` seconds the
        work is cancelled and `TimeoutError` raised."""
        work, future.inline = future.inline, None
        if work is None:
            return _waited(future, timeout)
        if timeout is None:
            done = self._execute(work)
            # stopped to make room, sync work waits for a worker on a `WorkFuture` after all
            return done if done is not None else work.future.result()
        deadline = time.monotonic() + timeout
        fired: list[bool] = []

        def expire() -> None:
            fired.append(True)
            future.cancel()

        timer = threading.Timer(timeout, expire)
        timer.start()
        try:
            done = self._execute(work)
        finally:
            timer.cancel()
        if done is not None:
            return done
        if fired and future.cancelled():
            raise TimeoutError(f"work {future.work_id} did not end within {timeout} s")
        # stopped to make room (restart preemption): it waits its turn, within the time left
        return _waited(future, max(0.0, deadline - time.monotonic()))


def _feeds(
    specs: tuple[InputSpec, ...], inputs: Mapping[str, Any] | DirectRun, work_id: int
) -> dict[str, np.ndarray] | DirectRun:
    """The work's feeds: `inputs` checked against the model's, or a `DirectRun` as it is
    (its host checks and reads the inputs itself), told its work id."""
    if isinstance(inputs, DirectRun):
        inputs.work_id = work_id
        return inputs
    return check_feeds(specs, inputs)


def _checked(job: Job) -> tuple[int, int, int, bytes | None, int]:
    """New work's uid, original uid, job priority, group id (bytes) and debug pid, checked
    in that order, then its feature id; `check_int` is called only for a value that is not
    a plain int in range (it would return that value)."""
    uid, original_uid, job_priority = job.uid, job.original_uid, job.job_priority
    group_id, debug_pid, feature_id = job.group_id, job.debug_pid, job.feature_id
    if type(uid) is not int or not 0 <= uid <= INT32_MAX:
        uid = check_int("uid", uid, 0, INT32_MAX)
    original = (
        uid if original_uid is None else check_int("original_uid", original_uid, 0, INT32_MAX)
    )
    if type(job_priority) is not int or not MIN_PRIORITY <= job_priority <= MAX_PRIORITY:
        job_priority = check_int("job_priority", job_priority, MIN_PRIORITY, MAX_PRIORITY)
    gid = None if group_id is None else group_bytes(group_id)
    if type(debug_pid) is not int or not INT32_MIN <= debug_pid <= INT32_MAX:
        debug_pid = check_int("debug_pid", debug_pid, INT32_MIN, INT32_MAX)
    if feature_id is not None and not isinstance(feature_id, str):
        raise IllegalArgumentError(f"feature_id must be a str or None; got {feature_id!r}")
    return uid, original, job_priority, gid, debug_pid


def _waited(future: WorkFuture | SyncOutcome, timeout: float | None) -> list[np.ndarray]:
    """The future's outputs; after `timeout` seconds the work is cancelled and
    `TimeoutError` raised."""
    try:
        return future.result(timeout=timeout)
    except TimeoutError:
        future.cancel()
        raise


__all__ = ["Submission"]
