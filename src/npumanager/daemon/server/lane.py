"""Inference lanes in the daemon: `LoadedModel.run` on a socket and a daemon thread of its
connection's own, for a driver that runs models in the daemon's own process (with model
hosts, a lane goes to the connection's host instead: `daemon.server.direct`).

On the connection's own path an inference wakes the loop, waits its turn among every
client's frames, and its end goes back through the client's reader thread to the caller.
On a lane the caller sends one binary frame (`daemon.wire.lane`) and blocks in `recv`; the
lane's thread (`daemon.host.lanes.LaneServer`), blocked in `recv` too, checks the frame
against the connection's segment, runs the inference (on itself when a channel is free and
the app is not in the background, else on the driver's workers, as any inference) and
writes the outputs and the reply itself. Nothing of the loop's runs on the way.

The client makes the lane, a SOCK_SEQPACKET socketpair, and sends one end with
`open_lane` (SCM_RIGHTS). A lane acts for its connection only (its models, its segment,
its uid's priority), one inference at a time, and closes with it.
"""

from __future__ import annotations

import logging
import os
import socket
import weakref
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING

import numpy as np

from npumanager.core.driver.job import WorkMode
from npumanager.core.service.service import Service
from npumanager.daemon.host.lanes import REFUSAL_PAUSE_S, LaneServer, Ran
from npumanager.daemon.host.segment import Segment
from npumanager.daemon.peer import peer_credentials
from npumanager.daemon.server.frames import call_error
from npumanager.daemon.server.ratelog import RateLimitedLog
from npumanager.daemon.server.running import Running
from npumanager.daemon.server.stats import DaemonStats
from npumanager.daemon.wire.lane import Request, Status, encode_reply
from npumanager.errors import IllegalArgumentError

ON_THE_LANE = WorkMode.INLINE | WorkMode.FOREGROUND_ONLY | WorkMode.SYNC
"""A lane's thread runs a foreground inference itself, and only it waits for it."""

if TYPE_CHECKING:
    from npumanager.daemon.server.calls import Calls
    from npumanager.daemon.server.connection import Connection

log = logging.getLogger(__name__)
INTERNAL = RateLimitedLog(log)
"""The rate-limited log of lanes' internal errors."""

__all__ = ["REFUSAL_PAUSE_S", "Lane", "lane_socket"]


def lane_socket(fd: int, connection: Connection) -> socket.socket:
    """The lane end a client sent: a connected AF_UNIX SOCK_SEQPACKET socket made by the
    same uid (`IllegalArgumentError` otherwise; the descriptor is then closed)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        raise IllegalArgumentError(
            "open_lane needs a socket: one end of socketpair(AF_UNIX, SOCK_SEQPACKET)"
        ) from None
    try:
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
            raise IllegalArgumentError(
                f"open_lane needs an AF_UNIX SOCK_SEQPACKET socket; this one is "
                f"{sock.family.name} {sock.type.name}"
            )
        try:
            maker = peer_credentials(sock)
        except OSError:
            raise IllegalArgumentError(
                "open_lane needs a connected socket (a socketpair)"
            ) from None
        if maker.uid != connection.peer.uid:
            raise IllegalArgumentError(
                f"the lane's other end belongs to uid {maker.uid}, not to this client's "
                f"uid {connection.peer.uid}"
            )
        sock.setblocking(True)
    except BaseException:
        sock.close()
        raise
    return sock


class Lane(LaneServer):
    """One connection's lane in the daemon: its socket and the thread that serves it."""

    def __init__(
        self,
        sock: socket.socket,
        connection: Connection,
        service: Service,
        calls: Calls,
        stats: DaemonStats,
    ) -> None:
        super().__init__(sock, f"npu-lane-{connection.peer.uid}")
        self._connection = weakref.ref(connection)
        self._uid = connection.peer.uid
        self._backend = service.backend
        self._calls = calls
        self._stats = stats
        self.running = Running(service)
        """The work the lane waits for, while it waits (for `cancel`)."""

    def cancel(self) -> bool:
        """Cancel the inference the lane is running: False if it runs none (it ended)."""
        return self.running.cancel()

    def segment(self) -> Segment:
        connection = self._connection()
        if connection is None or connection.closed or connection.segment is None:
            raise IllegalArgumentError("the lane's connection has no shared segment")
        return connection.segment

    def repeated(self) -> None:
        self._stats.lane_frames_repeated += 1

    def refusal(self, exc: Exception) -> bytes:
        error = call_error(0, exc, self._stats, "a lane request", self._uid)
        return encode_reply(Status.REFUSED, kind=error.kind, message=error.message)

    def internal_error(self, exc: Exception) -> None:
        self._stats.internal_errors += 1
        INTERNAL.internal_error("a lane request of uid %d raised", self._uid, exc=exc)

    def infer(self, request: Request, feeds: dict[str, np.ndarray]) -> Ran | bytes:
        connection = self._connection()
        if connection is None:
            raise IllegalArgumentError("the lane's connection has closed")
        model = self._calls.model(connection, request.model)
        del connection
        work = self._backend.submit_inference(
            model, feeds, request.job_priority, None, None, None, ON_THE_LANE
        )
        stats = self._stats
        stats.inferences_on_lane += 1
        if work.inline is not None:
            stats.inferences_inline += 1
        else:
            stats.inferences_to_workers += 1
        del feeds
        self.running.now(model, work.work_id)
        try:
            return Ran(work.work_id, self._backend.outputs(work))
        except CancelledError:
            return encode_reply(Status.CANCELLED, work.work_id)
        except Exception as exc:
            exc.__traceback__ = None  # the work keeps it: no cycle through this frame
            return encode_reply(
                Status.FAILED, work.work_id, kind=type(exc).__name__, message=str(exc)
            )
        finally:
            self.running.now(None)
