"""What a simulation run measured: the metrics, the raw events and the health timeline.

Both runs (direct and managed) collect their events with a `Collector`, sample device
health every millisecond and turn what the apps counted into a `RunResult` with `finish`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from npumanager.core.driver.events import WorkEvent
from npumanager.schemas.device import DeviceStatus
from npumanager.simulation.scenario import App

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


class Counted(Protocol):
    """What an app counted in a run (`apps.AppRun`), as `finish` reads it."""

    app: App
    frames: int
    misses: int
    done: int
    latencies_ms: list[float]
    missed_at: list[int]


class Collector:
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


def sample(state: DeviceStatus, t: int) -> Sample:
    """Device health at millisecond `t`."""
    return Sample(t, state.temperature_mc, state.weight_memory_used_bytes, int(state.severity))


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def finish(
    mode: str,
    runs: Sequence[Counted],
    collector: Collector,
    samples: list[Sample],
    unloads: list[tuple[int, str, str]],
    state: Any,
    load_failures: list[tuple[int, str]],
) -> RunResult:
    """The run's result from what its apps counted and the device's final state."""
    by_role: dict[str, list[Counted]] = {}
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
