"""A connection's inference lane served in its model host: the data plane.

The client's lane frame (`daemon.wire.lane`) comes to the host directly and the reply goes
straight back; no thread of the daemon touches the tensors. Before it runs anything the host
asks the daemon's device scheduler on a gate of the lane's own (`daemon.wire.gate`), a
socket that a thread of the daemon serves apart from its loop: `ASK`, then `GO` (or `END`:
refused, cancelled, failed before it ran), and `DONE` once the run is over. A `GO` may
carry a lease: until its deadline, and while the host's grant page (written by the daemon
only, mapped read-only here) holds the lease's generation, further runs of the same model
and priority start without asking; the host ends a lease with `DONE` when one of those no
longer holds, when another model or priority comes, or when no request has come for a
while after a run (`HostSettings.lease_idle_us`).

Nothing here is believed by the daemon for scheduling or accounting: it counts the host's
time from the kernel (`daemon.server.audit`). The host checks the client's inputs against
the model (as the daemon's driver would) and the segment bounds before it asks.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from npumanager.daemon.host.lanes import LaneServer, Ran
from npumanager.daemon.host.memory import explained
from npumanager.daemon.host.segment import Segment
from npumanager.daemon.wire import gate
from npumanager.daemon.wire.gate import Done, Op
from npumanager.daemon.wire.lane import Request, Status, encode_reply
from npumanager.errors import IllegalArgumentError, ModelHostError
from npumanager.vendor_drivers.realexec.osprio import lower_thread_priority
from npumanager.vendor_drivers.realexec.session import Call, Session, check_feeds

BACKGROUND_NICE = 10
"""How much lower a background inference's thread runs (`nice` steps), as the driver's own
background workers do."""
_STATUSES = {int(s): s for s in (Status.REFUSED, Status.CANCELLED, Status.FAILED)}


@dataclass
class Lease:
    """Runs of one model and priority the host may start without asking."""

    key: tuple[int, int]
    seq: int
    model_id: int
    work_id: int
    until_ns: int
    generation: int
    background: bool
    runs: int = 1


class Runs:
    """What a direct lane needs of its host: the sessions by handle, and the calls in
    flight, so that the daemon's `cancel` reaches them."""

    def named(self, client: int, handle: int) -> tuple[int, Session]:
        """The host's model id and session of client `client`'s model ``handle``."""
        raise NotImplementedError

    def begin(self, runner: int, run_id: int, call: Call) -> None:
        """`call` runs for `run_id` on `runner` (cancelled at once if cancelled before)."""
        raise NotImplementedError

    def end(self, runner: int, run_id: int) -> None:
        """`run_id`'s call on `runner` is over."""
        raise NotImplementedError


class DirectLane(LaneServer):
    """One connection's lane, served in its host under the daemon's grants."""

    def __init__(
        self,
        sock: socket.socket,
        gate_sock: socket.socket,
        segment: Segment,
        pages: tuple[mmap.mmap, mmap.mmap],
        runs: Runs,
        lane: tuple[int, int],
        idle_s: float,
    ) -> None:
        client, index = lane
        super().__init__(sock, f"npu-host-lane-{index}")
        self._client = client
        self._idle_s = idle_s
        self._gate = gate_sock
        self._segment = segment
        self._page, self._tally = pages
        self._runs = runs
        self._index = index
        self._seq = 0
        self._lease: Lease | None = None
        self._done: bytes | None = None
        """The `DONE` to send once the reply has gone."""
        self._background: ThreadPoolExecutor | None = None
        self._buffer = bytearray(gate.MAX_GATE_FRAME_BYTES)
        self._checked_feeds: tuple[dict[str, np.ndarray], Session, dict[str, np.ndarray]] | None
        self._checked_feeds = None
        """The last request's feeds, the session they were checked for, and as checked."""

    def segment(self) -> Segment:
        return self._segment

    def repeated(self) -> None:
        self._count(repeated=1)

    def _count(self, runs: int = 0, repeated: int = 0, background: int = 0) -> None:
        """Add to the lane's tally (`daemon.wire.gate.TALLY`): what `info` shows of it."""
        was = gate.TALLY.unpack_from(self._tally)
        gate.TALLY.pack_into(self._tally, 0, was[0] + runs, was[1] + repeated, was[2] + background)

    def infer(self, request: Request, feeds: dict[str, np.ndarray]) -> Ran | bytes:
        model_id, session = self._runs.named(self._client, request.model)
        checked = self._checked_feeds
        if checked is not None and checked[0] is feeds and checked[1] is session:
            feeds = checked[2]  # the lane's last request again, checked then
        else:
            self._checked_feeds = None
            given, feeds = feeds, check_feeds(session.inputs, feeds)
            self._checked_feeds = (given, session, feeds)
        key = (request.model, request.job_priority)
        lease = self._lease
        if lease is not None:
            if lease.key == key and self._holds(lease):
                ran = self._run(session, feeds, lease.seq, lease.background)
                if not isinstance(ran, BaseException):
                    lease.runs += 1
                    return Ran(lease.work_id, ran)
                self._taken()
                text = explained(str(ran))
                self._tell(Op.DONE, lease.seq, Done.FAILED, runs=lease.runs, text=text)
                return self._answered(lease.seq, model_id, session, feeds, key)
            self.give_back()
        self._seq += 1
        self._tell(Op.ASK, self._seq, model=request.model, work_id=request.job_priority)
        return self._answered(self._seq, model_id, session, feeds, key)

    def replied(self) -> None:
        done, self._done = self._done, None
        if done is not None:
            self._ending_on_a_closed_gate(lambda: self._send(done))

    def idle(self) -> None:
        self._ending_on_a_closed_gate(self.give_back)

    def _ending_on_a_closed_gate(self, tell: Callable[[], None]) -> None:
        """Tell the gate something between requests; if the daemon closed it (it is
        shutting down, or dropped the connection), the lane ends."""
        try:
            tell()
        except ModelHostError:
            self.close()

    def give_back(self) -> None:
        """End the lease held (`DONE` with the runs it covered)."""
        lease = self._taken()
        if lease is not None:
            self._tell(Op.DONE, lease.seq, Done.COMPLETED, runs=lease.runs)

    def _taken(self) -> Lease | None:
        """The lease held, no longer held: the lane's receive waits for ever again."""
        lease, self._lease = self._lease, None
        self.idle_after(None)
        return lease

    def _holds(self, lease: Lease) -> bool:
        """True while the lease is in force: before its deadline, under its generation."""
        return (
            time.monotonic_ns() < lease.until_ns
            and gate.PAGE.unpack_from(self._page)[0] == lease.generation
        )

    def _answered(
        self,
        seq: int,
        model_id: int,
        session: Session,
        feeds: dict[str, np.ndarray],
        key: tuple[int, int],
    ) -> Ran | bytes:
        """Wait for the gate's word on run `seq`: run it on each `GO` (again after a
        failure the daemon may requeue, as a run stopped to make room is), until it ends."""
        while True:
            frame = self._receive()
            if frame.seq != seq:
                continue  # the daemon's last word on a run that ended here already
            if frame.op == Op.END:
                kind, _, message = frame.text.partition(": ")
                status = _STATUSES.get(frame.status, Status.FAILED)
                return encode_reply(status, frame.work_id, kind=kind, message=message)
            if frame.op != Op.GO:
                raise ModelHostError(f"the daemon's gate sent {frame.op.name} for run {seq}")
            if frame.model != model_id:
                self._tell(Op.DONE, seq, Done.FAILED, text="the grant names another model")
                continue
            background = frame.status == 1
            ran = self._run(session, feeds, seq, background)
            if isinstance(ran, BaseException):
                self._tell(
                    Op.DONE, seq, Done.FAILED, text=explained(str(ran) or type(ran).__name__)
                )
                continue
            if frame.lease_until_ns:
                self.idle_after(self._idle_s)
                self._lease = Lease(
                    key,
                    seq,
                    model_id,
                    frame.work_id,
                    frame.lease_until_ns,
                    frame.lease_generation,
                    background,
                )
            else:
                self._done = gate.encode(Op.DONE, seq, status=Done.COMPLETED, model=1)
            return Ran(frame.work_id, ran)

    def _run(
        self, session: Session, feeds: dict[str, np.ndarray], seq: int, background: bool
    ) -> list[Any] | BaseException:
        """One inference (on a niced thread for the background): its outputs, or what it
        raised (the daemon's cancel included)."""
        call = Call(background)
        self._count(runs=1, background=int(background))
        self._runs.begin(self._index, seq, call)
        try:
            if background:
                return self._niced().submit(_outputs, session, feeds, call).result()
            return _outputs(session, feeds, call)
        except Exception as exc:
            exc.__traceback__ = None
            return exc
        finally:
            self._runs.end(self._index, seq)

    def _niced(self) -> ThreadPoolExecutor:
        if self._background is None:
            self._background = ThreadPoolExecutor(
                1, f"npu-host-lane-{self._index}-background", _lowered
            )
        return self._background

    def _tell(self, op: Op, seq: int, status: int = 0, *, runs: int = 0, **fields: Any) -> None:
        self._send(gate.encode(op, seq, status=status, **({"model": runs} | fields)))

    def _send(self, frame: bytes) -> None:
        try:
            self._gate.sendall(frame)
        except OSError:
            raise ModelHostError("the daemon closed the lane's gate") from None

    def _receive(self) -> gate.Frame:
        try:
            size = self._gate.recv_into(self._buffer)
        except OSError:
            size = 0
        if size == 0:
            raise ModelHostError("the daemon closed the lane's gate")
        return gate.decode(memoryview(self._buffer)[:size])

    def _serve(self) -> None:
        try:
            super()._serve()
        finally:
            self._gate.close()
            if self._background is not None:
                self._background.shutdown(wait=False)


def _outputs(session: Session, feeds: dict[str, np.ndarray], call: Call) -> list[Any]:
    return [np.asarray(out) for out in session.run(feeds, call)]


def _lowered() -> None:
    lower_thread_priority(BACKGROUND_NICE, False)


def checked_lane(
    fds: list[int], size: int
) -> tuple[socket.socket, socket.socket, Segment, tuple[mmap.mmap, mmap.mmap]]:
    """The lane, gate, segment (mapped read-write, `size` bytes), grant page (read-only) and
    tally page from the five descriptors of a `lane` request (each taken: closed on failure)."""
    if len(fds) != 5:
        raise IllegalArgumentError(f"a lane comes with 5 descriptors, not {len(fds)}")
    taken, fds[:] = list(fds), []
    lane_fd, gate_fd, segment_fd, page_fd, tally_fd = taken
    try:
        memory = mmap.mmap(segment_fd, size, flags=mmap.MAP_SHARED)
        page = mmap.mmap(page_fd, gate.PAGE_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        tally = mmap.mmap(tally_fd, gate.PAGE_BYTES, flags=mmap.MAP_SHARED)
        lane, gate_sock = socket.socket(fileno=lane_fd), socket.socket(fileno=gate_fd)
    except BaseException:
        for fd in taken:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    for fd in (segment_fd, page_fd, tally_fd):
        os.close(fd)
    lane.setblocking(True)
    gate_sock.setblocking(True)
    return lane, gate_sock, Segment(memory, size), (page, tally)
