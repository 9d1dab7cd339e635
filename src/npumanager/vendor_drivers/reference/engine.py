"""The simulated NPU in plain Python: the oracle that the C driver must match event for event.

Written for clarity, not speed. Everything is an integer: time in microseconds, work in
centi-cycles (a cycle is 100 centi-cycles, so a throttled clock still advances exactly),
temperature in milli-degrees Celsius.

The rules, which `vnpu/csrc/vnpu.c` implements identically:

* Which job a free channel takes and which running jobs pause is the policy of
  `core.scheduler` (strict priority, or bands with fair share and a floor, as the
  `DeviceSpec` says). Free channels are filled lowest-numbered first.
* A device does its work at *event points*. At an event point at time t it does, in
  this order: (1) the thermal tick, if t is the next tick time; (2) completions due at
  t, by channel; (3) periodic arrivals due at t, by generator; (4) the pauses the
  scheduler picks at t (jobs at a slice boundary), by channel; (5) dispatch onto free
  channels.
* A paused job (ENDED PAUSED, at a slice boundary) waits with its remaining work and
  resumes later (STARTED RESUMED).
* Thermal tick every `tick_us` of device time while the device is busy or not at
  ambient: `temp += heat * busy_channels`, then temp moves toward ambient by
  `max(1, |temp - ambient| * cooling_permille // 1000)` (never past it). The severity is
  recomputed after every temperature change; running jobs are brought up to date and
  continue at the new clock. Reaching SHUTDOWN fails every live job (ENDED FAILED, by id)
  and the device fails new work until it cools below the SHUTDOWN threshold.
* Several devices: the driver steps the device with the earliest event point first,
  lower device number first on a tie, so ids and events are in one deterministic order.
* Calls act at the driver's current time and emit their own events at once. These
  mark the device *dirty*, so it has an event point at that time on the next advance:
  configure (every device), unload (the model's device), a submit that was queued (not
  one that failed), add_periodic, cancel, a fault, add_heat. Loading a model does not.
* Ending a job that waits removes it from the queue; ending any job emits ENDED with the
  given reason. Unloading a model or a SHUTDOWN ends the affected jobs in id order.
* A submit emits REQUESTED, then ENDED FAILED at once if the uid lacks direct access,
  attributes another uid without permission, the device is shut down, or the driver
  already holds `max_live_work` live jobs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from npumanager.core.driver.events import NO_REASON, EventKind, WorkEvent
from npumanager.core.driver.job import Arrivals, Job
from npumanager.core.driver.scheduler import DeviceScheduler, ScheduledJob
from npumanager.errors import (
    CapacityError,
    UnknownDeviceError,
    UnknownModelError,
    UnknownWorkError,
)
from npumanager.schemas import EndReason, SchedulingConfig, StartReason, ThermalSeverity
from npumanager.schemas.device import DeviceSpec, DeviceStatus
from npumanager.schemas.limits import SIMULATION_HORIZON_US, UNKNOWN_UID_PRIORITY
from npumanager.vendor_drivers.simulated import Engine

CENTI = 100
"""Centi-cycles per cycle."""
NEVER = SIMULATION_HORIZON_US

QUEUED, RUNNING = 0, 1


def default_config(uid: int) -> SchedulingConfig:
    """What an unknown uid schedules by: least important, direct access, no attribution."""
    return SchedulingConfig(uid=uid, app_priority=UNKNOWN_UID_PRIORITY)


@dataclass(eq=False, kw_only=True)
class Work(ScheduledJob):
    """One live piece of work."""

    model: int
    device: int
    original_uid: int
    job_priority: int
    remaining_cc: int
    group_id: bytes | None
    feature_id: str | None
    debug_pid: int
    state: int = QUEUED
    synced_us: int = 0
    started_before: bool = False


@dataclass(eq=False)
class Model:
    """A loaded model: where, and how much memory it holds."""

    id: int
    device: int
    weight_bytes: int
    sram_bytes: int


@dataclass(eq=False)
class Generator:
    """Periodic arrivals: `burst` jobs of `job` every `period_us`, `count` times."""

    model: int
    job: Job
    cost_cycles: int
    period_us: int
    next_us: int
    remaining: int
    burst: int


@dataclass(eq=False)
class Device:
    """One device's state."""

    number: int
    spec: DeviceSpec
    temp_mc: int
    peak_temp_mc: int
    sched: DeviceScheduler[Work]
    severity: ThermalSeverity = ThermalSeverity.NONE
    weight_used: int = 0
    models: int = 0
    next_tick_us: int | None = None
    dirty: bool = False
    throttled_us: int = 0
    throttled_since: int | None = None
    generators: list[Generator] = field(default_factory=list)
    victims: list[Work] = field(default_factory=list)

    @property
    def speed(self) -> int:
        """Centi-cycles per microsecond at the current severity."""
        return self.spec.clock_mhz * self.spec.thermal.clock_percent(self.severity)

    @property
    def shutdown(self) -> bool:
        """True while the device is stopped by SHUTDOWN severity."""
        return self.severity == ThermalSeverity.SHUTDOWN

    @property
    def channels(self) -> list[Work | None]:
        """The job on each channel."""
        return self.sched.running

    def running(self) -> list[Work]:
        """Running jobs by channel."""
        return [w for w in self.channels if w is not None]


class ReferenceEngine(Engine):
    """The whole simulated driver: devices, models, live work, the event list."""

    def __init__(self, specs: Sequence[DeviceSpec], max_live_work: int, max_models: int) -> None:
        self.clock_us = 0
        self.devices = [
            Device(n, s, s.thermal.ambient_mc, s.thermal.ambient_mc, DeviceScheduler(s))
            for n, s in enumerate(specs)
        ]
        self.max_live_work = max_live_work
        self.max_models = max_models
        self.configs: dict[int, SchedulingConfig] = {}
        self.models: dict[int, Model] = {}
        self.work: dict[int, Work] = {}
        self.events: list[WorkEvent] = []
        self.next_work_id = 1
        self.next_model_id = 1

    # Calls ----------------------------------------------------------------------

    def configure(self, configs: Mapping[int, SchedulingConfig]) -> None:
        """Schedule by a new complete set of configs; live work is re-ranked."""
        self.configs = dict(configs)
        for device in self.devices:
            device.sched.rerank(
                self.clock_us, lambda w: self._effective(w.uid, w.original_uid, w.job_priority)
            )
            device.dirty = True

    def load_model(self, device: int, weight_bytes: int, sram_bytes: int) -> int:
        """Account a model's weights on a device; refuses what does not fit."""
        dev = self._device(device)
        if len(self.models) >= self.max_models:
            raise CapacityError(f"the driver holds {self.max_models} models already")
        free = dev.spec.weight_memory_bytes - dev.weight_used
        if weight_bytes > free:
            raise CapacityError(
                f"weight_bytes {weight_bytes} does not fit on device {device}: "
                f"{free} of {dev.spec.weight_memory_bytes} bytes free"
            )
        if sram_bytes > dev.spec.sram_bytes:
            raise CapacityError(
                f"sram_bytes {sram_bytes} exceeds device {device}'s SRAM of "
                f"{dev.spec.sram_bytes} bytes"
            )
        model = Model(self.next_model_id, device, weight_bytes, sram_bytes)
        self.next_model_id += 1
        self.models[model.id] = model
        dev.weight_used += weight_bytes
        dev.models += 1
        return model.id

    def unload_model(self, model: int) -> None:
        """Revoke a model: its live work ends CANCELLED_SYSTEM, its weights are freed."""
        found = self._model(model)
        dev = self.devices[found.device]
        for work in sorted(self.work.values(), key=lambda w: w.id):
            if work.model == model:
                self._end(work, EndReason.CANCELLED_SYSTEM, self.clock_us)
        dev.generators = [g for g in dev.generators if g.model != model]
        dev.weight_used -= found.weight_bytes
        dev.models -= 1
        del self.models[model]
        dev.dirty = True

    def submit(
        self,
        model: int,
        uid: int,
        original_uid: int,
        job_priority: int,
        cost_cycles: int,
        group_id: bytes | None,
        feature_id: str | None,
        debug_pid: int,
    ) -> int:
        """Queue one job now; returns its id (a denied job ends FAILED at once)."""
        found = self._model(model)
        job = Job(uid, job_priority, original_uid, group_id, feature_id, debug_pid)
        return self._arrive(self.devices[found.device], model, job, cost_cycles, self.clock_us)

    def add_periodic(self, model: int, job: Job, cost_cycles: int, arrivals: Arrivals) -> None:
        """Register periodic arrivals on the model's device."""
        dev = self.devices[self._model(model).device]
        period, start, count, burst = arrivals
        dev.generators.append(Generator(model, job, cost_cycles, period, start, count, burst))
        dev.dirty = True

    def end_work(self, work_id: int, reason: EndReason) -> None:
        """End one live job now with ``reason`` (CANCELLED_USER, or FAILED for a fault)."""
        work = self.work.get(work_id)
        if work is None:
            raise UnknownWorkError(f"work_id {work_id} is not live (never submitted or ended)")
        self._end(work, reason, self.clock_us)
        self.devices[work.device].dirty = True

    def add_heat(self, device: int, millicelsius: int) -> None:
        """A thermal spike: the temperature jumps now."""
        dev = self._device(device)
        self._set_temperature(dev, dev.temp_mc + millicelsius, self.clock_us)
        dev.dirty = True

    # Time -----------------------------------------------------------------------

    def advance_to(self, target_us: int) -> None:
        """Run every device up to ``target_us``, event point by event point."""
        while True:
            best: tuple[int, int] | None = None
            for dev in self.devices:
                t = self._next_event(dev)
                if t < NEVER and t <= target_us and (best is None or t < best[0]):
                    best = (t, dev.number)
            if best is None:
                break
            self.clock_us = best[0]
            self._step(self.devices[best[1]], best[0])
        self.clock_us = max(self.clock_us, target_us)

    def now_us(self) -> int:
        """The driver clock."""
        return self.clock_us

    def take_events(self) -> list[WorkEvent]:
        """Events since the last call, oldest first."""
        events, self.events = self.events, []
        return events

    def status(self, device: int) -> DeviceStatus:
        """A reading of one device."""
        dev = self.devices[device]
        return DeviceStatus(
            number=device,
            now_us=self.clock_us,
            weight_memory_bytes=dev.spec.weight_memory_bytes,
            weight_memory_used_bytes=dev.weight_used,
            sram_used_bytes=self.sram_used(dev),
            models_loaded=dev.models,
            queue_depth=dev.sched.depth,
            running=tuple(w.id if w is not None else -1 for w in dev.channels),
            temperature_mc=dev.temp_mc,
            peak_temperature_mc=dev.peak_temp_mc,
            severity=dev.severity,
            throttled_us=self.throttled_us(dev),
            shutdown=dev.shutdown,
        )

    def idle(self) -> bool:
        """True when no work is live and no arrivals are pending."""
        return not self.work and all(not d.generators and not d.dirty for d in self.devices)

    def next_event_us(self) -> int:
        """The earliest event point of any device (NEVER if none)."""
        return min((self._next_event(d) for d in self.devices), default=NEVER)

    # Device internals ---------------------------------------------------------------

    def _next_event(self, dev: Device) -> int:
        t = NEVER
        if dev.dirty:
            t = self.clock_us
        for work in dev.running():
            t = min(t, self._completion_us(dev, work))
        t = min(t, dev.sched.next_pause_us(self.clock_us))
        for gen in dev.generators:
            t = min(t, gen.next_us)
        if dev.next_tick_us is not None:
            t = min(t, dev.next_tick_us)
        return t

    def _step(self, dev: Device, t: int) -> None:
        dev.dirty = False
        if dev.next_tick_us == t:
            self._thermal_tick(dev, t)
        for work in dev.running():
            if self._completion_us(dev, work) <= t:
                self._end(work, EndReason.COMPLETED, t)
        for gen in list(dev.generators):
            if gen.next_us == t:
                self._fire(dev, gen, t)
        dev.victims = dev.sched.victims(t)
        for work in self._marked(dev):
            self._pause(dev, work, t)
        self._dispatch(dev, t)
        self._update_tick(dev, t)

    def _completion_us(self, dev: Device, work: Work) -> int:
        speed = dev.speed
        if speed == 0:
            return NEVER
        return work.synced_us + -(-work.remaining_cc // speed)

    def _marked(self, dev: Device) -> list[Work]:
        """The running jobs the scheduler pauses at this event point, by channel."""
        return dev.victims

    def _sync(self, dev: Device, work: Work, t: int) -> None:
        work.remaining_cc = max(0, work.remaining_cc - (t - work.synced_us) * dev.speed)
        work.synced_us = t

    def _dispatch(self, dev: Device, t: int) -> None:
        for channel, occupant in enumerate(dev.channels):
            if occupant is not None:
                continue
            work = dev.sched.pick(t)
            if work is None:
                break
            work.state, work.synced_us = RUNNING, t
            dev.sched.start(work, channel, t)
            reason = StartReason.RESUMED if work.started_before else StartReason.INITIAL
            work.started_before = True
            self._event(EventKind.STARTED, reason, work, t)

    def _pause(self, dev: Device, work: Work, t: int) -> None:
        self._sync(dev, work, t)
        work.state = QUEUED
        dev.sched.stop(work, t, requeue=True)
        self._event(EventKind.ENDED, EndReason.PAUSED, work, t)

    def _end(self, work: Work, reason: EndReason, t: int) -> None:
        dev = self.devices[work.device]
        if work.state == RUNNING:
            self._sync(dev, work, t)
            dev.sched.stop(work, t, requeue=False)
        else:
            dev.sched.remove(work, t)
        del self.work[work.id]
        self._event(EventKind.ENDED, reason, work, t)

    def _fire(self, dev: Device, gen: Generator, t: int) -> None:
        for _ in range(gen.burst):
            self._arrive(dev, gen.model, gen.job, gen.cost_cycles, t)
        gen.remaining -= 1
        gen.next_us += gen.period_us
        if gen.remaining == 0:
            dev.generators.remove(gen)

    def _arrive(self, dev: Device, model: int, job: Job, cost_cycles: int, t: int) -> int:
        uid, job_priority = job.uid, job.job_priority
        original_uid = uid if job.original_uid is None else job.original_uid
        group_id = job.group_id if isinstance(job.group_id, bytes) else None
        work = Work(
            id=self.next_work_id,
            model=model,
            device=dev.number,
            uid=uid,
            original_uid=original_uid,
            job_priority=job_priority,
            effective_priority=self._effective(uid, original_uid, job_priority),
            remaining_cc=cost_cycles * CENTI,
            group_id=group_id,
            feature_id=job.feature_id,
            debug_pid=job.debug_pid,
        )
        self.next_work_id += 1
        self._event(EventKind.REQUESTED, NO_REASON, work, t)
        if (
            not self._permitted(uid, original_uid)
            or dev.shutdown
            or len(self.work) >= self.max_live_work
        ):
            self._event(EventKind.ENDED, EndReason.FAILED, work, t)
            return work.id
        self.work[work.id] = work
        dev.sched.enqueue(work, t)
        dev.dirty = True
        return work.id

    def _permitted(self, uid: int, original_uid: int) -> bool:
        config = self.configs.get(uid) or default_config(uid)
        if not config.has_direct_access:
            return False
        return original_uid == uid or config.can_attribute_other_uid

    def _effective(self, uid: int, original_uid: int, job_priority: int) -> int:
        config = self.configs.get(uid) or default_config(uid)
        if original_uid != uid and original_uid in self.configs:
            config = self.configs[original_uid]
        return config.app_priority + config.clamp_job_priority(job_priority)

    # Thermal ----------------------------------------------------------------------

    def _thermal_tick(self, dev: Device, t: int) -> None:
        thermal = dev.spec.thermal
        temp = dev.temp_mc + thermal.heat_per_busy_channel_mc * len(dev.running())
        delta = temp - thermal.ambient_mc
        if delta != 0:
            step = max(1, abs(delta) * thermal.cooling_permille // 1000)
            temp -= min(step, abs(delta)) if delta > 0 else -min(step, abs(delta))
        self._set_temperature(dev, temp, t)

    def _set_temperature(self, dev: Device, temp_mc: int, t: int) -> None:
        dev.temp_mc = temp_mc
        dev.peak_temp_mc = max(dev.peak_temp_mc, temp_mc)
        severity = dev.spec.thermal.severity_of(temp_mc)
        if severity == dev.severity:
            return
        for work in dev.running():
            self._sync(dev, work, t)
        was_throttled = dev.speed < dev.spec.clock_mhz * CENTI
        dev.severity = severity
        throttled = dev.speed < dev.spec.clock_mhz * CENTI
        if throttled and not was_throttled:
            dev.throttled_since = t
        elif was_throttled and not throttled and dev.throttled_since is not None:
            dev.throttled_us += t - dev.throttled_since
            dev.throttled_since = None
        if severity == ThermalSeverity.SHUTDOWN:
            for work in sorted(self.work.values(), key=lambda w: w.id):
                if work.device == dev.number:
                    self._end(work, EndReason.FAILED, t)

    def _update_tick(self, dev: Device, t: int) -> None:
        active = bool(dev.running()) or dev.temp_mc != dev.spec.thermal.ambient_mc
        tick = dev.spec.thermal.tick_us
        if not active:
            dev.next_tick_us = None
        elif dev.next_tick_us is None or dev.next_tick_us <= t:
            dev.next_tick_us = (t // tick + 1) * tick

    # Lookups and events -------------------------------------------------------------

    def _device(self, device: int) -> Device:
        if not 0 <= device < len(self.devices):
            raise UnknownDeviceError(
                f"device {device} does not exist; devices are 0..{len(self.devices) - 1}"
            )
        return self.devices[device]

    def _model(self, model: int) -> Model:
        found = self.models.get(model)
        if found is None:
            raise UnknownModelError(f"model {model} is not loaded")
        return found

    def _event(self, kind: EventKind, reason: int, work: Work, t: int) -> None:
        self.events.append(
            WorkEvent(
                int(kind),
                int(reason),
                work.id,
                work.group_id,
                work.uid,
                work.debug_pid,
                work.original_uid,
                work.feature_id,
                work.job_priority,
                work.effective_priority,
                t // 1000,
                work.device,
                t,
                work.model,
            )
        )

    def throttled_us(self, dev: Device) -> int:
        """Throttled device time so far, counting an ongoing stretch up to now."""
        ongoing = self.clock_us - dev.throttled_since if dev.throttled_since is not None else 0
        return dev.throttled_us + ongoing

    def sram_used(self, dev: Device) -> int:
        """SRAM held by the models of the jobs running now."""
        return sum(self.models[w.model].sram_bytes for w in dev.running())
