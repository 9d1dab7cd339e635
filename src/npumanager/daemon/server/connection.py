"""One client of the daemon: its socket, the kernel's word on who it is, what it holds.

Frames for it queue in its outbox and leave as its slice of the loop ends; its requests'
callbacks become frames (`RemoteCallback`). A connection knows nothing of the daemon but
the `Outlet` it reports queued bytes to, and its callback holds it only weakly, so a
dropped connection is freed at once, with no reference cycle to wait for.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from npumanager.apps.registry import App
from npumanager.core.client.manager import LoadedModel, ModelLoadRequestCallback, NpuManager
from npumanager.daemon.peer import PeerCredentials
from npumanager.daemon.server.quotas import Resource, UidUsage
from npumanager.daemon.wire import protocol as p
from npumanager.daemon.wire.connection import Role, WireConnection
from npumanager.errors import IllegalArgumentError
from npumanager.schemas import (
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    UnloadReason,
)
from npumanager.schemas.limits import MAX_PENDING_DESCRIPTORS

if TYPE_CHECKING:
    from npumanager.daemon.server.segment import SharedSegment


class Outlet(Protocol):
    """Where a connection reports what it queued: the daemon's loop."""

    def queued(self, connection: Connection, nbytes: int) -> None:
        """`nbytes` more wait in the connection's outbox."""

    @property
    def info_version(self) -> int:
        """The version of the daemon's state now (`info.InfoCache.version`)."""


class LaneEnd(Protocol):
    """A connection's inference lane (`daemon.lane.Lane`), as the connection sees it."""

    def cancel(self) -> bool:
        """Cancel the inference the lane is running: False if it runs none."""

    def close(self) -> None:
        """Shut the lane: its thread finishes."""

    def finished(self) -> bool:
        """True once the lane's thread has ended (its far end closed)."""


class HostEnd(Protocol):
    """A connection's model host (`daemon.host.client.ModelHost`), as the connection sees it:
    its app's, shared by the app's connections."""

    def leave(self) -> None:
        """The connection no longer uses the host: the last one to leave ends it (its loads
        and runs stop); the others' models go with their connections."""


class Connection:
    """One client: its socket, the kernel's word on who it is, and what it holds."""

    def __init__(
        self,
        outlet: Outlet,
        sock: socket.socket,
        peer: PeerCredentials,
        *,
        usage: UidUsage,
        management: bool,
        now: float,
    ) -> None:
        self._outlet = outlet
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.management = management
        self.usage = usage
        self.wire = WireConnection(Role.DAEMON)
        """The protocol's state of this connection: hello, framing."""
        self.outbox = bytearray()
        self.write_lock = threading.Lock()
        """Held to change the outbox, to write the socket, and to mark the connection closed:
        a worker thread may send a finished inference's frame itself (`send_now`)."""
        self.app: App | None = None
        """The app the client's process belongs to, found at hello (`apps.registry`)."""
        self.manager: NpuManager | None = None
        """The client's manager once it said hello; the service keeps the one record of
        each of its requests and models, by its client number."""
        self.closed = False
        self.events = selectors.EVENT_READ
        """What the loop's selector watches the socket for."""
        self.paused = False
        """Unread replies passed `OUTBOX_PAUSE_BYTES`: nothing is read until it drains."""
        self.last_active = now
        self.callback = RemoteCallback(self)
        self.descriptors: deque[int] = deque()
        """Descriptors the client sent (SCM_RIGHTS), for the frames that take them, in order."""
        self.segment: SharedSegment | None = None
        """The client's shared segment for tensors, once attached."""
        self.inferences: dict[int, int] = {}
        """The call seq of each of this client's inferences in flight, by work id."""
        self.inference_models: dict[int, int] = {}
        """The model handle of each inference in flight, by work id."""
        self.cancelled: set[int] = set()
        """Inferences in flight the client cancelled: they end CANCELLED_USER."""
        self.held: dict[int, list[np.ndarray]] = {}
        """Outputs too large for their region, by call seq, until fetched."""
        self.info_seen = 0
        """The version of the daemon's state the client was last sent word of: its `info`
        shows every change up to it (`info.InfoCache`)."""
        self.lane: LaneEnd | None = None
        """The connection's inference lane, once opened."""
        self.host: HostEnd | None = None
        """The process its models run in, once one is loaded (`daemon.host`)."""
        self.hosted: list[LoadedModel] = []
        """The models loaded in its host."""
        self.lost: dict[int, str] = {}
        """Why each model a dead host took with it is gone, by handle."""

    @property
    def buffered(self) -> int:
        """Bytes the daemon holds for this client: a partial frame and unsent replies."""
        return self.wire.pending + len(self.outbox)

    def send(self, message: p.WireModel) -> None:
        """Queue a message; it leaves as this connection's slice of the loop ends (queued
        outside one, at the end of the loop's turn)."""
        if not self.closed:
            self.send_frame(self.wire.send(message))

    def send_frame(self, frame: bytes, *, observed: bool = True) -> None:
        """Queue an encoded frame; it leaves as `send`'s message does. `observed`: the frame
        tells the client of the state as it is now (all but an `info` reply)."""
        if self.closed:
            return
        if observed:
            self.info_seen = self._outlet.info_version
        with self.write_lock:
            self.outbox += frame
        self._outlet.queued(self, len(frame))

    def send_now(self, frame: bytes) -> int:
        """From a worker thread: send `frame` at once when nothing waits before it. The
        bytes left in the outbox for the loop to account and write (0: all sent), or -1
        when nothing was sent and the caller must queue the frame through the loop."""
        self.info_seen = self._outlet.info_version
        with self.write_lock:
            if self.closed or self.outbox or self.paused:
                return -1
            try:
                sent = self.sock.send(frame)
            except OSError:  # full (BlockingIOError) or broken: the loop deals with it
                return -1
            left = len(frame) - sent
            if left:
                self.outbox += frame[sent:]
            return left

    def received_descriptors(self, fds: list[int]) -> bool:
        """Keep descriptors the client sent; False (all closed) past `MAX_PENDING_DESCRIPTORS`."""
        self.descriptors.extend(fds)
        if len(self.descriptors) <= MAX_PENDING_DESCRIPTORS:
            return True
        self.close_descriptors()
        return False

    def take_descriptor(self, op: str) -> int:
        """The next descriptor the client sent; the caller closes it."""
        if not self.descriptors:
            raise IllegalArgumentError(
                f"{op} needs a descriptor sent with its frame (SCM_RIGHTS); none came"
            )
        return self.descriptors.popleft()

    def close_descriptors(self) -> None:
        """Close every descriptor the client sent and no frame took."""
        while self.descriptors:
            with contextlib.suppress(OSError):
                os.close(self.descriptors.popleft())

    def queued_by_worker(self, nbytes: int) -> None:
        """On the loop: account the rest of a frame `send_now` could not send at once."""
        if not self.closed:
            self._outlet.queued(self, nbytes)

    def check_quota(self, resource: Resource, *, including: int = 0) -> None:
        """`QuotaExceededError` now, before acting, if one more is past the uid's cap (or,
        with ``including``, if what it took already is)."""
        self.usage.check(resource, self.peer.uid, exempt=self.management, including=including)
        app = self.app
        if app is not None and app.kind != "uid" and not self.management:
            self.usage.apps.check_app(resource, app.hal_uid, app.app_id, including=including)

    def release(self) -> None:
        """Give back everything it holds and its buffers (the connection is closed)."""
        self.wire.release()
        self.outbox = bytearray()
        self.manager = None
        self.close_descriptors()
        if self.lane is not None:
            self.lane.close()
            self.lane = None
        if self.host is not None:
            self.host.leave()
            self.host = None
        self.hosted.clear()
        self.segment = None  # unmapped once running inferences let go of their arrays
        self.held.clear()
        self.inferences.clear()
        self.inference_models.clear()


class RemoteCallback(ModelLoadRequestCallback):
    """The service's callback for a remote request: each call becomes a frame."""

    def __init__(self, connection: Connection) -> None:
        self._connection = weakref.ref(connection)

    def on_can_load_model(self, request: ModelLoadRequest, status: ModelLoadStatus, _: Any) -> None:
        connection = self._connection()
        if connection is not None:
            connection.send_frame(p.decision_frame(request.id, int(status)))

    def on_request_unload_model(
        self, request: ModelLoadRequest, reason: UnloadReason | None = None
    ) -> None:
        connection = self._connection()
        if connection is not None:
            code = None if reason is None else int(reason)
            connection.send_frame(p.unload_frame(request.id, code))

    def on_model_load_request_complete(
        self, request: ModelLoadRequest, status: ModelLoadRequestStatus
    ) -> None:
        connection = self._connection()
        if connection is not None:
            connection.send_frame(p.complete_frame(request.id, int(status)))
