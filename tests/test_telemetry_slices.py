"""Lane assignment for traces and pictures, against a simple model; the progress bar."""

from __future__ import annotations

import io
import itertools

from hypothesis import given
from hypothesis import strategies as st

from npumanager.core.driver.events import NO_REASON, EventKind, WorkEvent
from npumanager.schemas import EndReason, StartReason
from npumanager.simulation.progress import ProgressBar
from npumanager.telemetry.slices import SliceBuilder


def event(
    kind: EventKind, work: int, t: int, device: int = 0, reason: int = NO_REASON
) -> WorkEvent:
    return WorkEvent(int(kind), reason, work, None, 7, 0, 7, None, 0, 0, t // 1000, device, t, 1)


@st.composite
def schedules(draw: st.DrawFn) -> list[WorkEvent]:
    """Random executions on two devices: each item runs one or more stretches (pauses)."""
    events: list[tuple[int, int, WorkEvent]] = []
    for work in range(draw(st.integers(1, 25))):
        device = draw(st.integers(0, 1))
        t = draw(st.integers(0, 1000))
        stretches = draw(st.integers(1, 3))
        for n in range(stretches):
            length = draw(st.integers(1, 200))
            start = StartReason.RESUMED if n else StartReason.INITIAL
            end = EndReason.COMPLETED if n == stretches - 1 else EndReason.PAUSED
            events.append((t, 1, event(EventKind.STARTED, work, t, device, start)))
            events.append((t + length, 0, event(EventKind.ENDED, work, t + length, device, end)))
            t += length + draw(st.integers(1, 100))
    events.sort(key=lambda item: (item[0], item[1]))  # ends before starts at the same time
    return [e for _, _, e in events]


@given(schedules())
def test_lanes_never_overlap_and_never_exceed_what_ran_at_once(stream: list[WorkEvent]) -> None:
    builder = SliceBuilder()
    slices = list(builder.feed_all(stream))
    assert len(slices) == sum(e.kind == EventKind.ENDED for e in stream)
    for device in (0, 1):
        mine = [s for s in slices if s.device == device]
        running = peak = 0
        for e in stream:
            if e.device_number == device:
                running += 1 if e.kind == EventKind.STARTED else -1
                peak = max(peak, running)
        assert builder.lane_count(device) == peak
        for lane in {s.lane for s in mine}:
            spans = sorted((s.start.time_us, s.end.time_us) for s in mine if s.lane == lane)
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert builder.open_slices() == []


def test_events_without_a_partner_are_ignored_and_open_slices_are_listed() -> None:
    builder = SliceBuilder()
    assert builder.feed(event(EventKind.REQUESTED, 1, 0)) is None
    assert builder.feed(event(EventKind.ENDED, 1, 5, reason=EndReason.CANCELLED_USER)) is None
    assert builder.feed(event(EventKind.STARTED, 2, 10, reason=StartReason.INITIAL)) is None
    assert [(d, lane, s.id) for d, lane, s in builder.open_slices()] == [(0, 0, 2)]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_progress_bar_appears_only_after_a_second_and_is_cleared() -> None:
    clock, stream = FakeClock(), io.StringIO()
    bar = ProgressBar(1000, stream, clock=clock)
    update = bar.stage("direct", 0)
    for t in range(400):
        clock.now = t / 1000
        update(t)
    assert stream.getvalue() == "" and not bar.shown
    clock.now = 3.0
    bar.stage("managed", 500)(249)
    assert stream.getvalue() == "\rmanaged [" + "#" * 22 + " " * 8 + "]  75%, about 1 s left"
    clock.now = 3.05
    update(300)
    assert stream.getvalue().count("\r") == 1, "redrawn at most every 0.1 s"
    bar.finish()
    width = len("managed [") + 30 + len("]  75%, about 1 s left")
    assert stream.getvalue().endswith("\r" + " " * width + "\r") and not bar.shown


def test_a_short_run_prints_nothing_at_all() -> None:
    clock, stream = FakeClock(), io.StringIO()
    bar = ProgressBar(10, stream, clock=clock)
    for t in range(10):
        bar.update(t)
    bar.finish()
    assert stream.getvalue() == ""


def test_the_estimate_counts_minutes_from_the_pace_so_far() -> None:
    clock, stream = FakeClock(), io.StringIO()
    bar = ProgressBar(1000, stream, clock=clock)
    clock.now = 100.0
    bar.update(99)
    assert stream.getvalue().endswith("]  10%, about 15 min 0 s left")
