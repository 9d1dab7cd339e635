"""The driver contract: what every driver gives the service and the conformance suite.

`Driver` is the protocol the service is typed with; `VirtualClock`, `RealClock` and
`ThermalModel` are the optional capabilities a driver may add (claimed in its
`DriverRecord`). Preemption, fair share and several devices are behaviours, not calls: a
driver that claims them adds no member, and the conformance suite checks them through the
events and the device numbering. `DriverBase` is an optional helper for the HAL half: it validates
and stores scheduling configs (nothing applied if any is bad), holds the one callback, and
pushes raw events through the debouncer; a subclass applies configs to its device
(`_apply_configs`) and hands over raw events in batches (`_emit`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import ValidationError

from npumanager.checks import GroupId
from npumanager.core.driver.debounce import Debouncer
from npumanager.core.driver.events import EventKind, WorkEvent, to_work_infos
from npumanager.core.driver.job import DirectRun, Job, WorkMode
from npumanager.errors import IllegalArgumentError
from npumanager.schemas import EndReason, SchedulingConfig, StartReason, WorkInfo
from npumanager.schemas.device import DeviceDescription, DeviceStatus
from npumanager.schemas.limits import DEBOUNCE_DURATION_MS, MIN_PRIORITY

log = logging.getLogger(__name__)


@runtime_checkable
class SchedulingCallback(Protocol):
    """``ISchedulingCallback`` in Python spelling: one method per lifecycle event."""

    def on_work_requested(self, info: WorkInfo) -> None:
        """The driver queued the work."""

    def on_work_started(self, info: WorkInfo, reason: StartReason) -> None:
        """The work began (INITIAL) or resumed after a pause (RESUMED)."""

    def on_work_ended(self, info: WorkInfo, reason: EndReason) -> None:
        """The work stopped: completed, cancelled, failed or paused."""


@runtime_checkable
class BatchCallback(Protocol):
    """A callback that takes the light records in batches (the service's fast path)."""

    def on_work_events(self, events: Sequence[WorkEvent]) -> None:
        """A batch of debounced events, in order."""


Callback = SchedulingCallback | BatchCallback
"""What a driver delivers its events to: per event (the HAL's spelling) or in batches."""


@runtime_checkable
class Driver(Protocol):
    """What every driver provides: the scheduling HAL, devices, models, work and events.

    Nothing here needs a simulated engine: a real runtime (worker threads around ONNX
    Runtime or OpenVINO sessions) implements it directly. Errors are the package's:
    `IllegalArgumentError` for a bad argument, `CapacityError` for a load that does not
    fit, a `LookupError` (`UnknownModelError`, `UnknownWorkError`, `UnknownDeviceError`)
    for a handle or id that is not live, ``DriverClosedError`` after `close`.
    """

    def set_scheduling_configs(
        self, configs: Iterable[SchedulingConfig | Mapping[str, Any]]
    ) -> None:
        """Replace the whole set of configs (one per uid); nothing changes if any is bad."""

    def update_scheduling_configs(
        self, configs: Iterable[SchedulingConfig | Mapping[str, Any]]
    ) -> None:
        """Insert or replace the config of each uid given; the others stay."""

    @property
    def scheduling_configs(self) -> dict[int, SchedulingConfig]:
        """The configs in force, by uid (a copy)."""

    def set_callback(
        self, callback: Callback | None, debounce_duration_ms: int = DEBOUNCE_DURATION_MS
    ) -> None:
        """Deliver events to ``callback`` (or to nobody), debounced over the window (0: raw)."""

    @property
    def debounce_duration_ms(self) -> int:
        """The debounce window of the current callback registration."""

    @property
    def device_count(self) -> int:
        """How many devices, numbered 0..device_count-1."""

    def describe_devices(self) -> list[DeviceDescription]:
        """What each device offers: channels, weight memory (what the arbiter budgets), SRAM."""

    def device_state(self, device: int = 0) -> DeviceStatus:
        """A reading of one device now: memory used, queue, what runs, temperature."""

    @property
    def now_us(self) -> int:
        """The driver clock in microseconds: work events are stamped with it."""

    def load_model(self, device: int = 0, *, weight_bytes: int, sram_bytes: int = 0) -> int:
        """Account a model's bytes on a device and return its handle.

        A model that does not fit raises `CapacityError` and changes nothing.
        """

    def unload_model(self, model: int) -> None:
        """Free a model and its bytes; its queued and running work ends CANCELLED_SYSTEM."""

    def submit(
        self,
        model: int,
        *,
        uid: int,
        cost_cycles: int,
        job_priority: int = MIN_PRIORITY,
        original_uid: int | None = None,
        group_id: GroupId | None = None,
        feature_id: str | None = None,
        debug_pid: int = 0,
    ) -> int:
        """Queue one job on the model's device, scheduled by the uid's config; its work id."""

    def cancel(self, work_id: int) -> None:
        """The client cancels live work: it ends CANCELLED_USER now."""

    def pump(self) -> None:
        """Deliver the events that happened since the last call to the callback (or keep them)."""

    def take_events(self) -> list[WorkEvent]:
        """Raw events kept while no callback was registered, oldest first; clears them."""

    def run_until_idle(self, max_us: int | None = None) -> int:
        """Run until no work is live (virtual time advances; real time waits at most
        ``max_us`` of wall time); returns `now_us`."""

    def close(self) -> None:
        """Stop the driver and release what it holds; idempotent."""


@runtime_checkable
class VirtualClock(Protocol):
    """Capability ``virtual_time``: time moves only when told, so runs are deterministic."""

    def advance(self, us: int) -> None:
        """Run the devices for ``us`` microseconds of device time, then deliver events."""

    def idle(self) -> bool:
        """True when no work is live and no arrival is pending: time alone changes nothing."""


@runtime_checkable
class VirtualTimeDriver(Driver, VirtualClock, Protocol):
    """A driver with the virtual clock: what a service with `clock="virtual"` runs on."""


@runtime_checkable
class RealClock(Protocol):
    """Capability ``real_time`` with something to wait on: events arrive by themselves.

    A real-time driver without `fileno` is pumped at least every 50 ms instead.
    """

    def fileno(self) -> int:
        """A file descriptor that is readable while events wait for `~npumanager.Driver.pump`."""


@runtime_checkable
class TimedWork(Protocol):
    """The conformance hook of a real driver: real work of a rough duration.

    The suite loads the driver's own model built in code with `load_timed_model` and
    submits `inputs=timed_inputs(model, ms)` where a simulated driver takes
    `cost_cycles`; one inference then runs for about `ms` on this machine.
    """

    def timed_model(self) -> bytes:
        """The model built in code, serialized as the driver loads it (`model=`)."""

    def load_timed_model(self, device: int = 0) -> int:
        """Load the model built in code on `device` (its real bytes counted); its handle."""

    def timed_inputs(self, model: int, ms: float) -> dict[str, Any]:
        """Inputs that make one inference of the timed model take about `ms` here."""


class WorkHandle(Protocol):
    """One real inference in flight: a `concurrent.futures.Future` of its outputs with the
    work id of its events; `cancel()` cancels the work, queued or running."""

    work_id: int
    inline: object
    """Set while work submitted `~npumanager.core.driver.job.WorkMode.INLINE` holds a
    channel it has not run on yet (None otherwise): ``run_admitted`` runs it."""

    def result(self, timeout: float | None = None) -> list[Any]:
        """The outputs; raises if the work failed, was cancelled, or ``timeout`` passed."""

    def cancel(self) -> bool:
        """Cancel the work; True if it is cancelled."""

    def done(self) -> bool:
        """True once the work ended."""

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        """Call ``fn(self)`` once the work ended (at once if it has), on the thread that ended
        it."""


@runtime_checkable
class RealExecution(Protocol):
    """A driver that runs real models: loads them from bytes or a path, and returns a
    future of each inference's outputs (whose `cancel()` cancels the work)."""

    def load_model(
        self,
        device: int = 0,
        *,
        model: Any = None,
        path: Any = None,
        weight_bytes: int | None = None,
        sram_bytes: int = 0,
        uid: int | None = None,
        sidecars: Mapping[str, int] | None = None,
        max_weight_bytes: int | None = None,
    ) -> int:
        """Open and account a model; its handle. Its weights are counted from the model
        before anything is allocated for them, and refused over `max_weight_bytes` (what
        its grant allows). `sidecars` are the files it keeps weights in, as descriptors by
        name; no path named inside a model is ever resolved. A driver whose
        ``takes_tuned`` is True also takes the model or its path as a ``Tuned``: the
        threads and runtime options its app asked for the model's runs."""

    def model_bytes(self, model: int) -> int:
        """The weight bytes accounted for a loaded model."""

    def submit_future(
        self,
        model: int,
        job: Job,
        inputs: Mapping[str, Any] | DirectRun | None,
        mode: WorkMode = WorkMode.QUEUED,
    ) -> WorkHandle:
        """Queue one inference of ``job`` on ``inputs``; a future of its outputs. ``mode``
        says who runs it and who waits (`WorkMode`). A `DirectRun` is an inference whose
        model's host reads the inputs itself: its ``grant`` runs in the model's place."""

    def outputs(self, handle: WorkHandle, timeout: float | None = None) -> list[Any]:
        """The outputs of submitted work (run here if it was submitted inline and took a
        channel); after ``timeout`` seconds it is cancelled and `TimeoutError` raised."""

    def run_admitted(self, handle: WorkHandle) -> None:
        """Run work submitted inline that took a channel here, on the calling thread, and
        end it as it went (its future says how); nothing if it took none."""


@dataclass(frozen=True)
class Asked:
    """What an app asked of the runtime for a model's runs: ``threads`` for each run (0: one
    per CPU; None: the driver's setting) and runtime ``options`` by ``runtime.name``. A
    driver applies the options of its own runtime, refuses an unknown name or a bad value
    there, and leaves every other runtime's alone (an app written for another runtime may
    run on it)."""

    threads: int | None = None
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Tuned:
    """A model or its path (``load_model``'s ``model=`` or ``path=``) with what its app
    asked of the runtime."""

    source: Any
    asked: Asked = field(default_factory=Asked)


def takes_tuned(driver: RealExecution) -> bool:
    """True if the driver's ``load_model`` takes a ``Tuned`` model (the built-in real
    drivers do: their ``takes_tuned`` is True)."""
    return getattr(driver, "takes_tuned", False) is True


@runtime_checkable
class ThermalModel(Protocol):
    """Capability ``thermal_model``: the device heats with work and throttles."""

    def add_heat(self, device: int, millicelsius: int) -> None:
        """A thermal spike: the device's temperature jumps by ``millicelsius`` now."""


def validate_configs(
    configs: Iterable[SchedulingConfig | Mapping[str, Any]],
) -> list[SchedulingConfig]:
    """Each item as a `SchedulingConfig`; a bad one or a repeated uid is an illegal argument."""
    valid: list[SchedulingConfig] = []
    seen: dict[int, int] = {}
    for index, item in enumerate(configs):
        if isinstance(item, SchedulingConfig):
            config = item
        else:
            try:
                config = SchedulingConfig.model_validate(item)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()
                )
                raise IllegalArgumentError(f"configs[{index}]: {problems}") from None
        if config.uid in seen:
            raise IllegalArgumentError(
                f"configs[{seen[config.uid]}] and configs[{index}] are both for uid "
                f"{config.uid}; one config per uid is allowed"
            )
        seen[config.uid] = index
        valid.append(config)
    return valid


class DriverBase:
    """The HAL half of a driver: configs, the callback, debounced delivery."""

    def __init__(self) -> None:
        self._configs: dict[int, SchedulingConfig] = {}
        self._callback: SchedulingCallback | BatchCallback | None = None
        self._debouncer = Debouncer(DEBOUNCE_DURATION_MS)
        self._retained: list[WorkEvent] = []
        self.callback_errors = 0
        """Exceptions raised by the callback, logged and isolated."""

    # The scheduling HAL ------------------------------------------------------------

    def set_scheduling_configs(
        self, configs: Iterable[SchedulingConfig | Mapping[str, Any]]
    ) -> None:
        """Replace the whole set of configs; an empty set clears it."""
        valid = validate_configs(configs)
        new = {config.uid: config for config in valid}
        self._apply_configs(new)
        self._configs = new

    def update_scheduling_configs(
        self, configs: Iterable[SchedulingConfig | Mapping[str, Any]]
    ) -> None:
        """Insert or replace the config of each uid given; others stay."""
        valid = validate_configs(configs)
        new = {**self._configs, **{config.uid: config for config in valid}}
        self._apply_configs(new)
        self._configs = new

    @property
    def scheduling_configs(self) -> dict[int, SchedulingConfig]:
        """The configs in force, by uid (a copy)."""
        return dict(self._configs)

    def set_callback(
        self,
        callback: SchedulingCallback | BatchCallback | None,
        debounce_duration_ms: int = DEBOUNCE_DURATION_MS,
    ) -> None:
        """Hold ``callback`` (or none); events reach it debounced over the window (0: raw).

        Events held for the previous callback are delivered to it first.
        """
        if isinstance(debounce_duration_ms, bool) or not isinstance(debounce_duration_ms, int):
            raise IllegalArgumentError(
                f"debounce_duration_ms must be an int >= 0; got {debounce_duration_ms!r}"
            )
        if debounce_duration_ms < 0:
            raise IllegalArgumentError(
                f"debounce_duration_ms must be >= 0; got {debounce_duration_ms}"
            )
        if callback is not None and not isinstance(callback, SchedulingCallback | BatchCallback):
            raise IllegalArgumentError(
                "callback must have on_work_requested/on_work_started/on_work_ended "
                f"or on_work_events; got {type(callback).__name__}"
            )
        self._dispatch(self._debouncer.flush_all())
        self._callback = callback
        self._debouncer = Debouncer(debounce_duration_ms)

    @property
    def debounce_duration_ms(self) -> int:
        """The window of the current callback registration."""
        return self._debouncer.window_ms

    # For subclasses ----------------------------------------------------------------

    def _apply_configs(self, configs: Mapping[int, SchedulingConfig]) -> None:
        """Make `configs` (the complete new set, by uid) the ones the device schedules by."""
        raise NotImplementedError

    @property
    def has_callback(self) -> bool:
        """True while a callback is registered."""
        return self._callback is not None

    def _emit(self, events: Sequence[WorkEvent], now_us: int) -> None:
        """Deliver raw events, then any held ones that are due by `now_us`."""
        out = self._debouncer.feed(events)
        out.extend(self._debouncer.flush_due(now_us))
        self._dispatch(out)

    def _hand_over(self, events: Sequence[WorkEvent], now_us: int) -> None:
        """Deliver raw events to the callback (debounced), or keep them for `take_events`."""
        if self._callback is not None:
            self._emit(events, now_us)
        else:
            self._retained.extend(events)

    def pump(self) -> None:
        """Hand the events that happened since the last call over (``_hand_over``)."""
        raise NotImplementedError

    def take_events(self) -> list[WorkEvent]:
        """Raw events kept while no callback was registered, oldest first; clears them."""
        self.pump()
        events, self._retained = self._retained, []
        return events

    def _next_debounce_due_us(self) -> int | None:
        return self._debouncer.next_due_us()

    def _dispatch(self, events: Sequence[WorkEvent]) -> None:
        callback = self._callback
        if not events or callback is None:
            return
        if isinstance(callback, BatchCallback):
            self._guarded(callback.on_work_events, events)
            return
        for event, info in zip(events, to_work_infos(events), strict=True):
            if event.kind == EventKind.REQUESTED:
                self._guarded(callback.on_work_requested, info)
            elif event.kind == EventKind.STARTED:
                self._guarded(callback.on_work_started, info, StartReason(event.reason))
            else:
                self._guarded(callback.on_work_ended, info, EndReason(event.reason))

    def _guarded(self, method: Any, *args: Any) -> None:
        try:
            method(*args)
        except Exception:
            self.callback_errors += 1
            log.exception("scheduling callback %r raised; the driver carries on", method)
