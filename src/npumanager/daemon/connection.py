"""One client of the daemon: its socket, the kernel's word on who it is, what it holds.

Frames for it queue in its outbox and leave at the end of the loop's turn; its requests'
callbacks become frames (`RemoteCallback`).
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING, Any

from npumanager.core.client import LoadedModel, ModelLoadRequestCallback, NpuManager
from npumanager.daemon import protocol as p
from npumanager.daemon.peer import PeerCredentials
from npumanager.schemas import (
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    UnloadReason,
)
from npumanager.schemas.limits import MAX_OUTBOX_BYTES

if TYPE_CHECKING:
    from npumanager.daemon.server import Daemon

log = logging.getLogger(__name__)


class Connection:
    """One client: its socket, the kernel's word on who it is, and what it holds."""

    def __init__(self, daemon: Daemon, sock: socket.socket, peer: PeerCredentials) -> None:
        self.daemon = daemon
        self.sock = sock
        self.peer = peer
        self.reader = p.FrameReader()
        self.outbox = bytearray()
        self.manager: NpuManager | None = None
        self.requests: dict[int, ModelLoadRequest] = {}
        self.models: dict[int, LoadedModel] = {}
        self.closed = False
        self.writing = False
        self.callback = RemoteCallback(self)

    def send(self, message: p.WireModel) -> None:
        """Queue a message; it leaves at the end of the loop's turn."""
        self.send_frame(p.encode(message))

    def send_frame(self, frame: bytes) -> None:
        """Queue an encoded frame; it leaves at the end of the loop's turn."""
        if self.closed:
            return
        self.outbox += frame
        self.daemon.stats.frames_out += 1
        if len(self.outbox) > MAX_OUTBOX_BYTES:
            self.daemon.stats.dropped_slow += 1
            log.warning(
                "dropping uid %d pid %d: it left %d bytes unread (limit %d)",
                self.peer.uid,
                self.peer.pid,
                len(self.outbox),
                MAX_OUTBOX_BYTES,
            )
            self.daemon.drop(self)
            return
        self.daemon.dirty.add(self)


class RemoteCallback(ModelLoadRequestCallback):
    """The service's callback for a remote request: each call becomes a frame."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def on_can_load_model(self, request: ModelLoadRequest, status: ModelLoadStatus, _: Any) -> None:
        self._connection.send_frame(p.decision_frame(request.id, int(status)))

    def on_request_unload_model(
        self, request: ModelLoadRequest, reason: UnloadReason | None = None
    ) -> None:
        code = None if reason is None else int(reason)
        self._connection.send_frame(p.unload_frame(request.id, code))

    def on_model_load_request_complete(
        self, request: ModelLoadRequest, status: ModelLoadRequestStatus
    ) -> None:
        connection = self._connection
        connection.requests.pop(request.id, None)
        for handle in [h for h, m in connection.models.items() if m.request.id == request.id]:
            del connection.models[handle]
        connection.send_frame(p.complete_frame(request.id, int(status)))
