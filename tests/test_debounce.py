"""The platform's debounce rules, one piece of code in front of every driver's events."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npumanager.core.driver.debounce import Debouncer
from npumanager.core.driver.events import NO_REASON, EventKind, WorkEvent
from npumanager.schemas import EndReason, StartReason

MS = 1000


def ev(kind: EventKind, work: int, uid: int, t_ms: float, reason: int = NO_REASON) -> WorkEvent:
    t = int(t_ms * MS)
    return WorkEvent(
        int(kind), int(reason), work, None, uid, 0, uid, None, 0, 100, t // 1000, 0, t, 1
    )


def req(work: int, uid: int, t: float) -> WorkEvent:
    return ev(EventKind.REQUESTED, work, uid, t)


def start(work: int, uid: int, t: float, reason: StartReason = StartReason.INITIAL) -> WorkEvent:
    return ev(EventKind.STARTED, work, uid, t, reason)


def end(work: int, uid: int, t: float, reason: EndReason = EndReason.COMPLETED) -> WorkEvent:
    return ev(EventKind.ENDED, work, uid, t, reason)


def test_window_zero_passes_everything() -> None:
    events = [req(1, 5, 0), start(1, 5, 0), end(1, 5, 1), req(2, 5, 1)]
    debouncer = Debouncer(0)
    assert debouncer.feed(events) == events
    assert debouncer.next_due_us() is None


def test_single_inference_is_requested_started_then_ended_after_the_window() -> None:
    debouncer = Debouncer(50)
    assert debouncer.feed([req(1, 5, 0), start(1, 5, 0), end(1, 5, 10)]) == [
        req(1, 5, 0),
        start(1, 5, 0),
    ]
    assert debouncer.next_due_us() == 60 * MS
    assert debouncer.flush_due(59_999) == []
    assert debouncer.flush_due(60 * MS) == [end(1, 5, 10)]
    assert debouncer.next_due_us() is None


def test_back_to_back_runs_of_a_model_collapse_to_one_start_and_one_end() -> None:
    debouncer = Debouncer(50)
    raw = []
    for i in range(10):
        t = i * 20.0
        raw += [req(i, 7, t), start(i, 7, t), end(i, 7, t + 10)]
    out = debouncer.feed(raw)
    assert out == [req(0, 7, 0), start(0, 7, 0)]
    assert debouncer.flush_due(10**9) == [end(9, 7, 190)]


def test_new_work_after_the_window_is_reported_again() -> None:
    debouncer = Debouncer(50)
    first = debouncer.feed([req(1, 5, 0), start(1, 5, 0), end(1, 5, 10)])
    later = debouncer.feed([req(2, 5, 61), start(2, 5, 61)])
    assert first == [req(1, 5, 0), start(1, 5, 0)]
    assert later == [end(1, 5, 10), req(2, 5, 61), start(2, 5, 61)]


def test_ended_waits_while_the_uid_still_runs_other_work() -> None:
    debouncer = Debouncer(50)
    out = debouncer.feed([req(1, 5, 0), req(2, 5, 0), start(1, 5, 0), start(2, 5, 0), end(1, 5, 5)])
    assert out == [req(1, 5, 0), req(2, 5, 0), start(1, 5, 0)]
    assert debouncer.next_due_us() is None, "not idle: work 2 still runs"
    assert debouncer.feed([end(2, 5, 500)]) == []
    assert debouncer.flush_due(549 * MS) == []
    assert debouncer.flush_due(550 * MS) == [end(2, 5, 500)]


def test_uids_are_debounced_independently() -> None:
    debouncer = Debouncer(50)
    out = debouncer.feed([req(1, 5, 0), start(1, 5, 0), req(2, 6, 1), start(2, 6, 1)])
    assert out == [req(1, 5, 0), start(1, 5, 0), req(2, 6, 1), start(2, 6, 1)]


def test_pause_and_quick_resume_are_absorbed() -> None:
    debouncer = Debouncer(50)
    raw = [
        req(1, 5, 0),
        start(1, 5, 0),
        end(1, 5, 1, EndReason.PAUSED),
        start(1, 5, 3, StartReason.RESUMED),
        end(1, 5, 9),
    ]
    assert debouncer.feed(raw) == [req(1, 5, 0), start(1, 5, 0)]
    assert debouncer.flush_all() == [end(1, 5, 9)]


def test_flush_all_returns_every_held_end_in_time_order() -> None:
    debouncer = Debouncer(50)
    debouncer.feed([start(1, 5, 0), start(2, 6, 0), end(2, 6, 3), end(1, 5, 4)])
    assert debouncer.flush_all() == [end(2, 6, 3), end(1, 5, 4)]
    assert debouncer.next_due_us() is None


def test_negative_window_is_refused() -> None:
    with pytest.raises(ValueError, match="debounce_duration_ms must be >= 0"):
        Debouncer(-1)


@st.composite
def streams(draw: st.DrawFn) -> list[WorkEvent]:
    """Well-formed raw streams: each work is requested, maybe started/paused, then ended."""
    t = 0.0
    out: list[WorkEvent] = []
    live: dict[int, tuple[int, bool]] = {}
    next_id = 1
    for _ in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0, 0.5, 5, 30, 49, 50, 51, 200]))
        action = draw(st.sampled_from(["new", "start", "end"]))
        if action == "new" or not live:
            uid = draw(st.integers(1, 3))
            live[next_id] = (uid, False)
            out.append(req(next_id, uid, t))
            next_id += 1
        else:
            work = draw(st.sampled_from(sorted(live)))
            uid, running = live[work]
            if action == "start" and not running:
                live[work] = (uid, True)
                out.append(start(work, uid, t))
            elif running:
                reason = draw(st.sampled_from([EndReason.COMPLETED, EndReason.PAUSED]))
                out.append(end(work, uid, t, reason))
                if reason == EndReason.PAUSED:
                    live[work] = (uid, False)
                else:
                    del live[work]
            else:
                out.append(end(work, uid, t, EndReason.CANCELLED_USER))
                del live[work]
    return out


def naive_debounce(raw: list[WorkEvent], window_ms: int) -> list[WorkEvent]:
    """The rule written the slow, obvious way: scan every uid before every event."""
    window = window_ms * MS
    running: dict[int, set[int]] = {}
    held: dict[int, WorkEvent] = {}
    out: list[WorkEvent] = []
    for event in raw:
        due = sorted(
            (h.time_us + window, uid)
            for uid, h in held.items()
            if not running.get(uid) and h.time_us + window <= event.time_us
        )
        for _, uid in due:
            out.append(held.pop(uid))
        busy = bool(running.get(event.uid)) or event.uid in held
        if event.kind == EventKind.REQUESTED:
            if not busy:
                out.append(event)
        elif event.kind == EventKind.STARTED:
            if not busy:
                out.append(event)
            running.setdefault(event.uid, set()).add(event.id)
        else:
            running.setdefault(event.uid, set()).discard(event.id)
            held[event.uid] = event
    return out + sorted(held.values(), key=lambda e: (e.time_us, e.id))


@given(streams(), st.sampled_from([1, 20, 50]))
def test_matches_the_naive_rule(raw: list[WorkEvent], window: int) -> None:
    debouncer = Debouncer(window)
    assert debouncer.feed(raw) + debouncer.flush_all() == naive_debounce(raw, window)


@given(streams(), st.sampled_from([1, 20, 50]))
def test_only_drops_or_delays_and_never_loses_the_last_end(
    raw: list[WorkEvent], window: int
) -> None:
    debouncer = Debouncer(window)
    out = debouncer.feed(raw) + debouncer.flush_all()
    assert all(event in raw for event in out)
    assert len(out) == len(set(out))
    for uid in {e.uid for e in raw}:
        ends = [e for e in raw if e.uid == uid and e.kind == EventKind.ENDED]
        if ends:
            assert ends[-1] in out, "a uid's final ENDED always reaches the callback"
        firsts = [e for e in raw if e.uid == uid][0]
        assert firsts in out, "the first event of a quiet uid is never suppressed"
