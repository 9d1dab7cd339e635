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


def test_a_lease_given_back_after_the_daemon_closed_the_gate_ends_the_lane_quietly() -> None:
    """A daemon shutting down closes every lane's gate; a host holding a lease then finds
    its client idle and gives the lease back on the closed gate. The lane must end there,
    not die with a traceback (the daemon's log showed one from a host's lane thread)."""
    import mmap
    import threading

    from npumanager.daemon.host.direct import DirectLane, Lease, Runs

    raised: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: raised.append(args.exc_value)  # type: ignore[assignment,misc]
    try:
        client, lane_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        daemon_gate, host_gate = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pages = (mmap.mmap(-1, 4096), mmap.mmap(-1, 4096))
        segment = Segment(mmap.mmap(-1, 4096), 4096)
        lane = DirectLane(lane_end, host_gate, segment, pages, Runs(), (1, 0), WAIT_S)
        lane._lease = Lease((1, 0), 1, 1, 1, time.monotonic_ns() + 10**9, 0, False)
        daemon_gate.close()  # the daemon shut down
        lane.idle_after(WAIT_S)
        lane.start()
        lane._thread.join(60)
        assert lane.finished()
        assert raised == []
        client.close()
    finally:
        threading.excepthook = previous
