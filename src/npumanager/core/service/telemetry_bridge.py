"""What the service tells its sinks and listeners: requests' steps, work events, device health.

The bridge owns the service's `TelemetryHub`, its listeners, its health sampler and the
health sources' latest readings (`health`, a `HealthBoard`). It reads the driver (clock,
device readings) and never calls the arbiter: a change of a device's thermal severity,
the driver's and the sources' combined, is handed back to the service, which tells the
arbiter. Every method but the sink bookkeeping runs under the service lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from npumanager.core.arbiter.actions import RequestAction, RequestKey
from npumanager.core.driver.contract import Driver
from npumanager.core.driver.events import WorkEvent
from npumanager.core.plugins.health import HealthBoard
from npumanager.core.plugins.registry import PluginRegistry
from npumanager.errors import IllegalArgumentError
from npumanager.schemas import ModelLoadRequest, ThermalSeverity, UnloadReason
from npumanager.schemas.device import DeviceStatus
from npumanager.schemas.limits import HEALTH_SAMPLE_INTERVAL_MS, SINK_CLOSE_TIMEOUT_S
from npumanager.telemetry import ModelLoadState, SinkHandle, SinkStats, TelemetryHub
from npumanager.telemetry.health import HealthSampler
from npumanager.telemetry.model_events import from_action, requested, state_changed

log = logging.getLogger(__name__)

EventListener = Callable[[Sequence[WorkEvent]], None]


class TelemetryBridge:
    """The service's telemetry: sinks through a hub, raw-event listeners, health samples."""

    def __init__(
        self, driver: Driver, *, threaded: bool, health_interval_ms: int = HEALTH_SAMPLE_INTERVAL_MS
    ) -> None:
        self._driver = driver
        self.hub = TelemetryHub(threaded=threaded, close_timeout_s=SINK_CLOSE_TIMEOUT_S)
        self._sampler = HealthSampler(health_interval_ms * 1000)
        self._listeners: list[EventListener] = []
        self._severity: dict[int, ThermalSeverity] = {}
        self.health = HealthBoard()
        self.memory_pressure = 0
        """The memory level in force (the service keeps it), stamped on every sample."""

    # Sinks and listeners ----------------------------------------------------------------

    def add_listener(self, listener: EventListener) -> None:
        """Receive every raw work event, in batches."""
        self._listeners.append(listener)

    @staticmethod
    def build_sink(registry: PluginRegistry, sink: Any, options: dict[str, Any]) -> tuple[str, Any]:
        """The sink's name and object: a registered name built with `options`, or an object."""
        if isinstance(sink, str):
            factory = registry.sink(sink).factory
            try:
                return sink, factory(**options)
            except TypeError as exc:
                raise IllegalArgumentError(f"sink {sink!r}: {exc}") from None
        if options:
            raise IllegalArgumentError(
                f"options ({', '.join(sorted(options))}) are for a sink given by name; "
                "configure a sink object yourself"
            )
        return type(sink).__name__, sink

    def add_sink(self, name: str, sink: Any, debounce_duration_ms: int, queue: int) -> SinkHandle:
        """Start sending to a built sink."""
        return self.hub.add(
            sink, name=name, debounce_duration_ms=debounce_duration_ms, queue_size=queue
        )

    def remove_sink(self, handle: SinkHandle) -> None:
        """Stop sending to a sink after what it still has coming."""
        self.hub.remove(handle)

    def stats(self) -> dict[str, SinkStats]:
        """Delivered, dropped, failed and queued events of every sink, by name."""
        return self.hub.stats()

    # Events -----------------------------------------------------------------------------

    def now_us(self) -> int:
        """The telemetry clock: the driver's, on which work events are stamped."""
        return self._driver.now_us

    def request_made(
        self, uid: int, key: RequestKey, request: ModelLoadRequest, weight_bytes: int | None
    ) -> None:
        """A client asked to load a model."""
        if self.hub:
            self.hub.publish((requested(uid, key, request, weight_bytes, self.now_us()),))

    def state_changed(
        self,
        uid: int,
        key: RequestKey,
        request: ModelLoadRequest,
        state: ModelLoadState,
        device: int | None,
    ) -> None:
        """A client reported its model loaded or unloaded."""
        if self.hub:
            event = state_changed(uid, key, request, state, device, self.now_us())
            self.hub.publish((event,))

    def revoked(
        self,
        uid: int,
        key: RequestKey,
        request: ModelLoadRequest,
        reason: UnloadReason,
        device: int | None,
    ) -> None:
        """The service took a model back itself, for `reason`."""
        if self.hub:
            event = state_changed(
                uid, key, request, ModelLoadState.REVOKED, device, self.now_us(), int(reason)
            )
            self.hub.publish((event,))

    def action(self, uid: int, action: RequestAction, device: int | None) -> None:
        """The service carried out a decision for a request of `uid`."""
        if self.hub:
            self.hub.publish((from_action(uid, action, device, self.now_us()),))

    def work_events(self, events: Sequence[WorkEvent]) -> None:
        """A batch of raw driver events: to the sinks and to every listener (isolated)."""
        if self.hub:
            self.hub.publish_work(events)
        for listener in self._listeners:
            try:
                listener(events)
            except Exception:
                log.exception("event listener %r raised", listener)

    # Device health ----------------------------------------------------------------------

    def severity(self, state: DeviceStatus) -> ThermalSeverity:
        """A device's severity: the driver's or the health sources', whichever is worse."""
        return max(state.severity, self.health.severity(state.number))

    def sample_devices(self) -> Iterable[tuple[int, ThermalSeverity]]:
        """Read every device (sampling it for the sinks); the devices whose severity changed."""
        changed = []
        for device in range(self._driver.device_count):
            state = self._driver.device_state(device)
            severity = self.severity(state)
            if self.hub:
                self._publish_sample(state, severity)
            if self._severity.get(device, ThermalSeverity.NONE) != severity:
                self._severity[device] = severity
                changed.append((device, severity))
        return changed

    def health_changed(self) -> None:
        """Sample device health for the sinks now (a model came or went)."""
        if self.hub:
            for device in range(self._driver.device_count):
                state = self._driver.device_state(device)
                self._publish_sample(state, self.severity(state))

    def _publish_sample(self, state: DeviceStatus, severity: ThermalSeverity) -> None:
        health = self.health
        hottest = health.hottest_mc(state.number)
        sample = self._sampler.sample(
            state,
            state.now_us,
            severity=int(severity),
            temperature_mc=None if hottest is None else max(hottest, state.temperature_mc),
            memory_pressure=self.memory_pressure,
            readings=health.device_reading(state.number),
        )
        if sample is not None:
            self.hub.publish((sample,))

    def step(self) -> None:
        """Release debounced work events that are due by the driver clock."""
        if self.hub.debouncing:
            self.hub.step(self.now_us())

    def drain(self) -> None:
        """Hand what is queued to the sinks (inline sinks run now)."""
        self.hub.drain()

    def close(self) -> None:
        """Deliver what is left and close every sink."""
        self.hub.close()
