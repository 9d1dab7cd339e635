"""A model host's grant time (`daemon.host.grants.Grants`), which the audit holds the CPU
time the kernel counts for the host to: open grants count, closed ones stop, and one the
daemon stopped counts `STOPPED_GRANT_S` more at most, however long the host ignores it."""

from __future__ import annotations

import time

import pytest

from npumanager.daemon.host import grants as grants_module
from npumanager.daemon.host.grants import Grants

STOPPED_NS = 50_000_000
"""The time a stopped grant still counts here (`STOPPED_GRANT_S`, patched smaller)."""


@pytest.fixture(autouse=True)
def _short_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grants_module, "STOPPED_GRANT_S", STOPPED_NS / 1e9)


def _until(ns: int) -> None:
    """Wait until the monotonic clock reads `ns` or later."""
    while time.monotonic_ns() < ns:
        time.sleep(max(0.0, (ns - time.monotonic_ns()) / 1e9))


def test_an_open_grant_counts_until_it_closes_and_two_at_once_count_twice() -> None:
    grants = Grants()
    before = time.monotonic_ns()
    first, second = grants.opened(), grants.opened()
    after = time.monotonic_ns()
    _until(after + 20_000_000)
    closing = time.monotonic_ns()
    grants.closed(first)
    grants.closed(second)
    ended = time.monotonic_ns()
    total = grants.total_ns()
    assert 2 * (closing - after) <= total <= 2 * (ended - before)
    _until(ended + 20_000_000)
    assert grants.total_ns() == total, "closed grants count no more"
    assert grants.open == 0


def test_a_stopped_grant_counts_its_time_to_the_stop_and_stopped_grant_s_more_only() -> None:
    grants = Grants()
    opening = time.monotonic_ns()
    grant = grants.opened()
    opened = time.monotonic_ns()
    _until(opened + 20_000_000)
    stopping = time.monotonic_ns()
    grants.stopped(grant)
    stopped = time.monotonic_ns()
    assert grants.unheeded == 0, "it still counts for STOPPED_GRANT_S"
    _until(stopped + STOPPED_NS + 30_000_000)
    total = grants.total_ns()
    assert (stopping - opened) + STOPPED_NS <= total <= (stopped - opening) + STOPPED_NS
    assert grants.open == 1 and grants.unheeded == 1, "the host has not said it is done"
    _until(time.monotonic_ns() + 20_000_000)
    assert grants.total_ns() == total, "the host's run goes on on its own account"
    grants.closed(grant)
    assert (grants.open, grants.unheeded, grants.total_ns()) == (0, 0, total)


def test_a_second_stop_does_not_lengthen_a_grant_nor_a_stop_revive_a_closed_one() -> None:
    grants = Grants()
    grant = grants.opened()
    grants.stopped(grant)
    _until(time.monotonic_ns() + STOPPED_NS + 10_000_000)
    total = grants.total_ns()
    grants.stopped(grant)  # the driver's stop and then the client's cancel, say
    _until(time.monotonic_ns() + 20_000_000)
    assert grants.total_ns() == total
    grants.closed(grant)
    grants.stopped(grant)
    grants.closed(grant)
    assert (grants.open, grants.total_ns()) == (0, total)


def test_stopping_one_grant_leaves_the_others_counting() -> None:
    grants = Grants()
    stopped, running = grants.opened(), grants.opened()
    grants.stopped(stopped)
    _until(time.monotonic_ns() + STOPPED_NS + 10_000_000)
    start = time.monotonic_ns()
    before = grants.total_ns()
    begun = time.monotonic_ns()
    _until(begun + 20_000_000)
    grown = grants.total_ns() - before
    assert 20_000_000 <= grown <= time.monotonic_ns() - start, "one grant's time, not two"
    grants.closed(running)
    grants.closed(stopped)
