"""The platform's debouncing of work events, one piece of code around any driver.

Per uid, with a window of W milliseconds:

- REQUESTED and STARTED are suppressed while the uid is running work (started, not
  ended) or holds an ended event from within the window;
- ENDED is held, replacing any ended event held before, and sent once the uid has been
  idle (nothing running) for W after it; new work inside the window cancels the wait.

So a model run back to back gives one STARTED and, W after the last run, one ENDED.
A window of 0 passes every event through untouched.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from npumanager.core.events import EventKind, WorkEvent

_US_PER_MS = 1000


@dataclass
class _UidState:
    running: set[int] = field(default_factory=set)
    held: WorkEvent | None = None
    due_us: int | None = None


class Debouncer:
    """Filters a stream of raw events into what the callback should be told, and when."""

    def __init__(self, window_ms: int) -> None:
        if window_ms < 0:
            raise ValueError(f"debounce_duration_ms must be >= 0; got {window_ms}")
        self.window_ms = window_ms
        self._window_us = window_ms * _US_PER_MS
        self._uids: dict[int, _UidState] = {}
        self._due: list[tuple[int, int]] = []
        """Heap of (due time, uid); entries whose uid no longer has that due are stale."""

    @property
    def passthrough(self) -> bool:
        """True when the window is 0 and events pass untouched."""
        return self._window_us == 0

    def feed(self, events: Iterable[WorkEvent]) -> list[WorkEvent]:
        """The events to deliver now, given raw events in time order."""
        if self.passthrough:
            return list(events)
        out: list[WorkEvent] = []
        for event in events:
            if self._due and self._due[0][0] <= event.time_us:
                out.extend(self.flush_due(event.time_us))
            self._one(event, out)
        return out

    def _one(self, event: WorkEvent, out: list[WorkEvent]) -> None:
        state = self._uids.get(event.uid)
        if state is None:
            state = self._uids[event.uid] = _UidState()
        quiet = not state.running and state.held is None
        if event.kind == EventKind.REQUESTED:
            if quiet:
                out.append(event)
        elif event.kind == EventKind.STARTED:
            if quiet:
                out.append(event)
            state.running.add(event.id)
            state.due_us = None
        else:
            state.running.discard(event.id)
            state.held = event
            if state.running:
                state.due_us = None
            else:
                state.due_us = event.time_us + self._window_us
                heapq.heappush(self._due, (state.due_us, event.uid))

    def flush_due(self, now_us: int) -> list[WorkEvent]:
        """Held ENDED events whose uid has been idle for the whole window by `now_us`."""
        out: list[WorkEvent] = []
        while self._due and self._due[0][0] <= now_us:
            due, uid = heapq.heappop(self._due)
            state = self._uids.get(uid)
            if state is None or state.due_us != due or state.held is None:
                continue
            out.append(state.held)
            state.held = None
            state.due_us = None
            if not state.running:
                del self._uids[uid]
        return out

    def next_due_us(self) -> int | None:
        """When the next held event falls due, if any (stale heap entries dropped)."""
        while self._due:
            due, uid = self._due[0]
            state = self._uids.get(uid)
            if state is not None and state.due_us == due and state.held is not None:
                return due
            heapq.heappop(self._due)
        return None

    def flush_all(self) -> list[WorkEvent]:
        """Every held event, at once (the callback is being replaced or the driver closed)."""
        held = [s.held for s in self._uids.values() if s.held is not None]
        held.sort(key=lambda e: (e.time_us, e.id))
        self._uids.clear()
        self._due.clear()
        return held
