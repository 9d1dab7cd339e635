"""What one client frame means: the hello, then calls answered by a reply or an error
(the wire, `daemon.wire.connection`, has framed and parsed it and checked its place).

A handler's own errors (an unknown request, a permission, a quota) reach the client as
an error reply carrying the exception's class; anything else is an internal error, logged
and answered as `DaemonError`. A `ProtocolError` escapes to the loop, which closes that
connection only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from npumanager.apps.registry import HAL_UID_FIRST
from npumanager.core.service.service import Service
from npumanager.daemon.server.calls import Handler, NoReply
from npumanager.daemon.server.connection import Connection
from npumanager.daemon.server.importance import AppImportance
from npumanager.daemon.server.info import InfoCache
from npumanager.daemon.server.ratelog import RateLimitedLog
from npumanager.daemon.server.stats import DaemonStats
from npumanager.daemon.wire import protocol as p
from npumanager.daemon.wire.connection import BadCall, Event
from npumanager.errors import DaemonError, NpuManagerError
from npumanager.schemas.limits import PROTOCOL_VERSION

log = logging.getLogger("npumanager.daemon.server.server")
_INTERNAL = RateLimitedLog(log)
"""Internal errors a client's call caused: one line each, rate-limited."""

_CALL_ERRORS = (NpuManagerError, TypeError, ValueError, LookupError, PermissionError)


class FrameHandler:
    """Turns a connection's frames into calls on the service and frames back."""

    def __init__(
        self,
        service: Service,
        handlers: dict[type[p.Call], Handler],
        info: InfoCache,
        stats: DaemonStats,
        run_ready: Callable[[], None],
        said_hello: Callable[[Connection], None],
        importance: AppImportance,
    ) -> None:
        self.service = service
        self.importance = importance
        self.apps = importance.apps
        self.info = info
        self.stats = stats
        self._run_ready = run_ready
        self._said_hello = said_hello
        self._handlers: dict[type[p.Call], Handler] = {**handlers, p.Info: self._on_info}

    def handle(self, connection: Connection, event: Event) -> bool:
        """Act on one event of the connection's wire (a message or a `BadCall`); True if
        the call was refused as the client's mistake (`refusals`). `ProtocolError` if it
        breaks the protocol."""
        self.stats.frames_in += 1
        if isinstance(event, BadCall):
            # A malformed real-inference call is answered, and the connection stays; a
            # descriptor it may have carried is not left for the next frame.
            self.stats.call_errors += 1
            connection.close_descriptors()
            connection.send(
                p.Error(seq=event.seq, kind="IllegalArgumentError", message=clip(str(event.error)))
            )
            return True
        if isinstance(event, p.Hello):
            self._hello(connection, event)
            return False
        message: p.ClientMessage = event
        assert isinstance(message, p.Call) and connection.manager is not None
        seq = message.seq
        if not isinstance(message, p.Info):
            self.info.changed()
        try:
            result = self._handlers[type(message)](connection, message)
        except Exception as exc:
            connection.send(call_error(seq, exc, self.stats, message.op, connection.peer.uid))
            return isinstance(exc, _CALL_ERRORS)
        # The call's own callbacks go first, as they run before an in-process call returns.
        self._run_ready()
        if isinstance(result, NoReply):
            return False
        if result is None:
            connection.send_frame(p.reply_frame(seq))
        elif isinstance(result, bytes):  # an info reply: what it shows the asker saw already
            connection.send_frame(p.result_frame(seq, result), observed=False)
        else:
            connection.send(p.Reply(seq=seq, result=result))
        return False

    def _hello(self, connection: Connection, hello: p.Hello) -> None:
        """The wire checked the hello's place and version; the kernel's identity is
        checked here."""
        peer = connection.peer
        if peer.uid >= HAL_UID_FIRST:
            raise p.ProtocolError(
                f"uid {peer.uid} is outside the uids this daemon serves (0..{HAL_UID_FIRST - 1}: "
                f"from {HAL_UID_FIRST} up are its apps' HAL uids)"
            )
        self._said_hello(connection)
        connection.app = app = self.apps.identify(connection.sock, peer.uid, peer.pid)
        connection.manager = self.service.manager(
            app.hal_uid, pid=peer.pid, uses_feature=hello.uses_feature
        )
        if app.kind != "uid":  # an app found by its cgroup: its own quotas too
            connection.usage.apps.join(app.hal_uid, connection.manager)
        self.importance.joined(app)
        connection.usage.join(peer.uid, connection.manager)
        connection.send(
            p.Welcome(
                version=PROTOCOL_VERSION,
                uid=peer.uid,
                pid=peer.pid,
                gid=peer.gid,
                daemon_pid=os.getpid(),
                management=connection.management,
                app_id=app.app_id,
                hal_uid=app.hal_uid,
            )
        )

    def _on_info(self, connection: Connection, message: p.Info) -> bytes:
        uids = None if connection.management else self.apps.uids_of(connection.peer.uid)
        return self.info.result_json(uids, message.offset, message.limit, connection.info_seen)


def call_error(seq: int, exc: Exception, stats: DaemonStats, op: str, uid: int) -> p.Error:
    """The error reply to a call that raised: its own errors by class, anything else an
    internal error (logged, answered as `DaemonError`)."""
    if isinstance(exc, _CALL_ERRORS):
        stats.call_errors += 1
        return p.Error(seq=seq, kind=type(exc).__name__, message=clip(str(exc)))
    stats.internal_errors += 1
    _INTERNAL.internal_error("internal error handling %s from uid %d", op, uid, exc=exc)
    return p.Error(seq=seq, kind=DaemonError.__name__, message=clip(repr(exc)))


def clip(text: str, limit: int = 4000) -> str:
    """`text`, cut to fit an error frame's message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
