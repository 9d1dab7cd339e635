"""The service's state and the carrying out of the arbiter's decisions: the base of its
one owner, `state.ServiceState`.

`Carrying` holds the lock, the arbiter, the driver, the request records and the telemetry
bridge. `act` runs an arbiter input under the lock and performs what it returns; driver
events, ticks and thermal changes come back through `on_work_events` and `after_step`.
Callbacks are queued under the lock and scheduled by `flush` once it is released. It is
also what the clocks drive (`clocks.Stepper`). Nothing outside the owner's modules
touches what it holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal

from npumanager.checks import check_int
from npumanager.core.arbiter.actions import (
    Action,
    CanLoad,
    Complete,
    RelayConfigs,
    RequestKey,
    RequestUnload,
    Revoke,
)
from npumanager.core.arbiter.arbiter import Arbiter
from npumanager.core.driver.contract import Driver
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.core.plugins.health import SourceState
from npumanager.core.service.requests import Requests
from npumanager.core.service.telemetry_bridge import TelemetryBridge
from npumanager.errors import IllegalArgumentError
from npumanager.schemas import EndReason, HealthSample
from npumanager.schemas.limits import MEMORY_PRESSURE_CRITICAL, MEMORY_PRESSURE_NONE
from npumanager.telemetry import ModelLoadState

log = logging.getLogger(__name__)

Clock = Literal["real", "virtual"]
_ENDED, _PAUSED, _COMPLETED = int(EventKind.ENDED), int(EndReason.PAUSED), int(EndReason.COMPLETED)
"""What `on_work_events` compares each event with, as plain ints (an enum member's look-up
is not free, per event)."""


class Carrying:
    """The service's state under its lock, and the carrying out of every decision."""

    def __init__(
        self, clock: Clock, arbiter: Arbiter, driver: Driver, telemetry: TelemetryBridge
    ) -> None:
        self.clock = clock
        self._lock = threading.RLock()
        self._arbiter = arbiter
        self._driver = driver
        self._telemetry = telemetry
        self._records = Requests()
        self.closed = False
        self._completed: dict[int, None] = {}
        self._pending: list[Action] = []
        self._memory_signal = MEMORY_PRESSURE_NONE
        """The level `Service.set_memory_pressure` gave; the health sources' may be higher."""
        self.outside_bytes: tuple[int, ...] = (0,) * driver.device_count
        """Device memory held outside the manager, for every device (`count_outside_memory`)."""

    def locked(self) -> AbstractContextManager[Any]:
        """The service lock, for the owner's clocks (`clocks`) alone."""
        return self._lock

    @property
    def now_ms(self) -> int:
        """The service clock, in milliseconds: the driver's in virtual time, else monotonic."""
        if self.clock == "virtual":
            return self._driver.now_us // 1000
        return time.monotonic_ns() // 1_000_000

    def check_open(self) -> None:
        """`IllegalArgumentError` once the service is closed."""
        if self.closed:
            raise IllegalArgumentError("the service is closed")

    def act(self, step: Callable[[int], list[Action]]) -> None:
        """Run one arbiter input under the lock, perform its actions, then flush."""
        with self._lock:
            self.check_open()
            self.perform(step(self.now_ms))
        self.flush()

    def perform(self, actions: Iterable[Action]) -> None:
        """Carry out driver-side actions now and queue deliveries (lock held)."""
        records = self._records
        for action in actions:
            if isinstance(action, RelayConfigs):
                if action.replace_all:
                    self._driver.set_scheduling_configs(action.configs)
                else:
                    self._driver.update_scheduling_configs(action.configs)
                continue
            record = records.get(action.key)
            if record is None:
                log.warning("action for a request the service does not know: %r", action)
                continue
            if isinstance(action, CanLoad) and action.device is not None:
                record.device = action.device
            self._telemetry.action(record.manager.uid, action, record.device)
            if isinstance(action, CanLoad):
                records.deliver(record, record.decided(action.status))
            elif isinstance(action, RequestUnload):
                records.deliver(record, record.unload_asked(action.reason))
            elif isinstance(action, Revoke):
                self.unload_models(action.key)
            elif isinstance(action, Complete):
                self.unload_models(action.key)
                records.remove(action.key)
                records.deliver(record, record.completed(action.status))

    def flush(self) -> None:
        """Schedule the queues that got deliveries (lock not held), then drain the sinks."""
        while True:
            with self._lock:
                queues = self._records.take_queues()
            if not queues:
                self._telemetry.drain()
                return
            for queue in queues:
                queue.schedule()

    def unload_models(self, key: RequestKey) -> None:
        """Take a request's models off the device (lock held)."""
        record = self._records.get(key)
        if record is None or not record.models:
            return
        for model in record.models:
            self._driver.unload_model(model.handle)
        self._records.drop_models(record)
        self._telemetry.health_changed()

    def state_changed(self, key: RequestKey, state: ModelLoadState) -> None:
        """Tell the sinks a client reported its model loaded or unloaded (lock held)."""
        record = self._records.get(key)
        if record is not None:
            uid = record.manager.uid
            self._telemetry.state_changed(uid, key, record.request, state, record.device)

    # Driver events and time (lock held) ----------------------------------------------------

    def driver_events(self, events: Sequence[WorkEvent]) -> None:
        """The driver's batch callback: its raw events, taken under the lock."""
        with self._lock:
            self.on_work_events(events)

    def on_work_events(self, events: Sequence[WorkEvent]) -> None:
        """The driver's raw events: telemetry, work ownership, completions for the arbiter."""
        self._telemetry.work_events(events)
        work_ended, completed = self._records.work_ended, self._completed
        for event in events:
            if event.kind == _ENDED and event.reason != _PAUSED:
                work_ended(event.id)
                if event.reason == _COMPLETED:
                    completed[event.original_uid] = None
        if self._completed:
            now = self.now_ms
            uids, self._completed = list(self._completed), {}
            for uid in uids:
                self._pending.extend(self._arbiter.work_ended(now, uid, EndReason.COMPLETED))

    def sample_devices(self) -> None:
        """Read device health; a changed thermal severity goes to the arbiter."""
        for device, severity in self._telemetry.sample_devices():
            self.perform(self._arbiter.set_thermal(self.now_ms, device, severity))

    # Device memory held outside the manager ---------------------------------------------

    def capacities(self) -> list[int]:
        """Each device's weight memory the arbiter may grant: the driver's, less what is held
        outside the manager (lock held)."""
        devices = self._driver.describe_devices()
        return [
            max(0, device.weight_memory_bytes - held)
            for device, held in zip(devices, self.outside_bytes, strict=True)
        ]

    def count_outside_memory(self, held_bytes: Sequence[int]) -> None:
        """Memory that processes outside the manager hold on each device (device 0 first;
        devices not listed hold none): the arbiter grants only what is left, and asks for
        unloads if what is loaded no longer fits."""
        if isinstance(held_bytes, str | bytes) or not isinstance(held_bytes, Sequence):
            raise IllegalArgumentError(
                f"memory held outside must be a sequence of ints; got {held_bytes!r}"
            )
        with self._lock:
            count = self._driver.device_count
            if len(held_bytes) > count:
                raise IllegalArgumentError(
                    f"memory held outside lists {len(held_bytes)} devices; the driver has {count}"
                )
            listed = [
                check_int(f"memory held outside on device {i}", held, 0, 2**63 - 1)
                for i, held in enumerate(held_bytes)
            ]
            self.outside_bytes = (*listed, *(0,) * (count - len(listed)))
        self.act(lambda now: self._arbiter.set_capacity(now, self.capacities()))

    # Memory pressure and the health sources ----------------------------------------------

    def signal_memory(self, now_ms: int, level: int) -> list[Action]:
        """The service owner's memory level; the arbiter gets it or the sources', if higher."""
        self._memory_signal = check_int(
            "memory pressure level", level, MEMORY_PRESSURE_NONE, MEMORY_PRESSURE_CRITICAL
        )
        return self._memory_actions(now_ms)

    def _memory_actions(self, now_ms: int) -> list[Action]:
        level = max(self._memory_signal, self._telemetry.health.memory_pressure())
        self._telemetry.memory_pressure = level
        return self._arbiter.set_memory_pressure(now_ms, level)

    def health_read(
        self, state: SourceState, sample: HealthSample | None, error: str | None
    ) -> None:
        """A health source's reading (or its problem): combined, and acted on if it changed."""
        with self._lock:
            if self.closed:
                return
            state.sample, state.error, state.read_at_ms = sample, error, self.now_ms
            self.perform(self._memory_actions(self.now_ms))
            self.sample_devices()
        self.flush()

    def after_step(self) -> None:
        """The driver moved: completions, health, expired deadlines, debounced telemetry."""
        pending, self._pending = self._pending, []
        self.perform(pending)
        self.sample_devices()
        self.perform(self._arbiter.tick(self.now_ms))
        self._telemetry.step()

    def next_deadline_ms(self) -> int | None:
        """When the arbiter next has something to do (lock held)."""
        return self._arbiter.next_deadline_ms()
