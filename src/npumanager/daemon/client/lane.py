"""The client's end of its inference lane (`daemon.lane`): `LoadedModel.run` by the caller.

The calling thread writes the inputs into the lane's own region of the segment, sends one
frame and reads the reply itself: no reader thread between it and the daemon. One thread
uses the lane at a time; a second caller meanwhile, a run with a timeout and `submit`
take the connection's own path. A lane interrupted mid-exchange (a signal, a dropped
daemon) is closed for good, and the connection's path serves from then on.

A run with a timeout goes over the lane too: when its reply has not come by the deadline,
`exchange` calls its `on_late` (the client sends `cancel_lane` on the connection), then
waits for the reply the cancel brings, and marks the exchange `late`. A cancel can reach
the daemon before the lane's thread has started the inference, and cancel nothing: then
it is sent again, at growing intervals, until one lands or the reply comes.

A thread asleep in `recv` takes a while to wake when the reply comes, longest where the
core it slept on went idle (a virtual machine's core is handed back to the host). So while
the lane's replies come within `spin_us` (a running mean of the waits), the caller polls
the socket for up to twice that mean, at most `spin_us`, before it sleeps: a short
inference is answered sooner for at most `spin_us` of the caller's CPU, and a long one is
slept through as before.

A run like the last one (the same model and priority, inputs of the same names, dtypes and
shapes, in the same places) sends the last frame again (`Sent`), and a reply that differs
from the last one only in its work id is read as that one was (`Answered`): the frames
are made and decoded once, not at every run.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from npumanager.daemon.client.shared_memory import ClientSegment
from npumanager.daemon.wire.lane import (
    MAX_LANE_FRAME_BYTES,
    REPLY_WORK_ID_AT,
    Reply,
    Status,
    decode_reply,
)
from npumanager.daemon.wire.tensors import aligned
from npumanager.errors import DaemonUnavailableError, IllegalArgumentError

_CANCEL_AGAIN_S = (0.005, 0.5)
"""How soon a cancel that found nothing running is sent again: 5 ms, doubling to 0.5 s."""
_TRUNCATED = int(socket.MSG_TRUNC)
_DONTWAIT = int(socket.MSG_DONTWAIT)


class Sent(NamedTuple):
    """The lane's last inference request: what it was made of (`key`), the region it
    used, its frame, and the arrays its copied inputs went into with their index."""

    key: tuple[Any, ...]
    base: int
    room: int
    frame: bytes
    copies: list[tuple[np.ndarray, int]]


class Answered(NamedTuple):
    """The lane's last completed reply, less its work id, as decoded, with the arrays
    over its outputs in the segment (filled in by the first run that copies them out)."""

    head: bytes
    tail: bytes
    reply: Reply
    views: list[np.ndarray]


class ClientLane:
    """One lane socket; `exchange` is one request and its reply."""

    def __init__(self, sock: socket.socket, spin_us: int = 0) -> None:
        self._sock = sock
        self._spin_ns = spin_us * 1000
        self._wait_ns = -1
        """The running mean of the waits for a reply (-1 before the first)."""
        self._lock = threading.Lock()
        self._buffer = bytearray(MAX_LANE_FRAME_BYTES)
        self._region = (0, 0)
        """The lane's own region of the segment, as (offset, size), kept from run to run."""
        self.sent: Sent | None = None
        self.answered: Answered | None = None
        self.open = True
        self.late = False
        """True when the last exchange's reply came after its deadline (it was cancelled)."""

    def try_take(self) -> bool:
        """Take the lane for one run: False if it is closed or another thread has it."""
        return self.open and self._lock.acquire(blocking=False)

    def give_back(self) -> None:
        """The run is over."""
        self._lock.release()

    def region(self, segment: ClientSegment, nbytes: int, timeout: float) -> int:
        """The offset of the lane's region, grown to at least `nbytes` (the lane taken)."""
        offset, size = self._region
        if size < nbytes:
            if size:
                segment.release(offset, size)
                self._region = (0, 0)
            self._region = (segment.allocate(nbytes, timeout), aligned(nbytes))
        return self._region[0]

    def exchange(
        self,
        frame: bytes,
        deadline: float | None = None,
        on_late: Callable[[], bool] | None = None,
    ) -> Reply:
        """Send one request and read its reply (the lane taken); past `deadline` (a
        `time.monotonic` instant) `on_late` is called until it says it cancelled something
        (or the reply came), and the reply still awaited."""
        self.late = False
        try:
            self._sock.sendall(frame)
            if deadline is not None and not self._ready_by(deadline):
                self.late = True
                again = _CANCEL_AGAIN_S[0]
                while on_late is not None and not on_late():
                    if self._ready_by(time.monotonic() + again):
                        break
                    again = min(again * 2, _CANCEL_AGAIN_S[1])
            size, flags = self._receive()
        except OSError:
            self.close()
            raise DaemonUnavailableError("the daemon closed the inference lane") from None
        except BaseException:
            self.close()  # its reply would come to the next request
            raise
        if size == 0 and not flags & _TRUNCATED:
            self.close()
            raise DaemonUnavailableError("the daemon closed the inference lane")
        buffer, answered = self._buffer, self.answered
        if (
            answered is not None
            and not flags & _TRUNCATED
            and buffer[:REPLY_WORK_ID_AT] == answered.head
            and buffer[REPLY_WORK_ID_AT + 8 : size] == answered.tail
        ):
            at = REPLY_WORK_ID_AT
            work_id = int.from_bytes(buffer[at : at + 8], "little", signed=True)
            return answered.reply._replace(work_id=work_id)
        try:
            if flags & _TRUNCATED:
                raise IllegalArgumentError("the daemon's lane reply is over the lane's limit")
            reply = decode_reply(memoryview(buffer)[:size])
        except IllegalArgumentError as exc:
            self.close()
            raise DaemonUnavailableError(
                f"the daemon sent an unreadable lane reply: {exc}"
            ) from None
        self.answered = None
        if reply.status == Status.COMPLETED:
            at = REPLY_WORK_ID_AT
            head, tail = bytes(buffer[:at]), bytes(buffer[at + 8 : size])
            self.answered = Answered(head, tail, reply, [])
        return reply

    def _ready_by(self, deadline: float) -> bool:
        """Wait until the reply is there (True) or `deadline` has passed (False)."""
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if poller.poll(max(0, int(left * 1000) + 1)):
                return True
            if left <= 0:
                return False

    def _receive(self) -> tuple[int, int]:
        """The reply's size and flags: polled for while replies come quickly, else slept for."""
        sent, spin, mean = time.perf_counter_ns(), self._spin_ns, self._wait_ns
        receive, buffers = self._sock.recvmsg_into, [self._buffer]
        if spin and 0 <= mean <= spin:
            until = sent + min(spin, 2 * mean)
            while True:
                try:
                    size, _, flags, _ = receive(buffers, 0, _DONTWAIT)
                    break
                except BlockingIOError:
                    if time.perf_counter_ns() >= until:
                        size, _, flags, _ = receive(buffers)
                        break
        else:
            size, _, flags, _ = receive(buffers)
        waited = time.perf_counter_ns() - sent
        self._wait_ns = waited if mean < 0 else mean + (waited - mean) // 8
        return size, flags

    def close(self) -> None:
        """Close the lane; the connection's own path serves from now on."""
        self.open = False
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
