"""An app whose calls the daemon keeps refusing is held back: its burst of refusals, then
none of its connections read until its allowance has room again; other apps are served
meanwhile and the held app's own frames are served once it is released."""

from __future__ import annotations

import selectors
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.daemon_support import frames_sent, stepped_daemon, welcomed
from npumanager.daemon.server.connection import Connection
from npumanager.daemon.server.refusals import RefusalAllowance
from npumanager.daemon.server.server import Daemon
from npumanager.daemon.server.shares import share_key
from npumanager.daemon.wire.protocol import CancelLoad, Info, encode

APP = (20_000, "org.example.App")
OTHER = (20_001, "org.example.Other")


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_refusals_then_a_hold_until_the_allowance_has_room() -> None:
    clock = Clock()
    allowance = RefusalAllowance(burst=4, per_s=100, clock=clock)
    assert [allowance.refused(APP) for _ in range(3)] == [False, False, False]
    assert not allowance.held(APP)
    assert allowance.refused(APP), "the burst is spent"
    assert allowance.held(APP) and not allowance.held(OTHER)
    assert allowance.next_release() == pytest.approx(clock.now + 0.01)
    clock.now += 0.009
    assert allowance.held(APP)
    clock.now += 0.002
    assert not allowance.held(APP) and allowance.next_release() is None
    assert allowance.refused(APP), "room for one, and it is taken"
    clock.now += 1.0
    assert [allowance.refused(APP) for _ in range(3)] == [False, False, False], "refilled"


@pytest.fixture
def stepped(socket_dir: Path) -> Iterator[Daemon]:
    """A daemon driven turn by turn (no thread)."""
    with stepped_daemon(socket_dir / "npu.sock") as daemon:
        yield daemon


def app_client(daemon: Daemon, app_id: str) -> tuple[socket.socket, Connection]:
    """A welcomed client whose connection counts as a non-management app of its own."""
    import dataclasses

    client, connection = welcomed(daemon)
    assert connection.app is not None
    connection.app = dataclasses.replace(connection.app, app_id=app_id)
    connection.management = False
    return client, connection


def turn(daemon: Daemon, *connections: Connection) -> None:
    """One turn of the loop for these connections, as `_loop_turn` gives it."""
    daemon.transport.shares.new_turn()
    for connection in connections:
        if connection.events & selectors.EVENT_READ:
            daemon.transport.io(connection.sock, selectors.EVENT_READ)
    daemon.transport.serve_backlog()
    daemon._on_time(0.0)


def test_an_app_past_its_refusals_is_not_read_until_released_and_others_are_served(
    stepped: Daemon,
) -> None:
    clock = Clock()
    stepped.transport.refusals = RefusalAllowance(burst=4, per_s=100, clock=clock)
    (bad, held), (good, other) = app_client(stepped, APP[1]), app_client(stepped, OTHER[1])
    with bad, good:
        bad.sendall(b"".join(encode(CancelLoad(seq=i, request_id=i)) for i in range(1, 11)))
        answered = 0
        for _ in range(12):
            turn(stepped, held)
            answered += frames_sent(bad)
        assert answered == 4, "its burst of refusals, then nothing"
        assert held in stepped.transport.held
        assert not held.events & selectors.EVENT_READ, "its socket is not even watched"
        assert stepped.stats.refusal_holds == 1

        good.sendall(encode(Info(seq=1)))
        turn(stepped, held, other)
        assert frames_sent(good) == 1, "another app is served while this one is held"

        clock.now += 0.011
        turn(stepped, held)  # released at the end of a turn, served in the next
        assert held not in stepped.transport.held and held.events & selectors.EVENT_READ
        turn(stepped, held)
        assert frames_sent(bad) == 1, "one more refusal, and held again"
        assert held in stepped.transport.held
        assert share_key(held) == (held.peer.uid, APP[1])


def test_a_management_connection_is_not_held_for_its_refusals(stepped: Daemon) -> None:
    clock = Clock()
    stepped.transport.refusals = RefusalAllowance(burst=2, per_s=100, clock=clock)
    client, connection = app_client(stepped, APP[1])
    connection.management = True
    with client:
        client.sendall(b"".join(encode(CancelLoad(seq=i, request_id=i)) for i in range(1, 7)))
        answered = 0
        for _ in range(8):
            turn(stepped, connection)
            answered += frames_sent(client)
        assert answered == 6
        assert connection not in stepped.transport.held


def test_the_loop_sleeps_no_longer_than_the_first_hold(stepped: Daemon) -> None:
    """A held app's frames wait in its socket, which the loop does not watch: the loop
    wakes for the end of the hold by its own timeout."""
    stepped.transport.refusals = RefusalAllowance(burst=1, per_s=0.5)
    client, connection = app_client(stepped, APP[1])
    with client:
        client.sendall(encode(CancelLoad(seq=1, request_id=1)))
        turn(stepped, connection)
        assert connection in stepped.transport.held
        timeout = stepped._timeout()
        assert timeout is not None and timeout <= 2.0
