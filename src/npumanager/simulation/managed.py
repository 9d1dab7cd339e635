"""The managed run: the scenario's apps as clients of the service, under its policy.

Each app is a `ManagedApp` (loads when told, unloads when asked, asks again after its
`retry_ms`); the scenario's events become the service's importance, heat and memory
pressure calls at their millisecond.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from npumanager.core.arbiter.policy import build_policy
from npumanager.core.plugins.registry import PluginRegistry, load_plugins
from npumanager.errors import NpuManagerError
from npumanager.simulation.apps import AppRun, ManagedApp, route
from npumanager.simulation.results import Collector, Progress, RunResult, Sample, finish, sample
from npumanager.simulation.scenario import Scenario, ScenarioRunError


def _scenario_events(service: Any, scenario: Scenario, t: int) -> None:
    """What the scenario makes happen at `t` in a managed run; an error names the event."""
    for index, event in enumerate(scenario.events):
        if event.at_ms != t:
            continue
        try:
            if event.kind == "heat":
                service.add_heat(event.device, event.millicelsius)
            elif event.kind == "memory_pressure":
                service.set_memory_pressure(event.level)
            elif event.importance is not None and event.app is not None:
                service.set_uid_importance(scenario.app(event.app).uid, event.importance)
        except NpuManagerError as exc:
            raise ScenarioRunError.at(scenario.event_key(index), exc) from None


def check_policy(scenario: Scenario, registry: PluginRegistry) -> None:
    """The scenario's policy is installed and takes its `policy_params`, or an error naming
    the key (before any run starts)."""
    try:
        record = registry.policy(scenario.policy)
    except NpuManagerError as exc:
        raise ScenarioRunError.at("policy", exc) from None
    try:
        build_policy(record, scenario.policy_params or None)
    except NpuManagerError as exc:
        raise ScenarioRunError.at("policy_params", exc) from None


def run_managed(
    scenario: Scenario,
    driver: str = "vnpu",
    registry: PluginRegistry | None = None,
    *,
    sinks: Sequence[Any] = (),
    progress: Progress | None = None,
) -> RunResult:
    """The same apps as clients of the service, under the scenario's policy."""
    from npumanager.core.service.service import Service

    registry = registry or load_plugins()
    check_policy(scenario, registry)
    try:
        service = Service(
            driver,
            scenario.policy,
            policy_params=scenario.policy_params or None,
            clock="virtual",
            devices=list(scenario.devices),
            registry=registry,
            sinks=sinks,
        )
    except NpuManagerError as exc:
        raise ScenarioRunError.at("devices", exc) from None
    try:
        result = _play(service, scenario, progress)
    finally:
        service.close()
    return result


def _play(service: Any, scenario: Scenario, progress: Progress | None) -> RunResult:
    """Step the service through the scenario; an app's error names the app."""
    collector = Collector()
    service.add_listener(collector.on_work_events)
    clock = scenario.devices[0].clock_mhz
    unloads: list[tuple[int, str, str]] = []
    runs = [AppRun(app, clock) for app in scenario.apps]
    apps = []
    samples: list[Sample] = []
    where = ""
    try:
        for run in runs:
            where = run.key
            service.set_uid_importance(run.app.uid, run.app.importance)
            manager = service.manager(run.app.uid, uses_feature=True)
            apps.append(ManagedApp(run, manager, unloads, lambda: service.now_ms))
        for t in range(scenario.duration_ms):
            _scenario_events(service, scenario, t)
            for client in apps:
                run = client.run
                where = run.key
                if run.stops_at(t):
                    client.stop()
                if client.request is None and run.wants_at is not None and t >= run.wants_at:
                    client.ask()
                if run.due(t):
                    run.arrive(t)
            where = ""
            service.advance(1)
            for work_event in collector.take():
                route(runs, work_event, t)
            samples.append(sample(service.driver.device_state(0), t))
            if progress is not None:
                progress(t)
    except NpuManagerError as exc:
        raise ScenarioRunError.at(where, exc) from None
    return finish("managed", runs, collector, samples, unloads, service.driver.device_state(0), [])
