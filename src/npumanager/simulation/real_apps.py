"""The apps of `demo --real` at work on the wall clock, each on a thread of its own.

A scenario app's work becomes real inferences: *periodic* (the camera) runs one inference
every `period_ms` and times it against its deadline; *loop* keeps `burst` inferences in
flight back to back; *burst* submits `burst` inferences every `period_ms` and waits for
them. How an inference is run (a driver of the app's own, or a model under the manager)
is the caller's: `run()` returns the outputs, `submit()` a future of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import Any, Protocol

from npumanager.errors import NpuManagerError
from npumanager.simulation.scenario import App

WAIT_S = 0.05
"""How often a waiting app looks whether the run is over."""


class Pending(Protocol):
    """A submitted inference: its outputs later, or cancelled."""

    def result(self, timeout: float | None = None) -> Any: ...

    def cancel(self) -> bool: ...


@dataclass
class AppScore:
    """What one app did in a run."""

    done: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    misses: int = 0
    error: str | None = None
    """Why the app stopped early or never ran (its model was taken back, never granted)."""
    unloads: list[str] = field(default_factory=list)
    """Why the service asked for the app's model back, each time it did (and got it)."""
    unloaded_s: list[float] = field(default_factory=list)
    """When (seconds into the run) each of those requests came."""
    asked_s: float | None = None
    """Managed: when the app first asked for its model."""
    granted_s: list[float] = field(default_factory=list)
    """Managed: when it was granted its model, each time."""
    start_s: float | None = None
    """When it started (its scaled `start_ms`); a managed app then asks for its model."""
    submitted: int = 0
    """Inferences it submitted (or ran)."""
    started: int = 0
    """Times the driver reported one of its inferences started (a restart counts again)."""
    preempted: int = 0
    """Times the driver stopped one of its running inferences for more important work."""


@dataclass(frozen=True)
class Runner:
    """How one app reaches its model: a blocking `run` and a `submit` of a future."""

    run: Callable[[], Any]
    submit: Callable[[], Pending]


def play(app: App, runner: Runner, stop: threading.Event, score: AppScore) -> None:
    """Do the app's work until `stop` is set; a manager error ends it, noted in `score`."""
    work = app.work
    try:
        if work.kind == "periodic":
            _periodic(runner.run, work.period_ms / 1000, work.deadline_ms, stop, score)
        elif work.kind == "loop":
            _loop(runner.submit, work.burst, stop, score)
        else:
            _bursts(runner.submit, work.burst, work.period_ms / 1000, stop, score)
    except (NpuManagerError, CancelledError) as exc:
        score.error = str(exc) or type(exc).__name__


def _periodic(
    run: Callable[[], Any],
    period_s: float,
    deadline_ms: int | None,
    stop: threading.Event,
    score: AppScore,
) -> None:
    next_at = time.perf_counter()
    while not stop.wait(max(0.0, next_at - time.perf_counter())):
        start = time.perf_counter()
        score.submitted += 1
        run()
        latency = (time.perf_counter() - start) * 1000
        score.latencies_ms.append(latency)
        score.done += 1
        if deadline_ms is not None and latency > deadline_ms:
            score.misses += 1
        # a frame that ran late is not made up for: the next comes a period on
        next_at = max(next_at + period_s, time.perf_counter() - period_s)


def _wait(pending: Pending, stop: threading.Event) -> bool:
    """True once `pending` completed; False if the run ended first."""
    while not stop.is_set():
        try:
            pending.result(timeout=WAIT_S)
        except TimeoutError:
            continue
        return True
    return False


def _loop(
    submit: Callable[[], Pending], burst: int, stop: threading.Event, score: AppScore
) -> None:
    pending = [submit() for _ in range(burst)]
    score.submitted += burst
    try:
        while _wait(pending[0], stop):
            pending.pop(0)
            score.done += 1
            pending.append(submit())
            score.submitted += 1
    finally:
        for handle in pending:
            handle.cancel()


def _bursts(
    submit: Callable[[], Pending],
    burst: int,
    period_s: float,
    stop: threading.Event,
    score: AppScore,
) -> None:
    next_at = time.perf_counter()
    while not stop.wait(max(0.0, next_at - time.perf_counter())):
        pending = [submit() for _ in range(burst)]
        score.submitted += burst
        try:
            while pending and _wait(pending[0], stop):
                pending.pop(0)
                score.done += 1
        finally:
            for handle in pending:
                handle.cancel()
        next_at = max(next_at + period_s, time.perf_counter())
