"""A lane's idle wait: a model host gives its lease back when its client has sent nothing
for `lease_idle_us` (200 us). The wait must be that short: a socket receive timeout is
counted in the kernel's ticks (4 ms at HZ=250), and with one a host held each lease 6 to 8 ms
past its last run, the channel and its grant with it."""

from __future__ import annotations

import queue
import socket
import time

from npumanager.daemon.host.lanes import LaneServer
from npumanager.daemon.host.segment import Segment

IDLES = 20
WAIT_S = 200e-6


class Idling(LaneServer):
    """A lane that only waits: each idle is timed, and the wait set again."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock, "test-lane-idle")
        self.idled: queue.Queue[int] = queue.Queue()
        self.left = IDLES

    def segment(self) -> Segment:
        raise AssertionError("no request comes")

    def idle(self) -> None:
        self.idled.put(time.monotonic_ns())
        self.left -= 1
        self.idle_after(WAIT_S if self.left else None)


def test_an_idle_lane_is_told_within_a_fraction_of_a_kernel_tick() -> None:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    lane = Idling(theirs)
    lane.idle_after(WAIT_S)
    started = time.monotonic_ns()
    lane.start()
    stamps = [lane.idled.get(timeout=60) for _ in range(IDLES)]
    waits = [b - a for a, b in zip([started, *stamps], stamps, strict=False)]
    # A tick-counted timeout is never shorter than one tick (1 ms even at HZ=1000); on a
    # busy machine some waits run long, but not every one of twenty.
    assert min(waits) < 1_000_000, sorted(waits)
    assert lane.idled.empty()
    mine.close()
    lane._thread.join(60)
    assert lane.finished()


def test_a_lane_that_waits_for_ever_is_never_idle() -> None:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    lane = Idling(theirs)
    lane.idle_after(None)
    lane.start()
    mine.close()  # the lane's thread ends on the close, never having been idle
    lane._thread.join(60)
    assert lane.finished()
    assert lane.idled.empty()
