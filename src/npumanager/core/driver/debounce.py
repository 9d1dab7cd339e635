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

from npumanager.core.driver.events import EventKind, WorkEvent

_US_PER_MS = 1000


@dataclass(slots=True)
class _UidState:
    running: set[int] = field(default_factory=set)
    held: WorkEvent | None = None
    due_us: int | None = None
    queued_us: int | None = None
    """The time of this uid's one entry in the heap, at or before `due_us`."""


class Debouncer:
    """Filters a stream of raw events into what the callback should be told, and when."""

    def __init__(self, window_ms: int) -> None:
        if window_ms < 0:
            raise ValueError(f"debounce_duration_ms must be >= 0; got {window_ms}")
        self.window_ms = window_ms
        self._window_us = window_ms * _US_PER_MS
        self._uids: dict[int, _UidState] = {}
        self._due: list[tuple[int, int]] = []
        """Heap of (time, uid), one entry per uid with a due: pushed when the uid first gets a
        due, moved to the real due when it is reached (so back-to-back runs push rarely)."""

    @property
    def passthrough(self) -> bool:
        """True when the window is 0 and events pass untouched."""
        return self._window_us == 0

    def feed(self, events: Iterable[WorkEvent]) -> list[WorkEvent]:
        """The events to deliver now, given raw events in time order."""
        if self.passthrough:
            return list(events)
        out: list[WorkEvent] = []
        append = out.append
        uids = self._uids
        due = self._due
        window = self._window_us
        ended = EventKind.ENDED
        started = EventKind.STARTED
        for event in events:
            kind = event.kind
            time_us = event.time_us
            uid = event.uid
            if due and due[0][0] <= time_us:
                out.extend(self.flush_due(time_us))
            state = uids.get(uid)
            if state is None:
                state = uids[uid] = _UidState()
            running = state.running
            if kind == ended:
                running.discard(event.id)
                state.held = event
                if running:
                    state.due_us = None
                else:
                    state.due_us = time_us + window
                    if state.queued_us is None:
                        state.queued_us = state.due_us
                        heapq.heappush(due, (state.due_us, uid))
                continue
            if not running and state.held is None:
                append(event)
            if kind == started:
                running.add(event.id)
                state.due_us = None
        return out

    def flush_due(self, now_us: int) -> list[WorkEvent]:
        """Held ENDED events whose uid has been idle for the whole window by `now_us`."""
        out: list[WorkEvent] = []
        while self._due and self._due[0][0] <= now_us:
            state = self._current()
            if state is None:
                continue
            uid = heapq.heappop(self._due)[1]
            state.queued_us = None
            assert state.held is not None
            out.append(state.held)
            state.held = None
            state.due_us = None
            if not state.running:
                del self._uids[uid]
        return out

    def _current(self) -> _UidState | None:
        """The state of the heap's first entry if that entry is its uid's real due; else the
        entry is dropped or moved to the real due, and None is returned."""
        time_us, uid = self._due[0]
        state = self._uids.get(uid)
        if state is None or state.queued_us != time_us:
            heapq.heappop(self._due)
            return None
        if state.due_us is None or state.held is None:
            heapq.heappop(self._due)
            state.queued_us = None
            return None
        if state.due_us != time_us:
            state.queued_us = state.due_us
            heapq.heapreplace(self._due, (state.due_us, uid))
            return None
        return state

    def next_due_us(self) -> int | None:
        """When the next held event falls due, if any."""
        while self._due:
            if self._current() is not None:
                return self._due[0][0]
        return None

    def flush_all(self) -> list[WorkEvent]:
        """Every held event, at once (the callback is being replaced or the driver closed)."""
        held = [s.held for s in self._uids.values() if s.held is not None]
        held.sort(key=lambda e: (e.time_us, e.id))
        self._uids.clear()
        self._due.clear()
        return held
