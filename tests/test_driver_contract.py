"""The `Driver` protocol is enough: a driver with a worker thread and no engine runs a service.

`ThreadDriver` is what a real runtime's driver looks like in outline: jobs run one at a
time on a worker thread (where an ONNX Runtime or OpenVINO session would run them), the
clock is the wall clock, and nothing of the simulated device is used.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from helpers.daemon_support import WAIT_S
from npumanager import (
    Driver,
    DriverBase,
    EngineDriver,
    IllegalArgumentError,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelLoadStatus,
    RealClock,
    Service,
    SimulatedDriver,
    ThermalModel,
    VirtualClock,
    hookimpl,
)
from npumanager.core.driver.events import NO_REASON, EventKind, WorkEvent
from npumanager.core.plugins.registry import PluginSource, load_plugins
from npumanager.errors import CapacityError, UnknownWorkError
from npumanager.schemas import (
    DriverCapability,
    DriverRecord,
    EndReason,
    SchedulingConfig,
    StartReason,
    ThermalSeverity,
)
from npumanager.schemas.device import DeviceDescription, DeviceStatus
from npumanager.vendor_drivers.reference import ReferenceDriver

CAPACITY = 1 << 20


class ThreadDriver(DriverBase):
    """One device, one channel, a FIFO run by a worker thread; `cost_cycles` are nanoseconds."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Condition()
        self._t0 = time.monotonic_ns()
        self._models: dict[int, int] = {}
        self._queue: list[tuple[int, int, int, int]] = []  # work id, model, uid, cost
        self._running = -1
        self._events: list[WorkEvent] = []
        self._next = 1
        self._closed = False
        self._worker = threading.Thread(target=self._work, daemon=True)
        self._worker.start()

    def _apply_configs(self, configs: Mapping[int, SchedulingConfig]) -> None:
        pass  # one FIFO: a real runtime would order its queue by these

    @property
    def now_us(self) -> int:
        return (time.monotonic_ns() - self._t0) // 1000

    @property
    def device_count(self) -> int:
        return 1

    def describe_devices(self) -> list[DeviceDescription]:
        return [DeviceDescription(number=0, channels=1, weight_memory_bytes=CAPACITY)]

    def device_state(self, device: int = 0) -> DeviceStatus:
        with self._lock:
            used = sum(self._models.values())
            return DeviceStatus(
                number=0,
                now_us=self.now_us,
                weight_memory_bytes=CAPACITY,
                weight_memory_used_bytes=used,
                sram_used_bytes=0,
                models_loaded=len(self._models),
                queue_depth=len(self._queue),
                running=(self._running,),
                temperature_mc=35_000,
                peak_temperature_mc=35_000,
                severity=ThermalSeverity.NONE,
                throttled_us=0,
                shutdown=False,
            )

    def load_model(self, device: int = 0, *, weight_bytes: int, sram_bytes: int = 0) -> int:
        with self._lock:
            if sum(self._models.values()) + weight_bytes > CAPACITY:
                raise CapacityError(f"{weight_bytes} bytes do not fit")
            handle = self._next
            self._next += 1
            self._models[handle] = weight_bytes
            return handle

    def unload_model(self, model: int) -> None:
        with self._lock:
            del self._models[model]
            for job in [job for job in self._queue if job[1] == model]:
                self._queue.remove(job)
                self._event(EventKind.ENDED, EndReason.CANCELLED_SYSTEM, job)

    def submit(self, model: int, *, uid: int, cost_cycles: int, **_: Any) -> int:
        with self._lock:
            job = (self._next, model, uid, cost_cycles)
            self._next += 1
            self._queue.append(job)
            self._event(EventKind.REQUESTED, NO_REASON, job)
            self._lock.notify()
            return job[0]

    def cancel(self, work_id: int) -> None:
        with self._lock:
            job = next((job for job in self._queue if job[0] == work_id), None)
            if job is None:
                raise UnknownWorkError(f"work {work_id} is not queued")
            self._queue.remove(job)
            self._event(EventKind.ENDED, EndReason.CANCELLED_USER, job)

    def pump(self) -> None:
        with self._lock:
            events, self._events = self._events, []
        self._hand_over(events, self.now_us)

    def run_until_idle(self, max_us: int | None = None) -> int:
        deadline = None if max_us is None else time.monotonic() + max_us / 1e6
        while self._queue or self._running >= 0:
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(0.001)
        self.pump()
        return self.now_us

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()

    def _event(self, kind: int, reason: int, job: tuple[int, int, int, int]) -> None:
        now = self.now_us
        work_id, model, uid, _ = job
        self._events.append(
            WorkEvent(
                kind, reason, work_id, None, uid, 0, uid, None, 0, 0, now // 1000, 0, now, model
            )
        )

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                job = self._queue.pop(0)
                self._running = job[0]
                self._event(EventKind.STARTED, StartReason.INITIAL, job)
            time.sleep(job[3] / 1e9)  # a real runtime runs the inference here
            with self._lock:
                self._running = -1
                self._event(EventKind.ENDED, EndReason.COMPLETED, job)


def test_a_driver_without_an_engine_satisfies_the_protocol_and_claims_no_extra() -> None:
    driver = ThreadDriver()
    try:
        assert isinstance(driver, Driver)
        assert not isinstance(driver, VirtualClock | RealClock | ThermalModel)
        assert isinstance(ReferenceDriver(), Driver | VirtualClock | ThermalModel)
        assert SimulatedDriver is EngineDriver
    finally:
        driver.close()


class Loads(ModelLoadRequestCallback):
    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.models: list[Any] = []
        self.granted = threading.Event()

    def on_can_load_model(self, request: ModelLoadRequest, status: Any, listener: Any) -> None:
        if status == ModelLoadStatus.CAN_LOAD_NOW:
            self.models.append(self.manager.load_model(request, weight_bytes=1 << 10))
            listener.notify_model_loaded(request)
            self.granted.set()


def test_a_real_time_service_runs_on_it_polling_a_driver_with_no_file_descriptor() -> None:
    with Service(ThreadDriver(), "status_quo", clock="real") as svc:
        ended: list[WorkEvent] = []
        svc.add_listener(
            lambda events: ended.extend(e for e in events if e.kind == EventKind.ENDED)
        )
        app = svc.manager(10001, uses_feature=True)
        assert app.backend is svc.backend
        loads = Loads(app)
        app.request_can_load_model(ModelLoadRequest.Builder(1).build(), loads)
        assert loads.granted.wait(WAIT_S)
        work = loads.models[0].submit(1_000_000)
        deadline = time.monotonic() + WAIT_S
        while not ended and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [(e.id, e.reason) for e in ended] == [(work, EndReason.COMPLETED)]
        assert svc.snapshot()["devices"][0]["weight_memory_used_bytes"] == 1 << 10
        with pytest.raises(IllegalArgumentError, match="has no thermal model"):
            svc.add_heat(0, 1000)


def test_a_virtual_clock_needs_a_driver_with_one() -> None:
    with pytest.raises(IllegalArgumentError, match="virtual clock needs a driver with advance"):
        Service(ThreadDriver(), clock="virtual")


class NotADriverPlugin:
    """A plugin whose driver factory builds something that is no driver."""

    @staticmethod
    @hookimpl
    def npumanager_register_drivers() -> list[DriverRecord]:
        return [
            DriverRecord(
                name="not-a-driver",
                factory=lambda *args, **kwargs: object(),
                capabilities=frozenset({DriverCapability.VIRTUAL_TIME}),
            )
        ]


def test_a_driver_plugin_that_builds_no_driver_is_refused_naming_what_is_missing() -> None:
    registry = load_plugins()
    assert registry.register(NotADriverPlugin(), PluginSource("bad", "bad-dist", "1.0"))
    with pytest.raises(IllegalArgumentError, match="not a Driver: it lacks set_scheduling_configs"):
        Service("not-a-driver", clock="virtual", registry=registry)
