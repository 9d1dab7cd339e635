"""The direct run: every app loads and submits straight to the driver, as before the manager.

Nobody arbitrates: a load that does not fit is counted (on a phone it would wake the
low-memory killer) and tried again after the app's `retry_ms`. Sinks get what the service
would give them, through a hub of the run's own, inline at every millisecond.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from npumanager.core.driver.events import WorkEvent
from npumanager.core.plugins.registry import PluginRegistry, load_plugins
from npumanager.errors import CapacityError, NpuManagerError
from npumanager.schemas.device import DeviceStatus
from npumanager.schemas.limits import (
    DEFAULT_SINK_QUEUE_EVENTS,
    HEALTH_SAMPLE_INTERVAL_MS,
    SINK_CLOSE_TIMEOUT_S,
)
from npumanager.simulation.apps import AppRun, route
from npumanager.simulation.results import (
    MS_US,
    Collector,
    Progress,
    RunResult,
    Sample,
    finish,
    sample,
)
from npumanager.simulation.scenario import Scenario, ScenarioRunError
from npumanager.telemetry import NO_VALUE, ModelLoadState, ModelLoadStateChanged, TelemetryHub
from npumanager.telemetry.health import HealthSampler


class DirectTelemetry:
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

    def model(self, run: AppRun, state: ModelLoadState) -> None:
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
            reading = self.sampler.sample(state, now_us)
            if reading is not None:
                self.hub.publish((reading,))
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
    where = "devices"
    try:
        npu = registry.driver(driver).factory(list(scenario.devices))
    except NpuManagerError as exc:
        raise ScenarioRunError.at(where, exc) from None
    collector = Collector()
    npu.set_callback(collector, debounce_duration_ms=0)
    telemetry = DirectTelemetry(sinks, npu)
    clock = scenario.devices[0].clock_mhz
    runs = [AppRun(app, clock) for app in scenario.apps]
    samples: list[Sample] = []
    failures: list[tuple[int, str]] = []
    try:
        for t in range(scenario.duration_ms):
            for index, event in enumerate(scenario.events):
                if event.at_ms == t and event.kind == "heat":
                    where = scenario.event_key(index)
                    npu.add_heat(event.device, event.millicelsius)
            for run in runs:
                where = run.key
                _step_app(npu, run, t, failures, telemetry)
            where = ""
            npu.advance(MS_US)
            new = collector.take()
            for work_event in new:
                route(runs, work_event, t)
            state = npu.device_state(0)
            telemetry.step(new, state)
            samples.append(sample(state, t))
            if progress is not None:
                progress(t)
    except NpuManagerError as exc:
        telemetry.hub.close()
        npu.close()
        raise ScenarioRunError.at(where, exc) from None
    result = finish("direct", runs, collector, samples, [], npu.device_state(0), failures)
    telemetry.hub.close()
    npu.close()
    return result


def _step_app(
    npu: Any, run: AppRun, t: int, failures: list[tuple[int, str]], telemetry: DirectTelemetry
) -> None:
    """One app's millisecond: it stops, loads (a load that does not fit is noted), submits."""
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


def _direct_submit(npu: Any, handle: int, run: AppRun) -> Callable[[], int]:
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
