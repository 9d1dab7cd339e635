"""`Channels`: the worker threads, queue and events under a real driver.

Each channel of a device has a foreground worker thread and, where the device has
background bands, a background one running at a lower OS priority (`background_nice`,
and `SCHED_IDLE` unless `background_idle=False`):
the worker of the next job's class takes it from the device's `DeviceScheduler` when its
channel is free, calls the runtime outside the lock, and reports what really happened.
`RealDriver` (`realexec.base`) adds models and submission on top.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from npumanager.checks import check_device, check_int
from npumanager.core.driver.contract import DriverBase
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.core.driver.job import DirectRun
from npumanager.core.driver.scheduler import DeviceScheduler
from npumanager.errors import (
    DriverClosedError,
    ExecutionError,
    IllegalArgumentError,
    ModelHostError,
    UnknownWorkError,
)
from npumanager.schemas import EndReason, SchedulingConfig, StartReason
from npumanager.schemas.device import DeviceSpec
from npumanager.schemas.limits import (
    DEFAULT_MAX_LIVE_WORK,
    DEFAULT_MAX_MODELS,
    INT32_MAX,
    MAX_CHANNELS,
    MAX_EFFECTIVE_PRIORITY,
    MAX_LIVE_WORK,
    MAX_MODELS,
    MAX_NICE,
    MIN_PRIORITY,
    REAL_BACKGROUND_NICE,
    REAL_MAX_RESULTS,
    REAL_NO_SLICE_US,
    REAL_RESERVED_CHANNELS,
)
from npumanager.vendor_drivers.realexec import preemption
from npumanager.vendor_drivers.realexec.osprio import lower_thread_priority
from npumanager.vendor_drivers.realexec.session import Call, background_from
from npumanager.vendor_drivers.realexec.work import (
    Model,
    SyncOutcome,
    Work,
    WorkFuture,
    effective_priority,
)

REQUESTED, STARTED, ENDED = int(EventKind.REQUESTED), int(EventKind.STARTED), int(EventKind.ENDED)
INITIAL, RESUMED = int(StartReason.INITIAL), int(StartReason.RESUMED)
PAUSED, FAILED, COMPLETED = int(EndReason.PAUSED), int(EndReason.FAILED), int(EndReason.COMPLETED)
"""Event kinds and reasons as the plain ints a `WorkEvent` holds (`int()` of an enum is
not free on the hot path)."""
_new_event = tuple.__new__


class Channels(DriverBase):
    """The live work of a real driver: per device a scheduler and its worker threads."""

    def __init__(
        self,
        specs: Sequence[DeviceSpec],
        *,
        max_live_work: int = DEFAULT_MAX_LIVE_WORK,
        max_models: int = DEFAULT_MAX_MODELS,
        clock: str = "real",
        reserved_channels: int = REAL_RESERVED_CHANNELS,
        background_nice: int = REAL_BACKGROUND_NICE,
        background_idle: bool = True,
        restart_preemption: bool = True,
        shared_cores: bool = False,
    ) -> None:
        if clock != "real":
            raise IllegalArgumentError(
                f"a real driver runs on the real clock only (clock='real'); got {clock!r}"
            )
        super().__init__()
        self.specs = [s.model_copy(update={"slice_us": REAL_NO_SLICE_US}) for s in specs]
        self.max_live_work = check_int("max_live_work", max_live_work, 1, MAX_LIVE_WORK)
        self.max_models = check_int("max_models", max_models, 1, MAX_MODELS)
        mutex = threading.RLock()
        self._mutex = mutex
        """The lock of `_lock`, taken directly where nothing waits (a `Condition`'s `with`
        runs Python code)."""
        self._lock = threading.Condition(mutex)
        self._idle_waiters = 0
        """Threads waiting in `run_until_idle`: all that `_lock.notify_all` would wake."""
        self._pump_lock = threading.Lock()
        self._ready = [(threading.Condition(mutex), threading.Condition(mutex)) for _ in specs]
        """Per device, what its foreground and background workers wait on: woken only when
        the next job is of their class."""
        reserved = check_int("reserved_channels", reserved_channels, 0, MAX_CHANNELS)
        self.background_nice = check_int("background_nice", background_nice, 0, MAX_NICE)
        if not isinstance(background_idle, bool):
            raise IllegalArgumentError(
                f"background_idle must be True or False; got {background_idle!r}"
            )
        self.background_idle = background_idle
        if not isinstance(restart_preemption, bool):
            raise IllegalArgumentError(
                f"restart_preemption must be True or False; got {restart_preemption!r}"
            )
        self.restart_preemption = restart_preemption
        if not isinstance(shared_cores, bool):
            raise IllegalArgumentError(f"shared_cores must be True or False; got {shared_cores!r}")
        self.shared_cores = shared_cores
        """The channels compute on the same cores (a CPU): while foreground work runs,
        background work (not owed its floor share) does not run beside it."""
        self._background_limit = [max(1, s.channels - reserved) for s in self.specs]
        self._background_from = [background_from(s) for s in self.specs]
        self._background_busy = [0] * len(self.specs)
        self._scheds = [DeviceScheduler[Work](s) for s in self.specs]
        self._used = [0] * len(self.specs)
        self._models: dict[int, Model] = {}
        self._work: dict[int, Work] = {}
        self._events: list[tuple[int, int, int, int, tuple[Any, ...]]] = []
        """Events as (kind, reason, effective priority, t_us, the work's `head`): made into
        `WorkEvent`s by `pump`, off the path of the work."""
        self._results: OrderedDict[int, list[np.ndarray]] = OrderedDict()
        self._priorities: dict[tuple[int, int, int], tuple[int, bool]] = {}
        """`priority_and_permission` by (uid, original uid, job priority), under the
        configs `_priorities_of`; emptied when the configs change."""
        self._priorities_of: Mapping[int, SchedulingConfig] | None = None
        self._next_work = 1
        self._next_model = 1
        self._busy = 0
        self._closed = False
        self._t0 = time.monotonic_ns()
        self._threads = [
            threading.Thread(
                target=self._worker,
                args=(d, c, background),
                daemon=True,
                name=f"npu{d}.{c}{'-bg' if background else ''}",
            )
            for d, spec in enumerate(self.specs)
            for c in range(spec.channels)
            for background in (False, True)
            if not background or self._background_from[d] <= MAX_EFFECTIVE_PRIORITY
        ]
        for thread in self._threads:
            thread.start()

    def _band(
        self, device: int, uid: int, configs: Mapping[int, SchedulingConfig] | None = None
    ) -> int:
        """The band of the device that a uid's work (job priority 0) falls in."""
        priority = effective_priority(
            self._configs if configs is None else configs, uid, uid, MIN_PRIORITY
        )
        return self.specs[device].band_of(priority)

    @property
    def now_us(self) -> int:
        """Microseconds of the monotonic clock since the driver opened."""
        return (time.monotonic_ns() - self._t0) // 1000

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

    def _end(self, work: Work, reason: EndReason, error: BaseException | None = None) -> None:
        """End live work now (lock held): out of the queue or stopped on its channel;
        its future fails with `error` where one says why better than the reason."""
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
        self._event(ENDED, int(reason), work, t)
        if error is not None:
            work.future.fail(error)
        elif reason == EndReason.FAILED:
            work.future.fail(ExecutionError(f"work {work.id} failed"))
        else:
            work.future.cancelled_by_driver()
        self._wake(work.device)

    # Workers ------------------------------------------------------------------------------

    def _worker(self, device: int, channel: int, background: bool) -> None:
        if background:
            lower_thread_priority(self.background_nice, self.background_idle)
        sched, ready = self._scheds[device], self._ready[device][background]
        while True:
            with self._lock:
                while not self._closed and not self._can_take(device, channel, background):
                    ready.wait()
                if self._closed:
                    return
                t = self.now_us
                work = sched.pick(t, self._choice(device, t)[1])
                if work is None:
                    continue
                sched.start(work, channel, t)
                self._start(work, channel, t)
                self._wake(device)  # the next job may be for the other class of workers
                self._preempt(device)
            self._execute(work)

    def _start(self, work: Work, channel: int, t: int) -> None:
        """Work the scheduler put on a channel at `t` (lock held): STARTED."""
        device = work.device
        background = work.effective_priority >= self._background_from[device]  # _in_background
        work.call = Call(background)
        self._busy += 1
        self._background_busy[device] += background
        self._event(STARTED, RESUMED if work.restarts else INITIAL, work, t)

    def _execute(self, work: Work) -> list[np.ndarray] | None:
        """Run started work on this thread (lock not held), then end it as it went; its
        outputs if this ended it COMPLETED."""
        work_id, live_work = work.id, self._work
        with self._mutex:  # it may have ended (cancelled, unloaded) since it started
            live = live_work.get(work_id) is work
            session = self._models[work.model].session if live else None
            feeds = work.feeds
        call = work.call
        assert call is not None
        outputs: list[np.ndarray] | None = None
        failure = ""
        host_ended: ModelHostError | None = None
        try:
            if session is None or feeds is None:
                raise ExecutionError(f"work {work_id} ended before it ran")
            outputs = (
                feeds.grant(session, call)
                if isinstance(feeds, DirectRun)
                else session.run(feeds, call)
            )
        except Exception as exc:  # the runtime's failure or its stop
            # Only its text: the exception's traceback holds this frame, and with it the
            # inputs (a client's shared segment), until the cycle collector ran.
            failure = str(exc)
            if isinstance(exc, ModelHostError):  # the system ended it, not the model
                host_ended = ModelHostError(failure)
        ended = -1
        device = work.device
        with self._mutex:
            self._busy -= 1
            self._background_busy[device] -= call.background
            if live_work.get(work_id) is work:
                t = (time.monotonic_ns() - self._t0) // 1000  # now_us
                sched = self._scheds[device]
                if outputs is None and work.stopping:  # made room: back in line, from the start
                    work.stopping, work.restarts = False, work.restarts + 1
                    if type(work.future) is SyncOutcome:  # a worker ends it: a real future
                        work.future = WorkFuture(work_id, self, False)
                    sched.stop(work, t, requeue=True)
                    self._event(ENDED, PAUSED, work, t)
                    self._wake(device)
                    return None
                if host_ended is not None:  # as the host's death unloading the model would
                    self._end(work, EndReason.CANCELLED_SYSTEM, host_ended)
                    return None
                sched.stop(work, t, requeue=False)
                del live_work[work_id]
                work.feeds = None
                ended = COMPLETED if outputs is not None else FAILED
                self._event(ENDED, ended, work, t)
                if outputs is not None and work.future.keep:
                    self._keep(work, outputs)
            self._wake(device)
        # The future's callbacks (a daemon writing outputs to its client) run without the lock.
        if ended == COMPLETED and outputs is not None:
            work.future.succeed(outputs)
            return outputs
        if ended == FAILED:
            work.future.fail(ExecutionError(f"the runtime failed: {failure}"))
        return None

    def _wake(self, device: int | None = None) -> None:
        """Wake the workers of the next job's class on a device (or all) when work waits,
        and `run_until_idle` when nothing is live (lock held); no wake-up is spent on nothing."""
        for d in range(len(self.specs)) if device is None else (device,):
            if self._closed:
                for ready in self._ready[d]:
                    ready.notify_all()
            elif self._scheds[d].queued:
                head = self._choice(d, self.now_us)[0]
                if head is not None:
                    self._ready[d][self._in_background(head)].notify_all()
        if self._idle_waiters and ((not self._work and not self._busy) or self._closed):
            self._lock.notify_all()

    def _in_background(self, work: Work) -> bool:
        """True if the work's band `is_background` on its device."""
        return work.effective_priority >= self._background_from[work.device]

    def _can_take(self, device: int, channel: int, background: bool) -> bool:
        """A job waits, the channel is free, and the next job (`_choice`) is of this
        worker's class (`background`)."""
        sched = self._scheds[device]
        if sched.depth == 0 or sched.running[channel] is not None:
            return False
        work = self._choice(device, self.now_us)[0]
        return work is not None and self._in_background(work) == background

    def _choice(self, device: int, t: int) -> tuple[Work | None, int | None]:
        """The job a free channel runs next at `t` (lock held), and the `below` to pick it with:
        the scheduler's next, or, when that is background work `_held_back`, the next of
        the bands above the background ones (foreground work never waits behind it)."""
        sched = self._scheds[device]
        head = sched.peek(t)
        if head is None or not self._held_back(head):
            return head, None
        below = self._background_from[device]
        return sched.peek(t, below), below

    def _held_back(self, work: Work) -> bool:
        """Background work (`is_background`) takes the last `reserved_channels` free
        channels only if it is more important than every running job (it always gets one)."""
        device = work.device
        if work.effective_priority < self._background_from[device]:  # not _in_background
            return False
        if self._beside_foreground(device, work):
            return True
        if self._background_busy[device] < self._background_limit[device]:
            return False
        running = [w.effective_priority for w in self._scheds[device].running if w is not None]
        return not work.effective_priority < min(running, default=work.effective_priority + 1)

    def _beside_foreground(self, device: int, work: Work) -> bool:
        """With `shared_cores`, background work would share the cores with running
        foreground work, and its band is not owed its floor share (lock held)."""
        sched = self._scheds[device]
        if not self.shared_cores or (sched.fair and sched.credit[work.band] > 0):
            return False
        return any(w is not None and not self._in_background(w) for w in sched.running)

    def _preempt(self, device: int) -> None:
        """Restart preemption (lock held): when every channel is busy and the next job should
        not wait (`preemption`: a more important band's, or an app's that holds no channel
        while another of its band holds several), stop a running job with the runtime's
        cancel; `_execute` requeues it."""
        sched = self._scheds[device]
        if self.restart_preemption and self.shared_cores:
            for work in sched.running:
                if (
                    work is not None
                    and not work.stopping
                    and self._in_background(work)
                    and self._beside_foreground(device, work)
                ):
                    work.stopping = True
                    assert work.call is not None
                    work.call.cancel()
        if not self.restart_preemption or not sched.queued or None in sched.running:
            return
        running = [w for w in sched.running if w is not None]
        job = self._choice(device, self.now_us)[0]  # now: the scheduler never goes back
        if job is None or any(w.stopping for w in running):
            return
        band = self.specs[device].band_of
        victim = preemption.by_band(
            running, job, band, lambda b: sched.fair and sched.credit[b] > 0
        ) or preemption.borrowed(running, job, band)
        if victim is not None:
            victim.stopping = True
            assert victim.call is not None
            victim.call.cancel()

    def _keep(self, work: Work, outputs: list[np.ndarray]) -> None:
        """Keep the outputs of work submitted to keep them, for `result(work_id)` (lock
        held)."""
        self._results[work.id] = outputs
        while len(self._results) > REAL_MAX_RESULTS:
            self._results.popitem(last=False)

    # Events and time ----------------------------------------------------------------------

    def _event(self, kind: int, reason: int, work: Work, t: int) -> None:
        """Record an event (`kind` and `reason` plain ints: `STARTED`, `INITIAL`, ...)."""
        self._events.append((kind, reason, work.effective_priority, t, work.head))

    def pump(self) -> None:
        """Hand the events since the last call to the callback (or keep them)."""
        with self._pump_lock:
            with self._lock:
                raw, self._events = self._events, []
            events = [
                _new_event(WorkEvent, (
                    kind, reason, h[0], h[1], h[2], h[3], h[4], h[5], h[6],
                    priority, t // 1000, h[7], t, h[8],
                ))
                for kind, reason, priority, t, h in raw
            ]  # fmt: skip
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
            self._idle_waiters += 1
            try:
                while self._work or self._busy:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._lock.wait(timeout=left)
            finally:
                self._idle_waiters -= 1
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
            self._wake()
        for thread in self._threads:
            thread.join()
        for entry in self._models.values():
            if entry.session is not None:
                entry.session.close()
        self._models.clear()

    def __enter__(self) -> Channels:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise DriverClosedError("the driver is closed")

    def _device(self, device: int) -> int:
        return check_device(device, len(self.specs))


__all__ = ["Channels", "ExecutionError", "Model", "Work"]
