"""`RealDriver`: the `Driver` protocol over a real runtime, with no simulated engine.

Each device has `channels` worker threads; work waits in a `DeviceScheduler` (bands, fair
share, floor) and a free worker takes the next job, calls the runtime (which releases the
GIL) and reports what really happened: REQUESTED when queued, STARTED when the runtime
call begins, ENDED(COMPLETED) when it returns (outputs kept for the caller), FAILED on a
runtime error, CANCELLED_USER on `cancel`, CANCELLED_SYSTEM on unload. Queued work that
ends never runs; running work is stopped with the runtime's own cancel. Nothing running
is paused: a more important job takes the next free channel (no PREEMPTION). Time is the
monotonic clock, in microseconds since the driver opened.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from npumanager.checks import GroupId, check_int, group_bytes
from npumanager.core.driver import DriverBase
from npumanager.core.events import NO_REASON, EventKind, WorkEvent
from npumanager.core.scheduler import DeviceScheduler, Job
from npumanager.errors import (
    CapacityError,
    DriverClosedError,
    IllegalArgumentError,
    UnknownDeviceError,
    UnknownModelError,
    UnknownWorkError,
)
from npumanager.schemas import EndReason, SchedulingConfig, StartReason
from npumanager.schemas.device import DeviceDescription, DeviceSpec, DeviceStatus
from npumanager.schemas.limits import (
    DEFAULT_MAX_LIVE_WORK,
    DEFAULT_MAX_MODELS,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    MAX_LIVE_WORK,
    MAX_MODELS,
    MAX_PRIORITY,
    MAX_TIMED_ROWS,
    MIN_PRIORITY,
    REAL_MAX_RESULTS,
    REAL_NO_SLICE_US,
    TIMED_CALIBRATION_ROWS,
    UNKNOWN_UID_PRIORITY,
)
from npumanager.vendor_drivers.realexec.chain import chain_inputs, chain_model
from npumanager.vendor_drivers.realexec.session import Call, Session, check_feeds
from npumanager.vendor_drivers.realexec.work import WorkFuture, effective_priority, permitted

ModelSource = bytes | Any | None


class ExecutionError(RuntimeError):
    """The runtime failed an inference (the work ended FAILED); the runtime's message."""


@dataclass(eq=False, kw_only=True)
class Work(Job):
    """One live inference."""

    model: int
    device: int
    original_uid: int
    job_priority: int
    group_id: bytes | None
    feature_id: str | None
    debug_pid: int
    feeds: dict[str, np.ndarray] | None
    future: WorkFuture
    call: Call | None = None


@dataclass(eq=False)
class Model:
    """A loaded model: its device, bytes and session (None: accounted only)."""

    id: int
    device: int
    weight_bytes: int
    session: Session | None
    row_us: float = 0.0
    uid: int | None = None


class RealDriver(DriverBase):
    """Worker threads around a runtime's sessions; a subclass opens models (`_open`)."""

    def __init__(
        self,
        specs: Sequence[DeviceSpec],
        *,
        max_live_work: int = DEFAULT_MAX_LIVE_WORK,
        max_models: int = DEFAULT_MAX_MODELS,
    ) -> None:
        super().__init__()
        self.specs = [s.model_copy(update={"slice_us": REAL_NO_SLICE_US}) for s in specs]
        self.max_live_work = check_int("max_live_work", max_live_work, 1, MAX_LIVE_WORK)
        self.max_models = check_int("max_models", max_models, 1, MAX_MODELS)
        self._lock = threading.Condition(threading.RLock())
        self._pump_lock = threading.Lock()
        self._scheds = [DeviceScheduler[Work](s) for s in self.specs]
        self._used = [0] * len(self.specs)
        self._models: dict[int, Model] = {}
        self._work: dict[int, Work] = {}
        self._events: list[WorkEvent] = []
        self._results: OrderedDict[int, list[np.ndarray]] = OrderedDict()
        self._next_work = 1
        self._next_model = 1
        self._busy = 0
        self._closed = False
        self._t0 = time.monotonic_ns()
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        self._signalled = False
        self._threads = [
            threading.Thread(target=self._worker, args=(d, c), daemon=True, name=f"npu{d}.{c}")
            for d, spec in enumerate(self.specs)
            for c in range(spec.channels)
        ]
        for thread in self._threads:
            thread.start()

    # For subclasses ---------------------------------------------------------------------

    @abstractmethod
    def _open(self, device: int, model: ModelSource, path: str | Path | None) -> Session:
        """Open a model on a device's runtime; a bad model raises `IllegalArgumentError`."""

    def _band_changed(self, session: Session, background: bool) -> None:
        """Relay a model's band to the runtime (by default `set_background`)."""
        session.set_background(background)

    # Description --------------------------------------------------------------------------

    @property
    def device_count(self) -> int:
        """How many devices, numbered 0..device_count-1."""
        return len(self.specs)

    def describe_devices(self) -> list[DeviceDescription]:
        """What each device offers: channels (worker threads) and weight memory."""
        return [
            DeviceDescription(
                number=n, channels=s.channels, weight_memory_bytes=s.weight_memory_bytes
            )
            for n, s in enumerate(self.specs)
        ]

    def device_state(self, device: int = 0) -> DeviceStatus:
        """A reading of one device now (no thermal model: always ambient)."""
        with self._lock:
            self._check_open()
            d = self._device(device)
            sched, spec = self._scheds[d], self.specs[d]
            return DeviceStatus(
                number=d,
                now_us=self.now_us,
                weight_memory_bytes=spec.weight_memory_bytes,
                weight_memory_used_bytes=self._used[d],
                sram_used_bytes=0,
                models_loaded=sum(1 for m in self._models.values() if m.device == d),
                queue_depth=sched.depth,
                running=tuple(w.id if w is not None else -1 for w in sched.running),
                temperature_mc=spec.thermal.ambient_mc,
                peak_temperature_mc=spec.thermal.ambient_mc,
                severity=0,
                throttled_us=0,
                shutdown=False,
            )

    @property
    def now_us(self) -> int:
        """Microseconds of the monotonic clock since the driver opened."""
        return (time.monotonic_ns() - self._t0) // 1000

    def fileno(self) -> int:
        """Readable while events wait for `pump`."""
        return self._rfd

    # The HAL ------------------------------------------------------------------------------

    def _apply_configs(self, configs: Mapping[int, SchedulingConfig]) -> None:
        with self._lock:
            self._check_open()
            t = self.now_us
            for sched in self._scheds:
                sched.rerank(
                    t,
                    lambda w: effective_priority(configs, w.uid, w.original_uid, w.job_priority),
                )
            for model in self._models.values():
                if model.session is not None and model.uid is not None:
                    background = self._background(model.device, model.uid, configs)
                    self._band_changed(model.session, background)
            self._lock.notify_all()

    def _background(
        self, device: int, uid: int, configs: Mapping[int, SchedulingConfig] | None = None
    ) -> bool:
        """True if the uid's work falls in the device's last band (of several)."""
        spec = self.specs[device]
        priority = effective_priority(configs or self._configs, uid, uid, MIN_PRIORITY)
        return len(spec.bands) > 1 and spec.band_of(priority) == len(spec.bands) - 1

    # Models -------------------------------------------------------------------------------

    def load_model(
        self,
        device: int = 0,
        *,
        model: ModelSource = None,
        path: str | Path | None = None,
        weight_bytes: int | None = None,
        sram_bytes: int = 0,
        uid: int | None = None,
    ) -> int:
        """Open a model (`model=` bytes or a runtime model object, or `path=`) and account
        its real weight bytes; with only `weight_bytes`, account bytes without a session.

        A model that is not valid or does not fit raises, and nothing is loaded.
        """
        self._check_open()
        d = self._device(device)
        sram = check_int("sram_bytes", sram_bytes, 0, INT64_MAX)
        if sram > self.specs[d].sram_bytes:
            raise CapacityError(
                f"sram_bytes {sram} exceeds device {d}'s SRAM of {self.specs[d].sram_bytes} bytes"
            )
        if model is None and path is None:
            if weight_bytes is None:
                raise IllegalArgumentError("give model=, path= or weight_bytes=")
            return self._account(d, check_int("weight_bytes", weight_bytes, 0, INT64_MAX), None)
        session = self._open(d, model, path)
        if weight_bytes is not None and weight_bytes != session.weight_bytes:
            session.close()
            raise IllegalArgumentError(
                f"weight_bytes={weight_bytes} but the model's weights hold "
                f"{session.weight_bytes} bytes"
            )
        try:
            handle = self._account(d, session.weight_bytes, session)
        except Exception:
            session.close()
            raise
        if uid is not None:
            with self._lock:
                entry = self._models[handle]
                entry.uid = check_int("uid", uid, 0, INT32_MAX)
                self._band_changed(session, self._background(d, uid))
        return handle

    def _account(self, device: int, weight: int, session: Session | None) -> int:
        with self._lock:
            self._check_open()
            capacity = self.specs[device].weight_memory_bytes
            if len(self._models) >= self.max_models:
                raise CapacityError(f"the driver holds {self.max_models} models already")
            if weight > capacity - self._used[device]:
                raise CapacityError(
                    f"the model's {weight} weight bytes do not fit on device {device}: "
                    f"{capacity - self._used[device]} of {capacity} bytes free"
                )
            handle = self._next_model
            self._next_model += 1
            self._models[handle] = Model(handle, device, weight, session)
            self._used[device] += weight
            return handle

    def model_info(self, model: int) -> Session:
        """The session of a loaded model (`UnknownModelError` if it has none)."""
        with self._lock:
            entry = self._models.get(model)
            if entry is None or entry.session is None:
                raise UnknownModelError(f"model {model} is not loaded with a runtime session")
            return entry.session

    def model_bytes(self, model: int) -> int:
        """The weight bytes accounted for a loaded model."""
        with self._lock:
            entry = self._models.get(model)
            if entry is None:
                raise UnknownModelError(f"model {model} is not loaded")
            return entry.weight_bytes

    def unload_model(self, model: int) -> None:
        """Free a model; its queued and running work ends CANCELLED_SYSTEM (running work is
        stopped with the runtime's cancel)."""
        with self._lock:
            self._check_open()
            entry = self._models.pop(check_int("model", model, 0, INT32_MAX), None)
            if entry is None:
                raise UnknownModelError(f"model {model} is not loaded")
            for work in sorted(self._work.values(), key=lambda w: w.id):
                if work.model == model:
                    self._end(work, EndReason.CANCELLED_SYSTEM)
            self._used[entry.device] -= entry.weight_bytes
        if entry.session is not None:
            entry.session.close()

    # Timed work: the conformance hook ------------------------------------------------------

    def load_timed_model(self, device: int = 0) -> int:
        """Load the driver's model built in code (a chain of matrix multiplications) and
        measure its cost per input row; `timed_inputs` then sizes real work by duration."""
        handle = self.load_model(device, model=chain_model())
        session = self.model_info(handle)
        feeds = chain_inputs(TIMED_CALIBRATION_ROWS)
        session.run(feeds, Call(False))
        times = []
        for _ in range(3):
            start = time.perf_counter_ns()
            session.run(feeds, Call(False))
            times.append(time.perf_counter_ns() - start)
        with self._lock:
            self._models[handle].row_us = sorted(times)[1] / 1000 / TIMED_CALIBRATION_ROWS
        return handle

    def timed_inputs(self, model: int, ms: float) -> dict[str, np.ndarray]:
        """Inputs of the timed model for one inference of about `ms` milliseconds here."""
        with self._lock:
            entry = self._models.get(model)
            if entry is None or entry.row_us <= 0:
                raise UnknownModelError(f"model {model} is not a timed model")
            rows = math.ceil(ms * 1000 / entry.row_us)
        return chain_inputs(max(1, min(MAX_TIMED_ROWS, rows)))

    # Work ---------------------------------------------------------------------------------

    def submit(
        self,
        model: int,
        *,
        uid: int,
        cost_cycles: int | None = None,
        inputs: Mapping[str, Any] | None = None,
        job_priority: int = MIN_PRIORITY,
        original_uid: int | None = None,
        group_id: GroupId | None = None,
        feature_id: str | None = None,
        debug_pid: int = 0,
    ) -> int:
        """Queue one inference with `inputs` (by name); its work id. Outputs: `result`."""
        return self.submit_future(
            model,
            uid=uid,
            cost_cycles=cost_cycles,
            inputs=inputs,
            job_priority=job_priority,
            original_uid=original_uid,
            group_id=group_id,
            feature_id=feature_id,
            debug_pid=debug_pid,
            keep=True,
        ).work_id

    def submit_future(
        self,
        model: int,
        *,
        uid: int,
        inputs: Mapping[str, Any] | None,
        cost_cycles: int | None = None,
        job_priority: int = MIN_PRIORITY,
        original_uid: int | None = None,
        group_id: GroupId | None = None,
        feature_id: str | None = None,
        debug_pid: int = 0,
        keep: bool = False,
    ) -> WorkFuture:
        """Queue one inference; a future of its outputs (`cancel()` cancels the work)."""
        self._check_open()
        uid = check_int("uid", uid, 0, INT32_MAX)
        original = (
            uid if original_uid is None else check_int("original_uid", original_uid, 0, INT32_MAX)
        )
        job_priority = check_int("job_priority", job_priority, MIN_PRIORITY, MAX_PRIORITY)
        gid = group_bytes(group_id)
        debug_pid = check_int("debug_pid", debug_pid, INT32_MIN, INT32_MAX)
        if feature_id is not None and not isinstance(feature_id, str):
            raise IllegalArgumentError(f"feature_id must be a str or None; got {feature_id!r}")
        with self._lock:
            entry = self._models.get(check_int("model", model, 0, INT32_MAX))
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
            feeds = check_feeds(entry.session.inputs, inputs)
            work = Work(
                id=self._next_work,
                uid=uid,
                effective_priority=effective_priority(self._configs, uid, original, job_priority),
                model=model,
                device=entry.device,
                original_uid=original,
                job_priority=job_priority,
                group_id=gid,
                feature_id=feature_id,
                debug_pid=debug_pid,
                feeds=feeds,
                future=WorkFuture(self._next_work, self, keep),
            )
            self._next_work += 1
            t = self.now_us
            self._event(EventKind.REQUESTED, NO_REASON, work, t)
            if not permitted(self._configs, uid, original) or len(self._work) >= self.max_live_work:
                self._event(EventKind.ENDED, EndReason.FAILED, work, t)
                work.future.fail(
                    ExecutionError(
                        f"uid {uid} may not run this work (no direct access, "
                        "no permission to attribute, or too much live work)"
                    )
                )
                return work.future
            self._work[work.id] = work
            self._scheds[entry.device].enqueue(work, t)
            self._lock.notify_all()
            return work.future

    def cancel(self, work_id: int) -> None:
        """End live work CANCELLED_USER now: queued, it never runs; running, it is stopped."""
        with self._lock:
            self._check_open()
            work = self._work.get(check_int("work_id", work_id, 0, INT32_MAX))
            if work is None:
                raise UnknownWorkError(f"work_id {work_id} is not live (never submitted or ended)")
            self._end(work, EndReason.CANCELLED_USER)

    def inject_fault(self, work_id: int) -> None:
        """Make live work fail now (ENDED FAILED), as a runtime error would."""
        with self._lock:
            work = self._work.get(check_int("work_id", work_id, 0, INT32_MAX))
            if work is None:
                raise UnknownWorkError(f"work_id {work_id} is not live")
            self._end(work, EndReason.FAILED)

    def result(self, work_id: int) -> list[np.ndarray]:
        """The outputs of a completed inference submitted with `submit` (once)."""
        with self._lock:
            try:
                return self._results.pop(work_id)
            except KeyError:
                raise LookupError(f"no outputs for work {work_id}") from None

    def _end(self, work: Work, reason: EndReason) -> None:
        """End live work now (lock held): out of the queue or stopped on its channel."""
        t = self.now_us
        sched = self._scheds[work.device]
        if work.channel >= 0:
            sched.stop(work, t, requeue=False)
            if work.call is not None:
                work.call.cancel()
        else:
            sched.remove(work, t)
        del self._work[work.id]
        work.feeds = None
        self._event(EventKind.ENDED, reason, work, t)
        if reason == EndReason.FAILED:
            work.future.fail(ExecutionError(f"work {work.id} failed"))
        else:
            work.future.cancelled_by_driver()
        self._lock.notify_all()

    # Workers ------------------------------------------------------------------------------

    def _worker(self, device: int, channel: int) -> None:
        sched = self._scheds[device]
        while True:
            with self._lock:
                while not self._closed and (sched.depth == 0 or sched.running[channel] is not None):
                    self._lock.wait()
                if self._closed:
                    return
                t = self.now_us
                work = sched.pick(t)
                if work is None:
                    continue
                sched.start(work, channel, t)
                session = self._models[work.model].session
                feeds, work.call = work.feeds, Call(self._background(device, work.uid))
                self._busy += 1
                self._event(EventKind.STARTED, StartReason.INITIAL, work, t)
            assert session is not None and feeds is not None
            outputs: list[np.ndarray] | None = None
            error: Exception | None = None
            try:
                outputs = session.run(feeds, work.call)
            except Exception as exc:  # the runtime's failure or its stop
                error = exc
            with self._lock:
                self._busy -= 1
                if self._work.get(work.id) is work:
                    t = self.now_us
                    sched.stop(work, t, requeue=False)
                    del self._work[work.id]
                    work.feeds = None
                    if outputs is not None:
                        self._event(EventKind.ENDED, EndReason.COMPLETED, work, t)
                        self._keep(work, outputs)
                    else:
                        self._event(EventKind.ENDED, EndReason.FAILED, work, t)
                        work.future.fail(ExecutionError(f"the runtime failed: {error}"))
                self._lock.notify_all()

    def _keep(self, work: Work, outputs: list[np.ndarray]) -> None:
        if work.future.keep:
            self._results[work.id] = outputs
            while len(self._results) > REAL_MAX_RESULTS:
                self._results.popitem(last=False)
        work.future.succeed(outputs)

    # Events and time ----------------------------------------------------------------------

    def _event(self, kind: EventKind, reason: int, work: Work, t: int) -> None:
        self._events.append(
            WorkEvent(
                int(kind), int(reason), work.id, work.group_id, work.uid, work.debug_pid,
                work.original_uid, work.feature_id, work.job_priority,
                work.effective_priority, t // 1000, work.device, t, work.model,
            )
        )  # fmt: skip
        if not self._signalled:
            self._signalled = True
            os.write(self._wfd, b"!")

    def pump(self) -> None:
        """Hand the events since the last call to the callback (or keep them)."""
        with self._pump_lock:
            with self._lock:
                events, self._events = self._events, []
                if self._signalled:
                    self._signalled = False
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._rfd, 64)
            self._hand_over(events, self.now_us)

    def take_events(self) -> list[WorkEvent]:
        """Raw events kept while no callback was registered, oldest first; clears them."""
        with self._pump_lock:
            pass
        return super().take_events()

    def idle(self) -> bool:
        """True when no work is live and no worker is inside the runtime."""
        with self._lock:
            return not self._work and self._busy == 0

    def run_until_idle(self, max_us: int | None = None) -> int:
        """Wait (at most `max_us` of wall time) until no work is live; deliver events."""
        self._check_open()
        deadline = None if max_us is None else time.monotonic() + max_us / 1e6
        with self._lock:
            while self._work or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._lock.wait(timeout=left)
        due = self._next_debounce_due_us()
        while due is not None and (deadline is None or time.monotonic() < deadline):
            time.sleep(max(0.0, (due - self.now_us) / 1e6))
            self.pump()
            due = self._next_debounce_due_us()
        self.pump()
        return self.now_us

    def close(self) -> None:
        """Stop the workers (running work is stopped) and release the sessions; idempotent."""
        with self._lock:
            if self._closed:
                return
            for work in sorted(self._work.values(), key=lambda w: w.id):
                self._end(work, EndReason.CANCELLED_SYSTEM)
            self._closed = True
            self._lock.notify_all()
        for thread in self._threads:
            thread.join()
        for entry in self._models.values():
            if entry.session is not None:
                entry.session.close()
        self._models.clear()
        os.close(self._rfd)
        os.close(self._wfd)

    def __enter__(self) -> RealDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise DriverClosedError("the driver is closed")

    def _device(self, device: int) -> int:
        device = check_int("device", device, 0, INT32_MAX)
        if device >= len(self.specs):
            raise UnknownDeviceError(
                f"device {device} does not exist; devices are 0..{len(self.specs) - 1}"
            )
        return device


__all__ = ["UNKNOWN_UID_PRIORITY", "ExecutionError", "RealDriver", "Work"]
