"""Carrying out the arbiter's decisions: the one place that holds the service lock.

`Decisions` owns the lock, the arbiter, the driver, the request records and the telemetry
bridge. Every arbiter call happens here or in a caller holding `lock`: `act` runs an
input and performs what it returns; driver events, ticks and thermal changes come back
through `on_work_events` and `after_step`. Callbacks are queued under the lock and
scheduled by `flush` once it is released. It is also what the clocks drive
(`clocks.Stepper`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

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


class Decisions:
    """The service's state under its lock, and the carrying out of every decision."""

    def __init__(
        self, clock: Clock, arbiter: Arbiter, driver: Driver, telemetry: TelemetryBridge
    ) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self.arbiter = arbiter
        self.driver = driver
        self.telemetry = telemetry
        self.requests = Requests()
        self.closed = False
        self._completed: dict[int, None] = {}
        self._pending: list[Action] = []
        self._memory_signal = MEMORY_PRESSURE_NONE
        """The level `Service.set_memory_pressure` gave; the health sources' may be higher."""

    @property
    def now_ms(self) -> int:
        """The service clock, in milliseconds: the driver's in virtual time, else monotonic."""
        if self.clock == "virtual":
            return self.driver.now_us // 1000
        return time.monotonic_ns() // 1_000_000

    def check_open(self) -> None:
        """`IllegalArgumentError` once the service is closed."""
        if self.closed:
            raise IllegalArgumentError("the service is closed")

    def act(self, step: Callable[[int], list[Action]]) -> None:
        """Run one arbiter input under the lock, perform its actions, then flush."""
        with self.lock:
            self.check_open()
            self.perform(step(self.now_ms))
        self.flush()

    def perform(self, actions: Iterable[Action]) -> None:
        """Carry out driver-side actions now and queue deliveries (lock held)."""
        requests = self.requests
        for action in actions:
            if isinstance(action, RelayConfigs):
                if action.replace_all:
                    self.driver.set_scheduling_configs(action.configs)
                else:
                    self.driver.update_scheduling_configs(action.configs)
                continue
            record = requests.get(action.key)
            if record is None:
                log.warning("action for a request the service does not know: %r", action)
                continue
            if isinstance(action, CanLoad) and action.device is not None:
                record.device = action.device
            self.telemetry.action(record.manager.uid, action, record.device)
            if isinstance(action, CanLoad):
                requests.deliver(record, record.decided(action.status))
            elif isinstance(action, RequestUnload):
                requests.deliver(record, record.unload_asked(action.reason))
            elif isinstance(action, Revoke):
                self.unload_models(action.key)
            elif isinstance(action, Complete):
                self.unload_models(action.key)
                requests.remove(action.key)
                requests.deliver(record, record.completed(action.status))

    def flush(self) -> None:
        """Schedule the queues that got deliveries (lock not held), then drain the sinks."""
        while True:
            with self.lock:
                queues = self.requests.take_queues()
            if not queues:
                self.telemetry.drain()
                return
            for queue in queues:
                queue.schedule()

    def unload_models(self, key: RequestKey) -> None:
        """Take a request's models off the device (lock held)."""
        record = self.requests.get(key)
        if record is None or not record.models:
            return
        for model in record.models:
            self.driver.unload_model(model.handle)
        record.models.clear()
        self.telemetry.health_changed()

    def state_changed(self, key: RequestKey, state: ModelLoadState) -> None:
        """Tell the sinks a client reported its model loaded or unloaded (lock held)."""
        record = self.requests.get(key)
        if record is not None:
            uid = record.manager.uid
            self.telemetry.state_changed(uid, key, record.request, state, record.device)

    # Driver events and time (lock held) ----------------------------------------------------

    def on_work_events(self, events: Sequence[WorkEvent]) -> None:
        """The driver's raw events: telemetry, work ownership, completions for the arbiter."""
        self.telemetry.work_events(events)
        work_ended, completed = self.requests.work_ended, self._completed
        for event in events:
            if event.kind == _ENDED and event.reason != _PAUSED:
                work_ended(event.id)
                if event.reason == _COMPLETED:
                    completed[event.original_uid] = None
        if self._completed:
            now = self.now_ms
            uids, self._completed = list(self._completed), {}
            for uid in uids:
                self._pending.extend(self.arbiter.work_ended(now, uid, EndReason.COMPLETED))

    def sample_devices(self) -> None:
        """Read device health; a changed thermal severity goes to the arbiter."""
        for device, severity in self.telemetry.sample_devices():
            self.perform(self.arbiter.set_thermal(self.now_ms, device, severity))

    # Memory pressure and the health sources ----------------------------------------------

    def signal_memory(self, now_ms: int, level: int) -> list[Action]:
        """The service owner's memory level; the arbiter gets it or the sources', if higher."""
        self._memory_signal = check_int(
            "memory pressure level", level, MEMORY_PRESSURE_NONE, MEMORY_PRESSURE_CRITICAL
        )
        return self._memory_actions(now_ms)

    def _memory_actions(self, now_ms: int) -> list[Action]:
        level = max(self._memory_signal, self.telemetry.health.memory_pressure())
        self.telemetry.memory_pressure = level
        return self.arbiter.set_memory_pressure(now_ms, level)

    def health_read(
        self, state: SourceState, sample: HealthSample | None, error: str | None
    ) -> None:
        """A health source's reading (or its problem): combined, and acted on if it changed."""
        with self.lock:
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
        self.perform(self.arbiter.tick(self.now_ms))
        self.telemetry.step()

    def next_deadline_ms(self) -> int | None:
        """When the arbiter next has something to do (lock held)."""
        return self.arbiter.next_deadline_ms()
