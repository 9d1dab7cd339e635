"""Play a scenario twice: *direct* (every app loads and submits straight to the driver, as
before the NPU manager) and *managed* (through the service and its policy).

Both runs step virtual time a millisecond at a time and measure the same things: camera
frames and deadline misses, background throughput, loads that would not fit (each would
wake the low-memory killer), memory and temperature peaks, throttled time, unload requests.
Either run can feed telemetry sinks (`sinks=`): the managed run through the service, the
direct run through a hub of its own, both inline at every millisecond, so nothing is lost.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from npumanager.core.events import EventKind, WorkEvent
from npumanager.core.plugins import PluginRegistry, load_plugins
from npumanager.errors import CapacityError
from npumanager.schemas import (
    EndReason,
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    UnloadReason,
)
from npumanager.schemas.device import DeviceStatus
from npumanager.schemas.limits import (
    DEFAULT_SINK_QUEUE_EVENTS,
    HEALTH_SAMPLE_INTERVAL_MS,
    SINK_CLOSE_TIMEOUT_S,
)
from npumanager.simulation.scenario import App, Scenario
from npumanager.telemetry import NO_VALUE, ModelLoadState, ModelLoadStateChanged, TelemetryHub
from npumanager.telemetry.health import HealthSampler

MS_US = 1000
Progress = Callable[[int], None]
"""Told the virtual millisecond a run has reached, once a millisecond."""


@dataclass
class RunMetrics:
    """What one run measured; the demo prints these side by side."""

    camera_frames: int = 0
    camera_deadline_misses: int = 0
    camera_p99_ms: float = 0.0
    background_jobs_done: int = 0
    assistant_jobs_done: int = 0
    indexer_jobs_done: int = 0
    overcommit_events: int = 0
    peak_weight_memory_bytes: int = 0
    weight_memory_capacity_bytes: int = 0
    peak_temperature_c: float = 0.0
    throttled_ms: float = 0.0
    unload_requests: dict[str, int] = field(default_factory=dict)
    jobs_done: dict[str, int] = field(default_factory=dict)
    """Completed jobs of each app, by name."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(self.__dict__)


@dataclass
class Sample:
    """Device health at one millisecond."""

    t_ms: int
    temperature_mc: int
    weight_memory_used_bytes: int
    severity: int


@dataclass
class RunResult:
    """A run's metrics, its raw event log and its health timeline."""

    mode: str
    metrics: RunMetrics
    events: list[WorkEvent]
    samples: list[Sample]
    unloads: list[tuple[int, str, str]]
    """(time ms, app, reason) of every unload request."""
    load_failures: list[tuple[int, str]] = field(default_factory=list)
    """(time ms, app) of every load that did not fit the device (direct runs)."""
    deadline_misses: list[tuple[int, str]] = field(default_factory=list)
    """(time ms, app) of every camera frame that missed its deadline or had no model."""


class _AppRun:
    """One app's life in a run: its model, its jobs, its numbers."""

    def __init__(self, app: App, clock_mhz: int) -> None:
        self.app = app
        self.cycles = app.work.cost_us * clock_mhz
        self.loaded = False
        self.wants_at: int | None = app.start_ms
        self.in_flight: dict[int, int] = {}
        self.latencies_ms: list[float] = []
        self.misses = 0
        self.missed_at: list[int] = []
        """The millisecond of every miss, for the picture."""
        self.frames = 0
        self.done = 0
        self.submit: Callable[[], int] | None = None
        self.handle: int | None = None
        self.stopped = False

    def stops_at(self, t: int) -> bool:
        """True at the millisecond the app gives its model up for good."""
        return not self.stopped and self.app.stop_ms is not None and t >= self.app.stop_ms

    def stop(self) -> None:
        """No more work and no more requests."""
        self.stopped = True
        self.loaded = False
        self.submit = None
        self.wants_at = None
        self.in_flight.clear()

    def due(self, t: int) -> bool:
        work = self.app.work
        if work.kind == "loop" or t < self.app.start_ms or self.stopped:
            return False
        return (t - self.app.start_ms) % work.period_ms == 0

    def arrive(self, t: int) -> None:
        """Jobs that arrive now (a frame, a burst); a frame with no model is a miss."""
        count = self.app.work.burst
        if self.app.role == "camera":
            self.frames += count
        if not self.loaded or self.submit is None:
            if self.app.role == "camera":
                self.miss(t, count)
            return
        for _ in range(count):
            self.in_flight[self.submit()] = t

    def start_streams(self, t: int) -> None:
        """A loop app keeps `burst` jobs in flight from the moment its model is in."""
        if self.app.work.kind == "loop" and self.submit is not None:
            for _ in range(self.app.work.burst - len(self.in_flight)):
                self.in_flight[self.submit()] = t

    def miss(self, t: int, count: int = 1) -> None:
        """`count` jobs missed their deadline (or their frame) at millisecond `t`."""
        self.misses += count
        self.missed_at.append(t)

    def ended(self, event: WorkEvent, t: int) -> None:
        arrived = self.in_flight.pop(event.id, None)
        if arrived is None:
            return
        latency = (event.time_us - arrived * MS_US) / MS_US
        deadline = self.app.work.deadline_ms
        if event.reason == EndReason.COMPLETED:
            self.done += 1
            self.latencies_ms.append(latency)
            if deadline is not None and latency > deadline:
                self.miss(t)
        elif deadline is not None:
            self.miss(t)
        if self.app.work.kind == "loop" and self.loaded and self.submit is not None:
            self.in_flight[self.submit()] = t


class _Collector:
    """Batch callback and listener that keeps every raw event."""

    def __init__(self) -> None:
        self.events: list[WorkEvent] = []
        self.new: list[WorkEvent] = []

    def on_work_events(self, events: Sequence[WorkEvent]) -> None:
        self.events.extend(events)
        self.new.extend(events)

    def take(self) -> list[WorkEvent]:
        new, self.new = self.new, []
        return new


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def _finish(
    mode: str,
    runs: list[_AppRun],
    collector: _Collector,
    samples: list[Sample],
    unloads: list[tuple[int, str, str]],
    state: Any,
    load_failures: list[tuple[int, str]],
) -> RunResult:
    by_role: dict[str, list[_AppRun]] = {}
    for run in runs:
        by_role.setdefault(run.app.role, []).append(run)
    camera = by_role.get("camera", [])
    metrics = RunMetrics(
        camera_frames=sum(r.frames for r in camera),
        camera_deadline_misses=sum(r.misses for r in camera),
        camera_p99_ms=round(_p99([x for r in camera for x in r.latencies_ms]), 3),
        background_jobs_done=sum(r.done for r in by_role.get("background", [])),
        assistant_jobs_done=sum(r.done for r in by_role.get("assistant", [])),
        indexer_jobs_done=sum(r.done for r in by_role.get("indexer", [])),
        overcommit_events=len(load_failures),
        peak_weight_memory_bytes=max((s.weight_memory_used_bytes for s in samples), default=0),
        weight_memory_capacity_bytes=state.weight_memory_bytes,
        peak_temperature_c=round(max((s.temperature_mc for s in samples), default=0) / 1000, 2),
        throttled_ms=round(state.throttled_us / 1000, 1),
        unload_requests=dict(sorted(Counter(reason for _, _, reason in unloads).items())),
        jobs_done={run.app.name: run.done for run in runs},
    )
    misses = sorted((t, r.app.name) for r in camera for t in r.missed_at)
    return RunResult(mode, metrics, collector.events, samples, unloads, load_failures, misses)


class _DirectTelemetry:
    """What the service does for sinks, for a run without one: inline, every millisecond."""

    def __init__(self, sinks: Sequence[Any], npu: Any) -> None:
        self.hub = TelemetryHub(threaded=False, close_timeout_s=SINK_CLOSE_TIMEOUT_S)
        for sink in sinks:
            self.hub.add(
                sink,
                name=type(sink).__name__,
                debounce_duration_ms=0,
                queue_size=DEFAULT_SINK_QUEUE_EVENTS,
            )
        self.sampler = HealthSampler(HEALTH_SAMPLE_INTERVAL_MS * MS_US)
        self.npu = npu

    def model(self, run: _AppRun, state: ModelLoadState) -> None:
        """A load or unload the app did itself (request id: the app's uid, no client)."""
        if self.hub:
            app = run.app
            event = ModelLoadStateChanged(
                uid=app.uid,
                client=0,
                request_id=app.uid,
                size=app.size_class,
                priority=app.priority,
                state=state,
                unload_reason=NO_VALUE,
                device=app.device,
                time_us=self.npu.now_us,
            )
            self.hub.publish((event,))

    def step(self, events: list[WorkEvent], first: DeviceStatus) -> None:
        """The millisecond is over: its events and health samples (`first`: device 0's) go out."""
        if not self.hub:
            return
        if events:
            self.hub.publish_work(events)
        now_us = first.now_us
        for device in range(self.npu.device_count):
            state = first if device == 0 else self.npu.device_state(device)
            sample = self.sampler.sample(state, now_us)
            if sample is not None:
                self.hub.publish((sample,))
        self.hub.drain()


def run_direct(
    scenario: Scenario,
    driver: str = "vnpu",
    registry: PluginRegistry | None = None,
    *,
    sinks: Sequence[Any] = (),
    progress: Progress | None = None,
) -> RunResult:
    """Every app loads and submits straight to the driver; nobody arbitrates."""
    registry = registry or load_plugins()
    npu = registry.driver(driver).factory(list(scenario.devices))
    collector = _Collector()
    npu.set_callback(collector, debounce_duration_ms=0)
    telemetry = _DirectTelemetry(sinks, npu)
    clock = scenario.devices[0].clock_mhz
    runs = [_AppRun(app, clock) for app in scenario.apps]
    samples: list[Sample] = []
    failures: list[tuple[int, str]] = []
    for t in range(scenario.duration_ms):
        for event in scenario.events:
            if event.at_ms == t and event.kind == "heat":
                npu.add_heat(event.device, event.millicelsius)
        for run in runs:
            if run.stops_at(t):
                if run.handle is not None:
                    npu.unload_model(run.handle)
                    telemetry.model(run, ModelLoadState.UNLOADED)
                run.handle = None
                run.stop()
            if not run.loaded and run.wants_at is not None and t >= run.wants_at:
                try:
                    handle = npu.load_model(run.app.device, weight_bytes=run.app.model_bytes)
                except CapacityError:
                    failures.append((t, run.app.name))
                    run.wants_at = t + run.app.retry_ms
                else:
                    run.loaded, run.wants_at, run.handle = True, None, handle
                    run.submit = _direct_submit(npu, handle, run)
                    telemetry.model(run, ModelLoadState.LOADED)
                    run.start_streams(t)
            if run.due(t):
                run.arrive(t)
        npu.advance(MS_US)
        new = collector.take()
        for work_event in new:
            _route(runs, work_event, t)
        state = npu.device_state(0)
        telemetry.step(new, state)
        samples.append(_sample(state, t))
        if progress is not None:
            progress(t)
    result = _finish("direct", runs, collector, samples, [], npu.device_state(0), failures)
    telemetry.hub.close()
    npu.close()
    return result


def _direct_submit(npu: Any, handle: int, run: _AppRun) -> Callable[[], int]:
    def submit() -> int:
        return int(
            npu.submit(
                handle,
                uid=run.app.uid,
                cost_cycles=run.cycles,
                job_priority=run.app.work.job_priority,
                feature_id=run.app.name,
            )
        )

    return submit


def _route(runs: list[_AppRun], event: WorkEvent, t: int) -> None:
    if event.kind != EventKind.ENDED or event.reason == EndReason.PAUSED:
        return
    for run in runs:
        if event.uid == run.app.uid:
            run.ended(event, t)
            return


def _sample(state: DeviceStatus, t: int) -> Sample:
    return Sample(t, state.temperature_mc, state.weight_memory_used_bytes, int(state.severity))


class _ManagedApp:
    """A well-behaved client: loads when told, unloads when asked, asks again later."""

    def __init__(
        self,
        run: _AppRun,
        manager: Any,
        unloads: list[tuple[int, str, str]],
        now: Callable[[], int],
    ) -> None:
        self.run = run
        self.manager = manager
        self.unloads = unloads
        self.now = now
        self.request: ModelLoadRequest | None = None
        self.next_id = 1
        self.model: Any = None

    def ask(self) -> None:
        app = self.run.app
        self.request = (
            ModelLoadRequest.Builder(self.next_id)
            .set_size(app.size_class)
            .set_priority(app.priority)
            .build()
        )
        self.next_id += 1
        self.run.wants_at = None
        self.manager.request_can_load_model(self.request, self, weight_bytes=app.model_bytes)

    def on_can_load_model(
        self, request: ModelLoadRequest, status: ModelLoadStatus, listener: Any
    ) -> None:
        if status != ModelLoadStatus.CAN_LOAD_NOW or self.run.loaded:
            return
        self.model = self.manager.load_model(request, weight_bytes=self.run.app.model_bytes)
        listener.notify_model_loaded(request)
        self.run.loaded = True
        self.run.submit = lambda: int(
            self.model.submit(
                self.run.cycles,
                job_priority=self.run.app.work.job_priority,
                feature_id=self.run.app.name,
            )
        )
        self.run.start_streams(self.now())

    def on_request_unload_model(
        self, request: ModelLoadRequest, reason: UnloadReason | None = None
    ) -> None:
        label = reason.name if reason is not None else "UNSPECIFIED"
        self.unloads.append((self.now(), self.run.app.name, label))
        self.run.loaded = False
        self.run.submit = None
        self.manager.listener.notify_model_unloaded(request)

    def on_model_load_request_complete(
        self, request: ModelLoadRequest, status: ModelLoadRequestStatus
    ) -> None:
        self.run.loaded = False
        self.run.submit = None
        self.run.in_flight.clear()
        if request == self.request:
            self.request = None
            if not self.run.stopped:
                self.run.wants_at = self.now() + self.run.app.retry_ms

    def stop(self) -> None:
        """Give the model up for good: report it unloaded, or cancel a pending request."""
        loaded, request = self.run.loaded, self.request
        self.run.stop()
        if request is None:
            return
        if loaded:
            self.manager.listener.notify_model_unloaded(request)
        else:
            self.manager.cancel_model_load(request)


def _scenario_events(service: Any, scenario: Scenario, t: int) -> None:
    """What the scenario makes happen at `t` in a managed run."""
    for event in scenario.events:
        if event.at_ms != t:
            continue
        if event.kind == "heat":
            service.add_heat(event.device, event.millicelsius)
        elif event.kind == "memory_pressure":
            service.set_memory_pressure(event.level)
        elif event.importance is not None and event.app is not None:
            service.set_uid_importance(scenario.app(event.app).uid, event.importance)


def run_managed(
    scenario: Scenario,
    driver: str = "vnpu",
    registry: PluginRegistry | None = None,
    *,
    sinks: Sequence[Any] = (),
    progress: Progress | None = None,
) -> RunResult:
    """The same apps as clients of the service, under the scenario's policy."""
    from npumanager.core.service import Service

    registry = registry or load_plugins()
    service = Service(
        driver,
        scenario.policy,
        policy_params=scenario.policy_params or None,
        clock="virtual",
        devices=list(scenario.devices),
        registry=registry,
        sinks=sinks,
    )
    collector = _Collector()
    service.add_listener(collector.on_work_events)
    clock = scenario.devices[0].clock_mhz
    unloads: list[tuple[int, str, str]] = []
    runs = [_AppRun(app, clock) for app in scenario.apps]
    apps = []
    for run in runs:
        service.set_uid_importance(run.app.uid, run.app.importance)
        manager = service.manager(run.app.uid, uses_feature=True)
        apps.append(_ManagedApp(run, manager, unloads, lambda: service.now_ms))
    samples: list[Sample] = []
    for t in range(scenario.duration_ms):
        _scenario_events(service, scenario, t)
        for client in apps:
            run = client.run
            if run.stops_at(t):
                client.stop()
            if client.request is None and run.wants_at is not None and t >= run.wants_at:
                client.ask()
            if run.due(t):
                run.arrive(t)
        service.advance(1)
        for work_event in collector.take():
            _route(runs, work_event, t)
        samples.append(_sample(service.driver.device_state(0), t))
        if progress is not None:
            progress(t)
    result = _finish(
        "managed", runs, collector, samples, unloads, service.driver.device_state(0), []
    )
    service.close()
    return result
