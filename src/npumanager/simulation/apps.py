"""The apps of a scenario as a run plays them: their jobs and numbers, and as service clients.

`AppRun` is one app's life in either run (model loaded or not, jobs in flight, frames,
misses, latencies); `ManagedApp` is the well-behaved client the managed run makes of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.schemas import (
    EndReason,
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    UnloadReason,
)
from npumanager.simulation.results import MS_US
from npumanager.simulation.scenario import App


class AppRun:
    """One app's life in a run: its model, its jobs, its numbers."""

    def __init__(self, app: App, clock_mhz: int) -> None:
        self.app = app
        self.key = f"app {app.name!r}"
        """How an error names the app."""
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


def route(runs: Sequence[AppRun], event: WorkEvent, t: int) -> None:
    """Hand a job's end to the app whose uid ran it (pauses are not ends)."""
    if event.kind != EventKind.ENDED or event.reason == EndReason.PAUSED:
        return
    for run in runs:
        if event.uid == run.app.uid:
            run.ended(event, t)
            return


class ManagedApp:
    """A well-behaved client: loads when told, unloads when asked, asks again later."""

    def __init__(
        self,
        run: AppRun,
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
