"""The health thread: reads every health source on its interval, or at once when one of its
descriptors (a PSI trigger) fires, validates what it returns and hands it to the service.

Nothing a source does reaches further than its own readings: an exception or an invalid
sample is logged once per distinct problem and counts as no reading from that source.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from npumanager.core.plugins.health import HealthSource, SourceState
from npumanager.schemas import HealthSample
from npumanager.schemas.limits import (
    HEALTH_READ_INTERVAL_MS,
    HEALTH_STOP_TIMEOUT_S,
    MAX_HEALTH_READ_INTERVAL_MS,
    MIN_HEALTH_READ_INTERVAL_MS,
)

log = logging.getLogger(__name__)

_BROKEN = select.POLLERR | select.POLLHUP | select.POLLNVAL
Deliver = Callable[[SourceState, HealthSample | None, str | None], None]
"""Where readings go: the source's state, its sample (None after a problem), the problem."""


@dataclass
class _Entry:
    state: SourceState
    source: HealthSource
    interval_s: float
    due: float = 0.0
    last_problem: str | None = None
    muted: set[int] = field(default_factory=set)
    """Descriptors that reported an error and are polled no more while the source keeps them."""


def _interval_s(source: HealthSource) -> float:
    value = getattr(source, "interval_ms", HEALTH_READ_INTERVAL_MS)
    if isinstance(value, bool) or not isinstance(value, int):
        value = HEALTH_READ_INTERVAL_MS
    ms = min(max(value, MIN_HEALTH_READ_INTERVAL_MS), MAX_HEALTH_READ_INTERVAL_MS)
    return ms / 1000


def read_once(source: HealthSource) -> HealthSample:
    """One validated reading of a source (exceptions and invalid samples propagate)."""
    raw = source.read()
    if isinstance(raw, HealthSample):
        return raw
    return HealthSample.model_validate(raw)


def describe_problem(exc: Exception) -> str:
    """A one-line account of what a source's read did wrong."""
    if isinstance(exc, ValidationError):
        detail = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()
        )
        return f"invalid sample: {detail}"
    return f"{type(exc).__name__}: {exc}"


class HealthMonitor:
    """One thread for every health source of a service, started with the first."""

    def __init__(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self._entries: list[_Entry] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_r = self._wake_w = -1
        self._thread: threading.Thread | None = None

    def add(self, state: SourceState, source: HealthSource) -> None:
        """Read this source too (from now on, on the health thread)."""
        with self._lock:
            self._entries.append(_Entry(state, source, _interval_s(source)))
            if self._thread is None:
                self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
                self._thread = threading.Thread(target=self._run, name="npu-health", daemon=True)
                self._thread.start()
        self._wake()

    def _wake(self) -> None:
        if self._wake_w < 0:
            return
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def stop(self) -> None:
        """Stop the thread, then close every source that has `close()`; idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=HEALTH_STOP_TIMEOUT_S)
        for entry in self._entries:
            close = getattr(entry.source, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    log.exception("health source %s failed to close", entry.state.name)
        if self._wake_r >= 0:
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                entries = list(self._entries)
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            owners: dict[int, _Entry] = {}
            for entry in entries:
                for fd, mask in self._descriptors(entry).items():
                    owners[fd] = entry
                    poller.register(fd, mask)
            now = time.monotonic()
            wait = min((e.due - now for e in entries), default=3600.0)
            for fd, events in poller.poll(max(0, int(wait * 1000) + 1)):
                if fd == self._wake_r:
                    while True:
                        try:
                            os.read(self._wake_r, 512)
                        except BlockingIOError:
                            break
                elif fd in owners:
                    self._ready(owners[fd], fd)
                    if events & _BROKEN:
                        owners[fd].muted.add(fd)
            now = time.monotonic()
            for entry in entries:
                if entry.due <= now and not self._stop.is_set():
                    self._read(entry)
                    entry.due = time.monotonic() + entry.interval_s

    def _descriptors(self, entry: _Entry) -> dict[int, int]:
        method = getattr(entry.source, "descriptors", None)
        if not callable(method):
            return {}
        try:
            wanted = {int(fd): int(mask) for fd, mask in dict(method()).items()}
        except Exception as exc:
            self._problem(entry, f"descriptors() raised {describe_problem(exc)}")
            return {}
        entry.muted &= set(wanted)
        for fd in entry.muted:
            self._problem(entry, f"descriptor {fd} reports an error; it is polled no more")
        return {fd: mask for fd, mask in wanted.items() if fd not in entry.muted}

    def _ready(self, entry: _Entry, fd: int) -> None:
        entry.due = 0.0
        method = getattr(entry.source, "ready", None)
        if callable(method):
            try:
                method(fd)
            except Exception as exc:
                self._problem(entry, f"ready() raised {describe_problem(exc)}")

    def _read(self, entry: _Entry) -> None:
        try:
            sample = read_once(entry.source)
        except Exception as exc:
            problem = describe_problem(exc)
            self._problem(entry, problem)
            self._deliver(entry.state, None, problem)
            return
        entry.last_problem = None
        self._deliver(entry.state, sample, None)

    def _problem(self, entry: _Entry, problem: str) -> None:
        if problem != entry.last_problem:
            log.warning("health source %s: %s", entry.state.name, problem)
        entry.last_problem = problem
