"""Moving bytes for every client: reading in slices, writing, backpressure, the budget.

The loop (`server.Daemon`) hands readable and writable sockets here. Each app's frames
are handled a slice a turn, however many connections it has (`shares.LoopShares`), so a
pipeline or a crowd of connections cannot hold up the others, and the replies of a slice
leave as it ends, before the next connection's slice; a client
that leaves `OUTBOX_PAUSE_BYTES` unread is not read again until it drains; the bytes
buffered for all clients stay within the daemon-wide budget, dropping the connection
that holds the most when they would not.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import selectors
import socket
import time
from collections.abc import Callable
from typing import Any

from npumanager.daemon.server.connection import Connection
from npumanager.daemon.server.frames import FrameHandler, clip
from npumanager.daemon.server.info import InfoCache
from npumanager.daemon.server.quotas import DaemonLimits, UidUsage
from npumanager.daemon.server.ratelog import RateLimitedLog
from npumanager.daemon.server.refusals import RefusalAllowance
from npumanager.daemon.server.shares import LoopShares, ShareKey, share_key
from npumanager.daemon.server.stats import DaemonStats
from npumanager.daemon.wire import protocol as p
from npumanager.daemon.wire.connection import NEED_DATA
from npumanager.schemas.limits import (
    MAX_OUTBOX_BYTES,
    MAX_PENDING_DESCRIPTORS,
    OUTBOX_PAUSE_BYTES,
    SHUTDOWN_FLUSH_S,
)

log = logging.getLogger("npumanager.daemon.server.server")

_RECV_BYTES = 1 << 16
_ANCILLARY_BYTES = socket.CMSG_SPACE(MAX_PENDING_DESCRIPTORS * array.array("i").itemsize)


def _descriptors(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors of the SCM_RIGHTS messages among a `recvmsg`'s ancillary data."""
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return fds.tolist()


class Transport:
    """Every connection's socket and buffers; what the loop does when one is ready."""

    def __init__(
        self,
        selector: selectors.BaseSelector,
        frames: FrameHandler,
        info: InfoCache,
        limits: DaemonLimits,
        usage: UidUsage,
        stats: DaemonStats,
        ratelog: RateLimitedLog,
        on_drop: Callable[[Connection], None],
    ) -> None:
        self.selector = selector
        self.frames = frames
        self.info = info
        self.limits = limits
        self.usage = usage
        self.stats = stats
        self._log = ratelog
        self._on_drop = on_drop
        self.connections: dict[int, Connection] = {}
        self.dirty: set[Connection] = set()
        self.backlog: dict[Connection, None] = {}
        """Connections with frames waiting their turn, the longest waiting first."""
        self.refusals = RefusalAllowance()
        self.held: dict[Connection, None] = {}
        """Connections of apps held back for their refused calls: not read until released."""
        self.shares = LoopShares()
        self.buffered = 0
        """Bytes buffered for all clients: partial frames and unsent replies."""
        self.freed = 0
        """Bytes of client buffers freed since memory was last handed back."""

    @property
    def info_version(self) -> int:
        """The version of the daemon's state now, for a connection to note what it saw."""
        return self.info.version

    def add(self, connection: Connection) -> None:
        """Watch a new connection's socket."""
        self.connections[connection.fd] = connection
        self.selector.register(connection.sock, selectors.EVENT_READ, self.io)

    def write_all(self) -> None:
        """Write what each connection queued this turn."""
        while self.dirty:
            self.write(self.dirty.pop())

    def queued(self, connection: Connection, nbytes: int) -> None:
        """A connection queued `nbytes` to send: write it this turn, within the limits."""
        self.stats.frames_out += 1
        self.buffered += nbytes
        if len(connection.outbox) > MAX_OUTBOX_BYTES:
            self.stats.dropped_slow += 1
            self._log.warning(
                "dropping uid %d pid %d: it left %d bytes unread (limit %d)",
                connection.peer.uid,
                connection.peer.pid,
                len(connection.outbox),
                MAX_OUTBOX_BYTES,
            )
            self.drop(connection)
            return
        self.dirty.add(connection)
        self.keep_budget()

    def keep_budget(self) -> None:
        """Over the daemon-wide buffer budget: drop whoever buffers the most until under it."""
        budget = self.limits.max_buffered_bytes
        while self.buffered > budget and self.connections:
            largest = max(self.connections.values(), key=lambda c: c.buffered)
            self.stats.dropped_over_budget += 1
            self._log.warning(
                "dropping uid %d pid %d: it holds %d of the %d bytes all clients may buffer",
                largest.peer.uid,
                largest.peer.pid,
                largest.buffered,
                budget,
            )
            self.drop(largest)

    def io(self, sock: Any, mask: int) -> None:
        connection = self.connections.get(sock.fileno())
        if connection is None:
            return
        try:
            if mask & selectors.EVENT_WRITE:
                self.write(connection)
            if mask & selectors.EVENT_READ and not connection.closed:
                self.read(connection)
        except Exception as exc:
            self.stats.internal_errors += 1
            self._log.internal_error(
                "internal error serving uid %d; closing it", connection.peer.uid, exc=exc
            )
            self.drop(connection)

    def read(self, connection: Connection) -> None:
        if connection in self.backlog or connection.paused:
            return  # it has frames waiting their turn: read no more until they are handled
        key = share_key(connection)
        if self.refusals.held(key):
            self._hold(connection)
            return
        if not self.shares.has_left(key):
            self.backlog[connection] = None  # its app's slice is spent: read it next turn
            return
        started = time.perf_counter()
        try:
            data, ancillary, flags, _ = connection.sock.recvmsg(
                _RECV_BYTES, _ANCILLARY_BYTES, socket.MSG_CMSG_CLOEXEC
            )
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, ancillary, flags = b"", [], 0
        if ancillary and not self.take_descriptors(connection, ancillary, flags):
            return
        if not data:
            self.drop(connection)
            return
        connection.last_active = time.monotonic()
        connection.wire.receive_data(data)
        self.buffered += len(data)
        reading = time.perf_counter() - started
        self.handle_frames(connection)
        self.shares.charge(key, 0, reading)  # its app's other connections wait for its read
        self.keep_budget()

    def take_descriptors(
        self, connection: Connection, ancillary: list[tuple[int, int, bytes]], flags: int
    ) -> bool:
        """Keep the descriptors a client sent for its next frames; more than
        `MAX_PENDING_DESCRIPTORS` ahead closes them and the connection (False)."""
        fds = _descriptors(ancillary)
        if flags & socket.MSG_CTRUNC:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            connection.close_descriptors()
        if flags & socket.MSG_CTRUNC or not connection.received_descriptors(fds):
            self.fatal(
                connection,
                f"more than {MAX_PENDING_DESCRIPTORS} descriptors were sent ahead of the "
                "frames that take them",
            )
            return False
        return True

    def handle_frames(self, connection: Connection) -> None:
        """Handle the connection's frames within what is left of its app's slice of this
        turn; the rest wait a turn.

        An app's slice, across all its connections, ends after `FRAMES_PER_TURN` frames or
        `TURN_SLICE_S`, so no client's pipeline, nor one app's many connections, can hold
        up the others; the replies are written then. A client that leaves
        `OUTBOX_PAUSE_BYTES` unread gets nothing more handled until it reads.
        """
        self.backlog.pop(connection, None)
        key = share_key(connection)
        frames, seconds = self.shares.left(key)
        wire = connection.wire
        started = time.perf_counter()
        ends = started + seconds
        handled = 0
        try:
            while handled < frames and seconds > 0:  # a slice begun takes at least one frame
                if connection.closed:
                    return
                if len(connection.outbox) >= OUTBOX_PAUSE_BYTES:
                    self.pause(connection)
                    return
                before = wire.pending
                event = wire.next_event()
                if event is NEED_DATA:
                    return
                self.buffered -= before - wire.pending
                handled += 1
                if self.frames.handle(connection, event) and self._refused(connection, key):
                    break
                if time.perf_counter() >= ends:
                    break
            if connection.closed:
                return
            if self.refusals.held(key):
                self._hold(connection)
            elif wire.has_frame:  # the rest wait for the next turn
                self.backlog[connection] = None
        except p.ProtocolError as exc:
            self.fatal(connection, str(exc))
        finally:
            self.shares.charge(key, handled, time.perf_counter() - started)
            if connection in self.dirty:  # its replies leave now, not after the others' slices
                self.dirty.discard(connection)
                self.write(connection)

    def pause(self, connection: Connection) -> None:
        """Stop reading a client that does not read; `_write` resumes it once it drains."""
        if not connection.paused:
            connection.paused = True
            self.stats.backpressure_pauses += 1
            self.dirty.add(connection)

    def serve_backlog(self) -> None:
        """Serve the connections waiting their turn, in order, while their apps have some
        of their slices left: the frames they hold, or what they sent meanwhile."""
        shares = self.shares
        for connection in list(self.backlog):
            key = share_key(connection)
            if self.refusals.held(key):
                self._hold(connection)
                continue
            if not shares.has_left(key):
                continue  # its app's slice is spent: it keeps its place for the next turn
            try:
                if connection.wire.has_frame:
                    self.handle_frames(connection)
                else:
                    del self.backlog[connection]
                    self.read(connection)
            except Exception as exc:
                self.stats.internal_errors += 1
                self._log.internal_error(
                    "internal error serving uid %d; closing it", connection.peer.uid, exc=exc
                )
                self.drop(connection)

    def write(self, connection: Connection) -> None:
        if connection.closed:
            return
        outbox = connection.outbox
        try:
            with connection.write_lock:
                while outbox:
                    sent = connection.sock.send(outbox)
                    del outbox[:sent]
                    self.buffered -= sent
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self.drop(connection)
            return
        if connection.paused and len(outbox) < OUTBOX_PAUSE_BYTES // 2:
            connection.paused = False
            if connection not in self.held:
                self.backlog[connection] = None  # frames it sent meanwhile are still buffered
        self._watch(connection)

    def _watch(self, connection: Connection) -> None:
        """Watch the socket for what the connection waits for: its client's bytes unless
        it is paused or held, and room to write while it has replies queued."""
        reading = not connection.paused and connection not in self.held
        events = (selectors.EVENT_READ if reading else 0) | (
            selectors.EVENT_WRITE if connection.outbox else 0
        )
        if events != connection.events:
            connection.events = events
            self.selector.modify(connection.sock, events, self.io)

    def _refused(self, connection: Connection, key: ShareKey) -> bool:
        """A call of the connection's was refused: True if that holds its app back."""
        if connection.management or not self.refusals.refused(key):
            return False
        self.stats.refusal_holds += 1
        self._log.warning(
            "holding back uid %d pid %d: the daemon refused more than %d of its app's calls "
            "in a burst",
            connection.peer.uid,
            connection.peer.pid,
            self.refusals.burst,
        )
        return True

    def _hold(self, connection: Connection) -> None:
        """Read nothing more of a connection of a held app until `release_held`."""
        self.backlog.pop(connection, None)
        self.held[connection] = None
        self._watch(connection)

    def release_held(self) -> None:
        """Read again the connections of every app whose hold is over."""
        for connection in [c for c in self.held if not self.refusals.held(share_key(c))]:
            del self.held[connection]
            self._watch(connection)
            self.backlog[connection] = None  # what it sent meanwhile is served next turn

    def fatal(self, connection: Connection, message: str) -> None:
        self.stats.protocol_errors += 1
        self._log.info(
            "closing uid %d pid %d: %s", connection.peer.uid, connection.peer.pid, message
        )
        connection.send(p.Error(kind="ProtocolError", message=clip(message)))
        self.write(connection)
        self.drop(connection)

    def drop(self, connection: Connection) -> None:
        """Forget a connection at once; the client's requests end as if it had died."""
        if connection.closed:
            return
        with connection.write_lock:  # no worker thread is sending on it after this
            connection.closed = True
        self.dirty.discard(connection)
        self.backlog.pop(connection, None)
        self.held.pop(connection, None)
        self._on_drop(connection)
        self.connections.pop(connection.fd, None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(connection.sock)
        connection.sock.close()
        self.usage.give_back_connection(connection.peer.uid)
        self.buffered -= connection.buffered
        self.freed += connection.buffered
        manager = connection.manager
        connection.release()
        if manager is not None:
            self.stats.deaths += 1
            manager.close()
            self.usage.leave(connection.peer.uid, manager)
        self.info.changed()

    def flush_all(self) -> None:
        """Write what every connection still has queued, for all of them together at most
        `SHUTDOWN_FLUSH_S`."""
        deadline = time.monotonic() + SHUTDOWN_FLUSH_S
        with selectors.DefaultSelector() as writable:
            while True:
                waiting = [c for c in self.connections.values() if c.outbox and not c.closed]
                for connection in waiting:
                    self.write(connection)
                waiting = [c for c in waiting if c.outbox and not c.closed]
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not waiting:
                    return
                for connection in waiting:
                    with contextlib.suppress(KeyError, ValueError):
                        writable.register(connection.sock, selectors.EVENT_WRITE)
                writable.select(remaining)
                for connection in waiting:
                    with contextlib.suppress(KeyError, ValueError):
                        writable.unregister(connection.sock)
