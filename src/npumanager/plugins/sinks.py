"""Built-in telemetry sinks."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from npumanager.core.hookspecs import hookimpl
from npumanager.schemas import SinkRecord


class MemorySink:
    """Keeps every event it is handed, in order; for tests and notebooks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[object] = []
        self.batches = 0
        self.closed = False

    def handle(self, batch: Sequence[object]) -> None:
        """Append one batch of events."""
        with self._lock:
            self._events.extend(batch)
            self.batches += 1

    def close(self) -> None:
        """Mark the sink closed; its events stay readable."""
        self.closed = True

    @property
    def events(self) -> list[object]:
        """A copy of every event received so far."""
        with self._lock:
            return list(self._events)


@hookimpl
def npumanager_register_sinks() -> Iterable[SinkRecord]:
    """The sinks that ship with npu-manager."""
    return [
        SinkRecord(name="memory", factory=MemorySink, description="keeps events in memory"),
    ]
