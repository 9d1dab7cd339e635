"""A turn of the daemon's loop, frame by frame: a connection waits for another turn only
while it has a whole frame buffered, so a frame that overran its app's slice costs no empty
turn after it (benchmarks/ipc.py counts what a turn costs a control frame); and a
connection whose app spent its slice is not read until the app's next turn, so a crowd of
one app's connections costs a turn little (benchmarks/daemon_attacks.py, crowd_flood)."""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.daemon_support import frames_sent, stepped_daemon, welcomed
from npumanager.daemon.server import shares
from npumanager.daemon.server.connection import Connection
from npumanager.daemon.server.server import Daemon
from npumanager.daemon.server.shares import share_key
from npumanager.daemon.wire.protocol import Info, encode
from npumanager.schemas.limits import TURN_SLICE_S


@pytest.fixture
def stepped(socket_dir: Path) -> Iterator[Daemon]:
    """A daemon driven turn by turn (no thread)."""
    with stepped_daemon(socket_dir / "npu.sock") as daemon:
        yield daemon


@pytest.fixture
def served(stepped: Daemon) -> Iterator[tuple[Daemon, socket.socket, Connection]]:
    """A daemon driven turn by turn and one client that said hello."""
    client, connection = welcomed(stepped)
    with client:
        yield stepped, client, connection


@pytest.fixture
def slice_overrun(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every frame overruns its app's slice of the turn (a slice begun takes one frame)."""
    monkeypatch.setattr(shares, "TURN_SLICE_S", 1e-12)


@pytest.mark.usefixtures("slice_overrun")
def test_a_frame_past_its_slice_with_nothing_behind_it_waits_for_no_turn(
    served: tuple[Daemon, socket.socket, Connection],
) -> None:
    daemon, client, connection = served
    client.sendall(encode(Info(seq=1)))
    daemon.transport.io(connection.sock, selectors.EVENT_READ)
    assert frames_sent(client) == 1
    assert connection not in daemon.transport.backlog


@pytest.mark.usefixtures("slice_overrun")
def test_a_whole_frame_behind_one_past_its_slice_waits_for_the_next_turn(
    served: tuple[Daemon, socket.socket, Connection],
) -> None:
    daemon, client, connection = served
    client.sendall(encode(Info(seq=1)) + encode(Info(seq=2)))
    daemon.transport.io(connection.sock, selectors.EVENT_READ)
    assert frames_sent(client) == 1
    assert connection in daemon.transport.backlog
    daemon.transport.shares.new_turn()
    daemon.transport.serve_backlog()
    assert frames_sent(client) == 1
    assert connection not in daemon.transport.backlog


@pytest.mark.usefixtures("slice_overrun")
def test_part_of_a_frame_behind_one_past_its_slice_is_read_not_kept_for_a_turn(
    served: tuple[Daemon, socket.socket, Connection],
) -> None:
    """The rest of a cut frame comes from the socket: the connection stays readable."""
    daemon, client, connection = served
    second = encode(Info(seq=2))
    client.sendall(encode(Info(seq=1)) + second[:5])
    daemon.transport.io(connection.sock, selectors.EVENT_READ)
    assert frames_sent(client) == 1
    assert connection not in daemon.transport.backlog
    client.sendall(second[5:])
    daemon.transport.shares.new_turn()
    daemon.transport.io(connection.sock, selectors.EVENT_READ)
    assert frames_sent(client) == 1


@pytest.mark.usefixtures("slice_overrun")
def test_a_connection_whose_apps_slice_is_spent_is_not_read_until_its_next_turn(
    stepped: Daemon,
) -> None:
    """Two connections of one app: the second is left unread (its bytes stay in the
    socket) once the first spent the app's slice, and is read and served next turn."""
    (first, one), (second, other) = welcomed(stepped), welcomed(stepped)
    with first, second:
        stepped.transport.shares.new_turn()
        first.sendall(encode(Info(seq=1)))
        second.sendall(encode(Info(seq=1)))
        stepped.transport.io(one.sock, selectors.EVENT_READ)
        stepped.transport.io(other.sock, selectors.EVENT_READ)
        assert (frames_sent(first), frames_sent(second)) == (1, 0)
        assert other.wire.pending == 0, "not read: its bytes wait in its socket"
        assert other in stepped.transport.backlog
        stepped.transport.serve_backlog()
        assert frames_sent(second) == 0, "still this turn"
        stepped.transport.shares.new_turn()
        stepped.transport.serve_backlog()
        assert frames_sent(second) == 1
        assert other not in stepped.transport.backlog


class SlowToRead:
    """A connection's socket whose reads take at least `seconds` (as a large read may)."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self._sock = sock
        self._seconds = seconds

    def recvmsg(self, *args: Any) -> Any:
        time.sleep(self._seconds)
        return self._sock.recvmsg(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_the_time_a_read_takes_counts_against_its_apps_slice(stepped: Daemon) -> None:
    """The first connection's frame is served (a slice begun takes one), and its read's
    time is its app's: the app's second connection waits for the next turn."""
    (first, one), (second, other) = welcomed(stepped), welcomed(stepped)
    with first, second:
        one.sock = SlowToRead(one.sock, 0.2)  # type: ignore[assignment]
        stepped.transport.shares.new_turn()
        first.sendall(encode(Info(seq=1)))
        second.sendall(encode(Info(seq=1)))
        stepped.transport.io(other.sock, selectors.EVENT_READ)  # warm: the app's own share
        assert frames_sent(second) == 1
        stepped.transport.shares.new_turn()
        second.sendall(encode(Info(seq=2)))
        stepped.transport.io(one.sock, selectors.EVENT_READ)
        assert frames_sent(first) == 1
        seconds_left = stepped.transport.shares.left(share_key(one))[1]
        assert seconds_left <= TURN_SLICE_S - 0.2
        stepped.transport.io(other.sock, selectors.EVENT_READ)
        assert frames_sent(second) == 0, "its app's slice went on the other's read"
