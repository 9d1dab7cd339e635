"""The client's end of an inference lane, against a peer in this process: it polls for a
reply while replies come within its spin, and sleeps in `recv` otherwise."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import npumanager as npu
from npumanager.daemon.client.lane import ClientLane
from npumanager.daemon.wire.lane import Kind, Status, encode_reply, encode_request
from npumanager.schemas.limits import MAX_LANE_SPIN_US

FRAME = encode_request(Kind.INFER, 1, 0, (0, 4096))


class Recorded:
    """A socket that notes whether each `recvmsg_into` polled (MSG_DONTWAIT) or slept."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.calls: list[str] = []

    def recvmsg_into(self, buffers: list[bytearray], ancbufsize: int = 0, flags: int = 0) -> Any:
        self.calls.append("poll" if flags & socket.MSG_DONTWAIT else "sleep")
        return self.sock.recvmsg_into(buffers, ancbufsize, flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


@contextlib.contextmanager
def lane_with_peer(spin_us: int, delay_s: float) -> Iterator[tuple[ClientLane, Recorded]]:
    """A lane whose peer answers each request `delay_s` after it came."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def answer() -> None:
        while theirs.recv(65536):
            time.sleep(delay_s)
            theirs.sendall(encode_reply(Status.COMPLETED, 7))
        theirs.close()

    peer = threading.Thread(target=answer, daemon=True)
    peer.start()
    recorded = Recorded(mine)
    lane = ClientLane(recorded, spin_us)  # type: ignore[arg-type]
    try:
        yield lane, recorded
    finally:
        lane.close()
        peer.join(5)


def exchanges(lane: ClientLane, recorded: Recorded, count: int) -> list[str]:
    """How the lane waited for the replies of `count` more requests."""
    recorded.calls.clear()
    for _ in range(count):
        reply = lane.exchange(FRAME)
        assert (reply.status, reply.work_id) == (Status.COMPLETED, 7)
    return list(recorded.calls)


def test_a_lane_polls_while_its_replies_come_within_its_spin() -> None:
    with lane_with_peer(spin_us=MAX_LANE_SPIN_US, delay_s=0.0) as (lane, recorded):
        assert exchanges(lane, recorded, 1) in (["sleep"], ["poll", "sleep"])  # nothing learnt
        waits = exchanges(lane, recorded, 20)
        assert "poll" in waits
        assert waits.count("sleep") < 20, "most replies were polled for, not slept for"


def test_a_lane_sleeps_once_its_replies_take_longer_than_its_spin() -> None:
    with lane_with_peer(spin_us=200, delay_s=0.02) as (lane, recorded):
        exchanges(lane, recorded, 1)  # learns that replies take 20 ms
        assert exchanges(lane, recorded, 5) == ["sleep"] * 5


def test_a_lane_with_no_spin_always_sleeps() -> None:
    with lane_with_peer(spin_us=0, delay_s=0.0) as (lane, recorded):
        assert exchanges(lane, recorded, 10) == ["sleep"] * 10


@pytest.mark.parametrize("spin", [-1, MAX_LANE_SPIN_US + 1, 1.5, "100"])
def test_connect_refuses_a_spin_out_of_range_before_it_connects(spin: object) -> None:
    with pytest.raises(
        npu.IllegalArgumentError, match=f"lane_spin_us must be .*0..{MAX_LANE_SPIN_US}"
    ):
        npu.connect("/nonexistent/npu.sock", lane_spin_us=spin)  # type: ignore[arg-type]
