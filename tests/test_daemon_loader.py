"""The daemon's loader: bounded per connection, a gone client's loads dropped, never
waited for at exit. Each test waits for events (a load blocked on an `Event`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from npumanager.daemon.server.loader import Loader, close_all
from npumanager.errors import QuotaExceededError

WAIT_S = 60
"""Ends a hung test only; every wait below is for an event."""


class Blocked:
    """A load that runs until the test lets it end."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.ran = False

    def __call__(self) -> bool:
        self.started.set()
        assert self.release.wait(WAIT_S)
        self.ran = True
        return True  # the model opened


@pytest.fixture
def loader() -> Iterator[Loader]:
    made = Loader(per_owner=2)
    yield made
    made.close()


def test_a_connection_has_at_most_its_limit_of_loads_in_flight(loader: Loader) -> None:
    owner, other = object(), object()
    first, second, third = Blocked(), Blocked(), Blocked()
    dropped: list[str] = []
    loader.submit(owner, first, lambda: dropped.append("first"))
    assert first.started.wait(WAIT_S)
    loader.submit(owner, second, lambda: dropped.append("second"))
    with pytest.raises(QuotaExceededError, match="2 model loads in flight, its limit"):
        loader.submit(owner, third, lambda: dropped.append("third"))
    assert dropped == ["third"], "a refused load gives back its descriptors at once"
    loader.submit(other, Blocked(), lambda: None)  # another connection is not held to it
    assert (loader.in_flight(owner), loader.in_flight(other)) == (2, 1)
    assert loader.counts() == {"queued": 2, "running": 1}
    first.release.set()
    assert second.started.wait(WAIT_S)
    assert loader.in_flight(owner) == 1
    loader.submit(owner, Blocked(), lambda: None)  # room again
    second.release.set()


def test_a_gone_connections_queued_loads_are_dropped_at_once(loader: Loader) -> None:
    running, gone = object(), object()
    blocker = Blocked()
    loader.submit(running, blocker, lambda: None)
    assert blocker.started.wait(WAIT_S)
    queued = [Blocked(), Blocked()]
    dropped: list[int] = []
    for index, load in enumerate(queued):
        loader.submit(gone, load, lambda index=index: dropped.append(index))  # type: ignore[misc]
    assert loader.forget(gone) == 2
    assert sorted(dropped) == [0, 1] and loader.in_flight(gone) == 0
    blocker.release.set()
    done = threading.Event()
    loader.submit(running, done.set, lambda: None)
    assert done.wait(WAIT_S)
    assert not any(load.started.is_set() for load in queued), "dropped loads never run"


def test_closing_drops_the_queue_and_does_not_wait_for_the_load_in_progress() -> None:
    loader = Loader(per_owner=2)
    owner = object()
    blocker, queued = Blocked(), Blocked()
    dropped: list[str] = []
    loader.submit(owner, blocker, lambda: dropped.append("running"))
    assert blocker.started.wait(WAIT_S)
    loader.submit(owner, queued, lambda: dropped.append("queued"))
    assert loader.close() == (1, True)
    assert dropped == ["queued"]
    assert loader._thread.daemon, "a load in progress never holds up the process's exit"
    with pytest.raises(QuotaExceededError, match="the daemon is stopping"):
        loader.submit(owner, Blocked(), lambda: dropped.append("late"))
    assert dropped == ["queued", "late"]
    blocker.release.set()


def test_a_load_that_raises_is_one_log_line_and_the_loader_goes_on(
    loader: Loader, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise OSError("the disk went away")

    loader.submit(object(), broken, lambda: None)
    done = threading.Event()
    loader.submit(object(), done.set, lambda: None)
    assert done.wait(WAIT_S)
    lines = [r for r in caplog.records if "model load raised" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "OSError: the disk went away" in lines[0].getMessage()


def test_close_all_closes_each_descriptor_once() -> None:
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(3)]
    kept = list(fds)
    close_all(fds)
    close_all(fds)
    assert fds == []
    for fd in kept:
        with pytest.raises(OSError):
            os.fstat(fd)


class Answering(Blocked):
    """A blocked load that, once let go, says whether its model opened."""

    def __init__(self, opened: bool) -> None:
        super().__init__()
        self.opened = opened

    def __call__(self) -> bool:
        super().__call__()
        return self.opened


def test_a_refused_load_pauses_its_connection_while_others_go_first() -> None:
    """After a refused load, the connection's next waits out its pause; another
    connection's load, queued after it, runs meanwhile."""
    loader = Loader(per_owner=2, refusal_pause_s=(3600.0, 3600.0))
    flood, other = object(), object()
    dropped: list[str] = []
    try:
        refused = Answering(opened=False)
        loader.submit(flood, refused, lambda: None)
        assert refused.started.wait(WAIT_S)
        waiting, going = Answering(True), Answering(True)
        loader.submit(flood, waiting, lambda: dropped.append("waiting"))
        refused.release.set()
        loader.submit(other, going, lambda: None)
        assert going.started.wait(WAIT_S), "the other connection's load ran first"
        assert not waiting.started.is_set()
        assert loader.pause_of(flood) == 3600.0 and loader.pause_of(other) == 0.0
        assert loader.counts() == {"queued": 1, "running": 1}
        going.release.set()
    finally:
        loader.close()
    assert dropped == ["waiting"]


def test_refusals_in_a_row_double_the_pause_up_to_its_most_and_an_opened_load_ends_it() -> None:
    loader = Loader(per_owner=2, refusal_pause_s=(0.001, 0.004))
    owner = object()
    pauses = []
    try:
        load = Answering(opened=False)
        loader.submit(owner, load, lambda: None)
        for opened in (False, False, False, True, False):
            assert load.started.wait(WAIT_S)
            after = Answering(opened)
            loader.submit(owner, after, lambda: None)
            load.release.set()
            assert after.started.wait(WAIT_S)  # the loader updated the pause before it
            pauses.append(loader.pause_of(owner))
            load = after
        load.release.set()
    finally:
        loader.close()
    assert pauses == [0.001, 0.002, 0.004, 0.004, 0.0]


def test_a_gone_connections_pause_is_forgotten(loader: Loader) -> None:
    owner = object()
    refused = Answering(opened=False)
    refused.release.set()
    loader.submit(owner, refused, lambda: None)
    assert refused.started.wait(WAIT_S)
    barrier = Answering(True)
    barrier.release.set()
    loader.submit(object(), barrier, lambda: None)
    assert barrier.started.wait(WAIT_S)
    assert loader.pause_of(owner) > 0
    loader.forget(owner)
    assert loader.pause_of(owner) == 0.0


def test_an_apps_pause_holds_its_other_connections_too() -> None:
    """The pause belongs to the app (`group`): a second connection of the app that sent a
    bad model waits too, while another app's load goes first."""
    loader = Loader(per_owner=2, refusal_pause_s=(3600.0, 3600.0))
    first, second, stranger = object(), object(), object()
    try:
        refused = Answering(opened=False)
        refused.release.set()
        loader.submit(first, refused, lambda: None, "app-flood")
        assert refused.started.wait(WAIT_S)
        waiting, going = Answering(True), Answering(True)
        going.release.set()
        loader.submit(second, waiting, lambda: None, "app-flood")
        loader.submit(stranger, going, lambda: None, "app-other")
        assert going.started.wait(WAIT_S)
        assert not waiting.started.is_set()
        assert loader.pause_of("app-flood") == 3600.0
        loader.forget(first)
        assert loader.pause_of("app-flood") == 3600.0, "the app's pause outlives it"
    finally:
        loader.close()
