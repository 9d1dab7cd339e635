"""Work events as slices of execution, each on a lane of its device.

A slice runs from a STARTED event to the next ENDED event of the same work (PAUSED
included, so a paused item becomes several slices). Drivers do not say which channel
ran the work, so each slice takes the lowest lane of its device that is free when it
starts: at most as many lanes as the device ran items at once, and never two slices on
one lane at the same time.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from npumanager.core.driver.events import EventKind, WorkEvent


class Slice(NamedTuple):
    """One stretch of execution: the lane it is drawn on, and its STARTED and ENDED events."""

    device: int
    lane: int
    start: WorkEvent
    end: WorkEvent

    @property
    def duration_us(self) -> int:
        """How long the stretch ran."""
        return self.end.time_us - self.start.time_us


class _Lanes:
    def __init__(self) -> None:
        self.free: list[int] = []
        self.count = 0

    def take(self) -> int:
        if self.free:
            return heapq.heappop(self.free)
        self.count += 1
        return self.count - 1

    def give(self, lane: int) -> None:
        heapq.heappush(self.free, lane)


class SliceBuilder:
    """Turns a stream of work events into slices; events without a partner are ignored."""

    def __init__(self) -> None:
        self._lanes: dict[int, _Lanes] = {}
        self._open: dict[int, tuple[int, WorkEvent]] = {}

    def feed(self, event: WorkEvent) -> Slice | None:
        """The slice this event closes, if it closes one."""
        if event.kind == EventKind.STARTED:
            if event.id not in self._open:
                lanes = self._lanes.get(event.device_number)
                if lanes is None:
                    lanes = self._lanes[event.device_number] = _Lanes()
                self._open[event.id] = (lanes.take(), event)
            return None
        if event.kind != EventKind.ENDED:
            return None
        opened = self._open.pop(event.id, None)
        if opened is None:
            return None
        lane, start = opened
        self._lanes[start.device_number].give(lane)
        return Slice(start.device_number, lane, start, event)

    def feed_all(self, events: Iterable[WorkEvent]) -> Iterator[Slice]:
        """The slices a sequence of events closes, in order."""
        for event in events:
            closed = self.feed(event)
            if closed is not None:
                yield closed

    def open_slices(self) -> list[tuple[int, int, WorkEvent]]:
        """(device, lane, STARTED event) of every item still running, oldest first."""
        return sorted(
            ((start.device_number, lane, start) for lane, start in self._open.values()),
            key=lambda item: (item[2].time_us, item[2].id),
        )

    def lane_count(self, device: int) -> int:
        """How many lanes a device has needed so far."""
        lanes = self._lanes.get(device)
        return 0 if lanes is None else lanes.count
