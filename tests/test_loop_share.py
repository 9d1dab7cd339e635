"""Each uid's share of the daemon's loop (`daemon.server.loopshare`): a uid that keeps the
loop busy while another wants it is held back; a uid alone, or a management uid, never is.

The bucket on a clock of the test's own; the daemon with a real flooding client of its own
uid beside a client that keeps calling.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

import npumanager as npu
from helpers.attackers import Attacker
from helpers.daemon_support import SOCKET_GID, DaemonProcess, Daemons
from npumanager.daemon.server.loopshare import ACTIVE_WINDOW_S, BURST_S, SHARE, LoopShare

HEAVY, LIGHT = 20021, 20022


def test_a_uid_alone_is_never_held_back() -> None:
    share = LoopShare()
    for step in range(1000):
        assert share.charge(HEAVY, 0.001, now=step * 0.001) == 0.0


def test_a_uid_past_its_burst_while_another_wants_the_loop_waits_for_half_of_it() -> None:
    share = LoopShare()
    share.charge(LIGHT, 0.0001, now=0.0)
    until = share.charge(HEAVY, BURST_S + 0.001, now=0.001)
    # 1 ms in debt: back when the bucket holds half its burst, refilled at SHARE
    assert until == pytest.approx(0.001 + (BURST_S / 2 + 0.001) / SHARE)
    assert share.held_until(HEAVY, until - 1e-6) == until
    assert share.held_until(HEAVY, until) == 0.0
    assert share.balance(HEAVY, until) == pytest.approx(BURST_S / 2)
    assert share.held_until(LIGHT, 0.002) == 0.0


def test_another_uid_served_long_ago_does_not_hold_anyone_back() -> None:
    share = LoopShare()
    share.charge(LIGHT, 0.0001, now=0.0)
    assert share.charge(HEAVY, BURST_S * 3, now=ACTIVE_WINDOW_S + 0.01) == 0.0


def test_management_uids_are_never_held_back_but_count_as_wanting() -> None:
    share = LoopShare()
    assert share.charge(0, 10.0, now=0.0, exempt=True) == 0.0
    assert share.charge(0, 10.0, now=0.01, exempt=True) == 0.0
    assert share.charge(HEAVY, BURST_S * 2, now=0.02) > 0.02


def test_the_uid_with_more_loop_time_in_hand_comes_first() -> None:
    share = LoopShare()
    share.charge(LIGHT, 0.0001, now=0.0)
    share.charge(HEAVY, 0.003, now=0.0)
    assert share.balance(LIGHT, 0.0) > share.balance(HEAVY, 0.0)
    assert share.balance(20099, 0.0) == BURST_S, "a uid never served has a full bucket"


@given(
    st.lists(
        st.tuples(st.sampled_from([HEAVY, LIGHT]), st.floats(0, 0.002), st.floats(0, 0.01)),
        max_size=300,
    )
)
def test_a_uid_is_held_back_only_past_its_burst_while_another_wants_the_loop(
    steps: list[tuple[int, float, float]],
) -> None:
    """Whatever the order: a uid held back was charged more than its burst in all, the
    other uid was served within `ACTIVE_WINDOW_S`, and it waits at least until half its
    burst is back; a held uid is not served (as the loop does) and is let go in time."""
    share = LoopShare()
    now = 0.0
    charged: dict[int, float] = {}
    served_at: dict[int, float] = {}
    for uid, seconds, wait in steps:
        now += wait
        if share.held_until(uid, now):
            continue
        charged[uid] = charged.get(uid, 0.0) + seconds
        until = share.charge(uid, seconds, now)
        other = LIGHT if uid == HEAVY else HEAVY
        if until:
            assert charged[uid] > BURST_S
            assert now - served_at[other] <= ACTIVE_WINDOW_S
            assert until >= now + BURST_S / 2 / SHARE - 1e-9
        served_at[uid] = now


def test_buckets_of_uids_gone_quiet_are_dropped() -> None:
    share = LoopShare()
    for uid in range(1025):
        share.charge(uid, 0.0001, now=0.0)
    share.charge(5000, 0.0001, now=10.0)
    assert share.balance(3, 10.0) == BURST_S
    assert len(share._buckets) <= 2


# Through a daemon ------------------------------------------------------------------------


@pytest.fixture
def served(daemon: Daemons) -> Iterator[DaemonProcess]:
    yield daemon("--socket-group", str(SOCKET_GID))


@pytest.mark.skipif(os.geteuid() != 0, reason="a flooding client of its own uid needs root")
def test_a_uid_flooding_the_loop_is_held_back_and_every_call_still_answered(
    served: DaemonProcess,
) -> None:
    daemon = served
    calls: list[int] = []
    done = threading.Event()

    def keep_calling() -> None:
        with npu.DaemonClient(daemon.socket) as other:
            while not done.is_set():
                other.info(limit=1)
                calls.append(1)

    caller = threading.Thread(target=keep_calling)
    caller.start()
    try:
        flood = Attacker(daemon.socket, "flood_info", 5000)
        try:
            assert flood.report["answered"] == 5000, "held back, never dropped"
        finally:
            flood.close()
    finally:
        done.set()
        caller.join()
    with npu.DaemonClient(daemon.socket) as admin:
        assert admin.info()["daemon"]["held_back"] > 0
    assert calls, "the other client was served throughout"
