"""A connection's lane served in its model host (the data plane), and the daemon's end of
the lane's gate (`daemon.wire.gate`): the device scheduler's word on each of its runs.

The client's lane goes to its host (`daemon.host.direct`), which reads the inputs in the
client's segment, runs them and writes the outputs there itself. Before a run the host
asks here: a thread of the gate's own (not the loop) submits a `DirectRun` to the driver
as the lane's own inference would be submitted (the same bands, fair share, floors,
events, cancellation and preemption), and when the driver runs it, the thread that runs it
lets the host go (`GO`) and waits for the host's `DONE`. A `GO` may lease the channel for
up to `lease_us`: the host runs further requests of the same model and priority without
asking, until the lease's deadline, until the host gives it back, or until the daemon takes
it back by moving the host's grant page on (a cancel, an unload, room made for more
important work). A lease not given back `LEASE_OVERRUN_S` past its deadline is taken back
and its channel freed; its grant, for the audit, stays open until the host speaks again
(the `DONE` of the run it was in, or its next ask): a single run may outlast a lease, and a
cancel meanwhile (the client's timeout) goes to that run in the host. A grant the daemon
stopped (a cancel, an unload, room made) counts `STOPPED_GRANT_S` more at most: a host that
does not heed the stop is over its grants. What the host
computes beyond its grants is counted against it by the kernel (`daemon.server.audit`),
never by its word.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import threading
import time
import weakref
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING, Any

from npumanager.core.driver.job import DirectRun
from npumanager.core.service.service import Service
from npumanager.daemon.host.client import HostedSession, ModelHost
from npumanager.daemon.host.lanes import Served
from npumanager.daemon.server.frames import call_error
from npumanager.daemon.server.lane import INTERNAL, ON_THE_LANE
from npumanager.daemon.server.running import Running
from npumanager.daemon.server.stats import DaemonStats
from npumanager.daemon.wire import gate
from npumanager.daemon.wire.gate import Done, Op
from npumanager.daemon.wire.lane import Status
from npumanager.errors import (
    ExecutionError,
    IllegalArgumentError,
    ModelHostError,
)
from npumanager.schemas.limits import LEASE_OVERRUN_S, MAX_PRIORITY, MIN_PRIORITY

if TYPE_CHECKING:
    from npumanager.daemon.server.calls import Calls
    from npumanager.daemon.server.connection import Connection


class GateClosedError(ModelHostError):
    """The host's end of a gate closed: its lane ended (its client closed it), or the host
    did. Why the host ended is asked for (which may wait for its reader) only where a run
    in flight fails with it."""


class Gate(Served):
    """One connection's lane in its host, as the connection sees it (`cancel`, `close`),
    and the thread that answers the host's asks."""

    def __init__(
        self,
        lane: socket.socket,
        connection: Connection,
        host: ModelHost,
        service: Service,
        calls: Calls,
        stats: DaemonStats,
    ) -> None:
        segment = connection.segment
        if segment is None:
            raise IllegalArgumentError("a lane needs the connection's shared segment first")
        tally_fd = os.memfd_create("npu-lane-tally", os.MFD_CLOEXEC)
        try:
            os.ftruncate(tally_fd, gate.PAGE_BYTES)
            self._tally = mmap.mmap(tally_fd, gate.PAGE_BYTES, flags=mmap.MAP_SHARED)
            client = connection.manager.client if connection.manager is not None else -1
            segment_of = (segment.shared.fd, segment.size)
            sock, self._index = host.open_lane(client, lane, segment_of, tally_fd)
        finally:
            os.close(tally_fd)
        self._counted = (0, 0, 0)
        self._inline_grants = self._worker_grants = 0
        """The runs this gate granted, run by its own thread or by the driver's workers."""
        """The tally as last read: a host's count only ever grows here."""
        super().__init__(sock, f"npu-gate-{connection.peer.uid}")
        self._connection = weakref.ref(connection)
        self._uid = connection.peer.uid
        self._host = host
        self._backend = service.backend
        self._calls = calls
        self._stats = stats
        self._lease_ns = host.settings.lease_us * 1000
        self._running = Running(service)
        self._granting = threading.Condition()
        self._granted = False
        """True while a thread that runs a grant reads the gate (for the host's `DONE`)."""
        self._overran: int | None = None
        """The seq of a lease that overran: its grant stays open until the host's next frame,
        and a cancel goes to the run the host is in under it."""
        self._grant_id = 0
        """The id of the last grant this gate opened (`ModelHost.grants`)."""
        self._asked: gate.Frame | None = None
        """The host's last `ASK` (a run the driver stopped after its lease overran is asked
        for again with it)."""
        self._cancelled = self._stopped = self._told = 0
        """The last seq the client cancelled, the last the driver stopped (`_stop`), and the
        last the host was sent `END` for."""
        self._buffer = bytearray(gate.MAX_GATE_FRAME_BYTES)
        stats.tallied(self)

    def cancel(self) -> bool:
        """Cancel the run the lane's host asked for, or the run it is in under a lease that
        overran (no work of the driver's is live then): False if there is none."""
        asked = self._asked
        if asked is not None and self._running.cancel():
            self._cancelled = asked.seq
            return True
        overran = self._overran
        if overran is None:
            return False
        self._cancelled = overran
        self._host.grants.stopped(self._grant_id)
        self._host.tell("cancel", run=overran, runner=self._index)
        return True

    def tally(self) -> dict[str, int]:
        """What the lane's host says it ran (`daemon.wire.gate.TALLY`), never less than it
        said before: for `info` only. Runs a lease covered count as the grant that began it
        would: on the lane's own thread (inline) in the foreground, else as the workers'."""
        said = gate.TALLY.unpack_from(self._tally)
        runs, repeated, background = (max(a, b) for a, b in zip(self._counted, said, strict=True))
        repeated, background = min(repeated, runs), min(background, runs)
        self._counted = (runs, repeated, background)
        return {
            "inferences_on_lane": runs,
            "direct_runs": runs,
            "lane_frames_repeated": repeated,
            "inferences_inline": max(0, runs - background - self._inline_grants),
            "inferences_to_workers": max(0, background - self._worker_grants),
        }

    # The gate's thread ------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while True:
                frame = self._receive(None)
                if frame is None:
                    return
                overran = self._close_overrun()
                if frame.op == Op.DONE:
                    self._after_overrun(frame, overran)
                    continue
                if frame.op != Op.ASK:
                    raise IllegalArgumentError(f"a host sent {frame.op.name} where it may ask")
                self._ask(frame)
        except IllegalArgumentError as exc:
            INTERNAL.warning(
                "the model host of uid %d broke its gate's protocol (%s); killed", self._uid, exc
            )
            self._host.kill()
        except ModelHostError:
            pass  # the host went; its death is told where it is noticed
        except Exception as exc:
            self._stats.internal_errors += 1
            INTERNAL.internal_error("a gate of uid %d raised", self._uid, exc=exc)
        finally:
            self._close_overrun()
            self._sock.close()
            self._stats.retire(self)

    def _close_overrun(self) -> int | None:
        """The host spoke again (or is gone) after its lease overran: that grant ends (its
        seq returned, or None if none had overrun)."""
        overran, self._overran = self._overran, None
        if overran is not None:
            self._host.grants.closed(self._grant_id)
        return overran

    def _after_overrun(self, frame: gate.Frame, overran: int | None) -> None:
        """A `DONE` of a grant that ended here already (its lease overran). A run that
        failed under it waits for the daemon's word, as any failed run does, and the
        driver's work is over: cancelled if the client cancelled it; asked for again if
        the driver stopped it (to make room: the driver would have requeued it); else
        failed."""
        seq = frame.seq
        if frame.status == Done.COMPLETED or seq != overran or self._told == seq:
            return  # it ran, or it has the daemon's word already
        asked = self._asked
        if self._cancelled == seq:
            self._end(seq, Status.CANCELLED, 0, "", "")
        elif self._stopped == seq and asked is not None and asked.seq == seq:
            self._ask(asked, requeued=True)
        else:
            self._end(seq, Status.FAILED, 0, "ExecutionError", frame.text or "the run failed")

    def _ask(self, frame: gate.Frame, requeued: bool = False) -> None:
        """Submit the run the host asks for, and wait until it ends; tell the host how it
        ended unless it ran (the host knows then). A run `requeued` that cannot be
        submitted (its model unloaded) ended cancelled, as the driver's requeued work would."""
        self._asked = frame
        seq = frame.seq
        try:
            connection = self._connection()
            if connection is None or connection.closed:
                raise IllegalArgumentError("the lane's connection has closed")
            model = self._calls.model(connection, frame.model)
            del connection
            priority = frame.work_id
            if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
                raise IllegalArgumentError(
                    f"job priority {priority} is outside {MIN_PRIORITY}..{MAX_PRIORITY}"
                )
            direct = DirectRun(_unset)
            direct.grant = lambda session, call: self._grant(seq, direct, session, call)
            work = self._backend.submit_inference(
                model, direct, priority, None, None, None, ON_THE_LANE
            )
        except Exception as exc:
            error = call_error(0, exc, self._stats, "a lane request", self._uid)
            if requeued:
                self._end(seq, Status.CANCELLED, 0, "", "")
            else:
                self._end(seq, Status.REFUSED, 0, error.kind, error.message)
            return
        stats = self._stats
        stats.inferences_direct += 1
        if work.inline is not None:
            stats.inferences_inline += 1
            self._inline_grants += 1
        else:
            stats.inferences_to_workers += 1
            self._worker_grants += 1
        self._running.now(model, work.work_id)
        ended: tuple[Status, str, str] | None = None
        try:
            self._backend.outputs(work)
        except CancelledError:
            ended = (Status.CANCELLED, "", "")
        except Exception as exc:
            exc.__traceback__ = None  # the work keeps it: no cycle through this frame
            ended = (Status.FAILED, type(exc).__name__, str(exc))
        finally:
            self._running.now(None)
        with self._granting:  # a worker that runs the grant may still read the gate
            while self._granted:
                self._granting.wait()
        if ended is not None:
            self._end(seq, ended[0], work.work_id, ended[1], ended[2])

    # The thread that runs a grant (the gate's, or a driver worker's) -------------------

    def _grant(self, seq: int, direct: DirectRun, session: Any, call: Any) -> list[Any]:
        """Let the host run `seq` (leasing the channel if `lease_us`), and wait for its
        `DONE`; a failed run raises, and the driver ends or requeues the work."""
        host = self._host
        if not isinstance(session, HostedSession) or session.host is not host:
            raise ExecutionError("the model is not in this lane's host")
        with self._granting:
            self._granted = True
        self._grant_id = grant = host.grants.opened()
        try:
            lease = self._lease_ns
            until = time.monotonic_ns() + lease if lease else 0
            call.arm(lambda: self._stop(seq, grant))
            self._send(
                gate.encode(
                    Op.GO,
                    seq,
                    status=int(call.background),
                    model=session.model_id,
                    work_id=direct.work_id,
                    lease_until_ns=until,
                    lease_generation=host.page.generation,
                )
            )
            return self._done(seq, until)
        except GateClosedError:
            raise ModelHostError(f"the model host {host.ending()}") from None
        finally:
            if self._overran is None:
                host.grants.closed(grant)
            with self._granting:
                self._granted = False
                self._granting.notify_all()

    def _done(self, seq: int, until: int) -> list[Any]:
        """Wait for the host's `DONE` of `seq` (a lease: until `LEASE_OVERRUN_S` past
        `until`, then it is taken back)."""
        while True:
            timeout = None
            if until:
                timeout = max(0.0, (until - time.monotonic_ns()) / 1e9 + LEASE_OVERRUN_S)
            frame = self._receive(timeout)
            if frame is None:
                self._host.page.revoke()  # overran its lease: taken back
                self._overran = seq  # the run it is in keeps its grant until it speaks
                return []
            if frame.op != Op.DONE:
                self._host.kill()
                raise ModelHostError(
                    f"the model host sent {frame.op.name} while it ran; it was killed"
                )
            if frame.seq != seq:
                continue
            if frame.status == Done.COMPLETED:
                return []
            raise ExecutionError(frame.text or "the run failed")

    def _stop(self, seq: int, grant: int) -> None:
        """The driver cancels the grant: its lease is taken back, its run stopped, and its
        time counts `STOPPED_GRANT_S` more at most."""
        self._stopped = seq
        self._host.grants.stopped(grant)
        self._host.page.revoke()
        self._host.tell("cancel", run=seq, runner=self._index)

    # Frames -----------------------------------------------------------------------------

    def _end(self, seq: int, status: Status, work_id: int, kind: str, message: str) -> None:
        self._told = seq
        text = f"{kind}: {message}" if kind else message
        with contextlib.suppress(ModelHostError):
            self._send(gate.encode(Op.END, seq, status=status, work_id=work_id, text=text))

    def _send(self, frame: bytes) -> None:
        try:
            self._sock.sendall(frame)
        except OSError:
            raise GateClosedError("the model host closed the lane's gate") from None

    def _receive(self, timeout: float | None) -> gate.Frame | None:
        """The host's next frame (checked: `IllegalArgumentError`), None after `timeout`
        seconds; `GateClosedError` when the host's end has closed."""
        sock = self._sock
        try:
            if timeout is not None:
                sock.settimeout(timeout)
            try:
                size = sock.recv_into(self._buffer)
            finally:
                if timeout is not None:
                    sock.settimeout(None)
        except TimeoutError:
            return None
        except OSError:
            size = 0
        if size == 0:
            raise GateClosedError("the model host closed the lane's gate")
        return gate.decode(memoryview(self._buffer)[:size])


def _unset(session: Any, call: Any) -> list[Any]:
    raise ExecutionError("a direct run was not armed")
