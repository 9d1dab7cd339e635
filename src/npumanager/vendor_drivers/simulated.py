"""`EngineDriver`: the Python face of a simulated device, shared by `vnpu` (C) and `reference`.

A simulated device is an `Engine`; the face checks every argument once, here, so every
engine sees only valid calls and raises the same errors. It keeps the driver clock and
moves events from the engine to the callback (through the debouncer) or, with no callback
registered, keeps them for `~npumanager.Driver.take_events`. A driver for a real runtime
implements the `Driver` protocol (`npumanager.core.driver.contract`) itself and needs none of this.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from npumanager.checks import GroupId, check_device, check_int, group_bytes
from npumanager.core.driver.contract import Driver, DriverBase
from npumanager.core.driver.events import WorkEvent
from npumanager.core.driver.job import Arrivals, Job
from npumanager.errors import DriverClosedError, IllegalArgumentError
from npumanager.schemas import EndReason, SchedulingConfig
from npumanager.schemas.device import DeviceDescription, DeviceSpec, DeviceStatus
from npumanager.schemas.limits import (
    DEFAULT_MAX_LIVE_WORK,
    DEFAULT_MAX_MODELS,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    MAX_BURST,
    MAX_COST_CYCLES,
    MAX_DEVICES,
    MAX_HEAT_STEP_MC,
    MAX_LIVE_WORK,
    MAX_MODELS,
    MAX_PERIODIC_US,
    MAX_PRIORITY,
    MIN_PRIORITY,
    SIMULATION_HORIZON_US,
)


def device_specs(devices: int | Sequence[DeviceSpec | Mapping[str, Any]]) -> list[DeviceSpec]:
    """The validated spec of each device; an int asks for that many default devices."""
    if isinstance(devices, int):
        count = check_int("devices", devices, 1, MAX_DEVICES)
        return [DeviceSpec() for _ in range(count)]
    specs = [d if isinstance(d, DeviceSpec) else DeviceSpec.model_validate(d) for d in devices]
    check_int("number of devices", len(specs), 1, MAX_DEVICES)
    return specs


def _job(
    model: int, uid: int, original_uid: int | None, job_priority: int, cost_cycles: int
) -> tuple[int, int, int, int, int]:
    """The checked (model, uid, original uid, job priority, cost) of a job submission."""
    uid = check_int("uid", uid, 0, INT32_MAX)
    original = (
        uid if original_uid is None else check_int("original_uid", original_uid, 0, INT32_MAX)
    )
    return (
        check_int("model", model, 0, INT32_MAX),
        uid,
        original,
        check_int("job_priority", job_priority, MIN_PRIORITY, MAX_PRIORITY),
        check_int("cost_cycles", cost_cycles, 1, MAX_COST_CYCLES),
    )


class Engine(ABC):
    """What a simulation engine does; the face has checked every argument already."""

    @abstractmethod
    def configure(self, configs: Mapping[int, SchedulingConfig]) -> None:
        """Schedule by ``configs`` (the complete set, by uid) from now on."""

    @abstractmethod
    def load_model(self, device: int, weight_bytes: int, sram_bytes: int) -> int:
        """Account a model on ``device`` and return its handle; `CapacityError` if it does not
        fit."""

    @abstractmethod
    def unload_model(self, model: int) -> None:
        """Free a model; its live work ends CANCELLED_SYSTEM (`UnknownModelError` if unknown)."""

    @abstractmethod
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
        """Queue one job on the model's device and return its work id (REQUESTED now)."""

    @abstractmethod
    def add_periodic(self, model: int, job: Job, cost_cycles: int, arrivals: Arrivals) -> None:
        """Arrivals made inside the device of ``job`` (checked: its original uid resolved,
        its group as bytes), each of ``cost_cycles``."""

    @abstractmethod
    def end_work(self, work_id: int, reason: EndReason) -> None:
        """End live work now with ``reason`` (`UnknownWorkError` if it is not live)."""

    @abstractmethod
    def add_heat(self, device: int, millicelsius: int) -> None:
        """Raise a device's temperature by ``millicelsius`` now (a thermal spike)."""

    @abstractmethod
    def advance_to(self, target_us: int) -> None:
        """Perform every event point up to ``target_us`` and make it the device time."""

    @abstractmethod
    def now_us(self) -> int:
        """The device time, in microseconds."""

    @abstractmethod
    def next_event_us(self) -> int:
        """When the next event point falls (`~npumanager.schemas.limits.SIMULATION_HORIZON_US`
        if none is pending)."""

    @abstractmethod
    def idle(self) -> bool:
        """True when no work is queued or running and no periodic arrival is pending."""

    @abstractmethod
    def take_events(self) -> list[WorkEvent]:
        """The raw events since the last call, oldest first; clears them."""

    @abstractmethod
    def status(self, device: int) -> DeviceStatus:
        """A reading of one device now."""

    def close(self) -> None:  # noqa: B027 - engines without resources need no close
        """Release what the engine holds."""


class EngineDriver(DriverBase):
    """A `Driver` over a simulated device `Engine`; a subclass says which (``_make_engine``)."""

    engine: Engine

    def __init__(
        self,
        devices: int | Sequence[DeviceSpec | Mapping[str, Any]] = 1,
        *,
        max_live_work: int = DEFAULT_MAX_LIVE_WORK,
        max_models: int = DEFAULT_MAX_MODELS,
    ) -> None:
        super().__init__()
        self.specs = device_specs(devices)
        self.max_live_work = check_int("max_live_work", max_live_work, 1, MAX_LIVE_WORK)
        self.max_models = check_int("max_models", max_models, 1, MAX_MODELS)
        self._closed = False
        self.engine = self._make_engine()

    @abstractmethod
    def _make_engine(self) -> Engine:
        """The engine this driver runs on."""

    # Description ------------------------------------------------------------------

    @property
    def device_count(self) -> int:
        """How many devices, numbered 0..device_count-1."""
        return len(self.specs)

    def describe_devices(self) -> list[DeviceDescription]:
        """What each device offers."""
        return [
            DeviceDescription(
                number=n,
                channels=s.channels,
                weight_memory_bytes=s.weight_memory_bytes,
                sram_bytes=s.sram_bytes,
                clock_mhz=s.clock_mhz,
            )
            for n, s in enumerate(self.specs)
        ]

    def device_state(self, device: int = 0) -> DeviceStatus:
        """A reading of one device now."""
        self._open()
        return self.engine.status(self._device(device))

    @property
    def now_us(self) -> int:
        """The driver clock, in microseconds of device time."""
        return self.engine.now_us()

    # The HAL ------------------------------------------------------------------------

    def _apply_configs(self, configs: Mapping[int, SchedulingConfig]) -> None:
        self._open()
        self.engine.configure(configs)

    # Execution ----------------------------------------------------------------------

    def load_model(self, device: int = 0, *, weight_bytes: int, sram_bytes: int = 0) -> int:
        """Account a model's weights on a device and return its handle.

        A model that does not fit raises `CapacityError` and nothing is loaded.
        """
        self._open()
        device = self._device(device)
        weight = check_int("weight_bytes", weight_bytes, 0, INT64_MAX)
        sram = check_int("sram_bytes", sram_bytes, 0, INT64_MAX)
        return self.engine.load_model(device, weight, sram)

    def unload_model(self, model: int) -> None:
        """Free a model; its queued and running work ends CANCELLED_SYSTEM."""
        self._open()
        self.engine.unload_model(check_int("model", model, 0, INT32_MAX))

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
        """Queue one job of ``cost_cycles`` on the model's device; returns its work id."""
        self._open()
        job = _job(model, uid, original_uid, job_priority, cost_cycles)
        return self.engine.submit(
            *job,
            group_bytes(group_id),
            self._feature(feature_id),
            check_int("debug_pid", debug_pid, INT32_MIN, INT32_MAX),
        )

    def add_periodic(
        self,
        model: int,
        job: Job,
        *,
        cost_cycles: int,
        period_us: int,
        count: int,
        start_us: int | None = None,
        burst: int = 1,
    ) -> None:
        """Arrivals of ``job`` generated inside the device: ``burst`` jobs every
        ``period_us``, ``count`` times, each of ``cost_cycles``."""
        self._open()
        model, uid, original, priority, cost = _job(
            model, job.uid, job.original_uid, job.job_priority, cost_cycles
        )
        now = self.now_us
        start = now if start_us is None else check_int("start_us", start_us, now, MAX_PERIODIC_US)
        checked = Job(
            uid,
            priority,
            original,
            group_bytes(job.group_id),
            self._feature(job.feature_id),
            check_int("debug_pid", job.debug_pid, INT32_MIN, INT32_MAX),
        )
        arrivals = Arrivals(
            check_int("period_us", period_us, 1, MAX_PERIODIC_US),
            start,
            check_int("count", count, 1, INT32_MAX),
            check_int("burst", burst, 1, MAX_BURST),
        )
        self.engine.add_periodic(model, checked, cost, arrivals)

    def cancel(self, work_id: int) -> None:
        """The client cancels live work: it ends CANCELLED_USER now."""
        self._open()
        self.engine.end_work(check_int("work_id", work_id, 0, INT32_MAX), EndReason.CANCELLED_USER)

    def inject_fault(self, work_id: int) -> None:
        """Make live work fail now (ENDED FAILED), as an execution error would."""
        self._open()
        self.engine.end_work(check_int("work_id", work_id, 0, INT32_MAX), EndReason.FAILED)

    def add_heat(self, device: int, millicelsius: int) -> None:
        """A thermal spike: the device's temperature jumps by ``millicelsius`` now."""
        self._open()
        self.engine.add_heat(
            self._device(device),
            check_int("millicelsius", millicelsius, -MAX_HEAT_STEP_MC, MAX_HEAT_STEP_MC),
        )

    # Time -----------------------------------------------------------------------------

    def advance(self, us: int) -> None:
        """Run the devices for ``us`` microseconds of device time, then deliver events."""
        self._open()
        now = self.now_us
        target = now + check_int("us", us, 0, SIMULATION_HORIZON_US - 1 - now)
        self.engine.advance_to(target)
        self.pump()

    def run_until_idle(self, max_us: int | None = None) -> int:
        """Run until no work is live and no arrival is pending (or ``max_us`` passed)."""
        self._open()
        now = self.now_us
        span = SIMULATION_HORIZON_US - 1 - now
        limit = None if max_us is None else now + check_int("max_us", max_us, 0, span)
        while not self.engine.idle():
            target = self.engine.next_event_us()
            if target >= SIMULATION_HORIZON_US:
                break
            if limit is not None and target > limit:
                self.engine.advance_to(limit)
                break
            self.engine.advance_to(target)
            self.pump()
        due = self._next_debounce_due_us()
        if due is not None and (limit is None or due <= limit):
            self.engine.advance_to(max(due, self.now_us))
        self.pump()
        return self.now_us

    def pump(self) -> None:
        """Deliver the engine's new events to the callback, or keep them for
        `~npumanager.Driver.take_events`."""
        self._hand_over(self.engine.take_events(), self.now_us)

    def idle(self) -> bool:
        """True when no work is live and no arrival is pending: time alone changes nothing."""
        self._open()
        return self.engine.idle()

    def close(self) -> None:
        """Stop the driver; later calls raise ``DriverClosedError``."""
        if not self._closed:
            self._closed = True
            self.engine.close()

    def __enter__(self) -> EngineDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Helpers --------------------------------------------------------------------------

    def _open(self) -> None:
        if self._closed:
            raise DriverClosedError("the driver is closed")

    def _device(self, device: int) -> int:
        return check_device(device, len(self.specs))

    @staticmethod
    def _feature(feature_id: str | None) -> str | None:
        if feature_id is not None and not isinstance(feature_id, str):
            raise IllegalArgumentError(f"feature_id must be a str or None; got {feature_id!r}")
        return feature_id


SimulatedDriver = EngineDriver
"""The old name of `EngineDriver`, importable for this version."""

__all__ = ["Engine", "EngineDriver", "GroupId", "SimulatedDriver", "check_int", "group_bytes"]


def _is_a_driver(driver: EngineDriver) -> Driver:
    """Never called: mypy checks here that an `EngineDriver` satisfies the `Driver` protocol."""
    return driver
