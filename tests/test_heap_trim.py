"""When the daemon hands freed client buffers back: after the churn stops, and at most
every few seconds while it goes on (`daemon.heap.TrimSchedule`)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from npumanager.daemon.heap import TrimSchedule

MIB = 1 << 20


def test_nothing_is_owed_below_the_threshold() -> None:
    schedule = TrimSchedule(MIB, 0.2, 2.0)
    schedule.freed(MIB - 1, 10.0)
    assert schedule.due is None
    assert not schedule.take(100.0)


def test_a_trim_follows_the_last_free_by_the_quiet_time() -> None:
    schedule = TrimSchedule(MIB, 0.2, 2.0)
    schedule.freed(MIB, 10.0)
    schedule.freed(3 * MIB, 10.1)
    assert schedule.due == 10.1 + 0.2
    assert not schedule.take(10.25)
    assert schedule.take(10.3)
    assert schedule.due is None and not schedule.take(10.4)


def test_a_count_that_did_not_grow_does_not_move_the_trim() -> None:
    schedule = TrimSchedule(MIB, 0.2, 2.0)
    schedule.freed(2 * MIB, 10.0)
    schedule.freed(2 * MIB, 10.15)  # the loop's next turn: nothing more freed
    assert schedule.due == 10.2


def test_steady_churn_is_trimmed_at_most_every_most_s_and_at_least_that_often() -> None:
    """A flood frees buffers every 50 ms for 10 s: trims run every 2 s, not every 0.2 s."""
    schedule = TrimSchedule(MIB, 0.2, 2.0)
    trims, total = [], 0
    for step in range(200):
        now = 10.0 + step * 0.05
        if schedule.take(now):
            trims.append(now)
            total = 0
        total += MIB
        schedule.freed(total, now)
    gaps = [b - a for a, b in itertools.pairwise(trims)]
    assert len(trims) == 4
    assert all(abs(gap - 2.0) < 0.06 for gap in gaps), gaps


@given(
    gaps=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60),
    quiet=st.floats(0.01, 0.5),
    most=st.floats(0.5, 5.0),
)
def test_every_free_is_trimmed_within_most_s_and_never_before_quiet_s(
    gaps: list[float], quiet: float, most: float
) -> None:
    """Whatever the frees' rhythm: a trim never runs sooner than `quiet_s` after the last
    free it saw, unless `most_s` has passed since the first free it owes."""
    schedule = TrimSchedule(MIB, quiet, most)
    now, total, first, last = 0.0, 0, None, 0.0
    for gap in gaps:
        now += gap
        if schedule.take(now):
            assert first is not None
            assert now - last >= quiet - 1e-9 or now - first >= most - 1e-9
            total, first = 0, None
        total += MIB
        schedule.freed(total, now)
        first = now if first is None else first
        last = now
        assert schedule.due is not None and schedule.due <= first + most + 1e-9
