"""The daemon: one `Service` shared by every process that connects to its Unix socket.

One thread runs a selector loop over the listening socket, the clients' connections and
a wake-up descriptor. Frames are handled on that thread; the service's deliveries for a
connection are posted to it too, so every write to a client happens there, and a reply
and the decision it caused leave in one send. A client is known by the kernel's
credentials of its socket. When its connection closes, however it died, its requests end
at once (its loaded work is cancelled, the policy re-evaluates).

No client can stop the loop or starve the others: whatever a connection's frames raise
ends at that connection; each connection gets a slice of each turn, and none while it
leaves its replies unread; per-uid caps bound what one uid holds; a daemon-wide budget
bounds the bytes buffered for all clients, dropping the connection that buffers the most
when it is exceeded.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from npumanager.core.dispatch import Task
from npumanager.core.service import Service
from npumanager.daemon import protocol as p
from npumanager.daemon.binding import Binding, bind, raise_descriptor_limit
from npumanager.daemon.calls import Calls, Handler
from npumanager.daemon.connection import Connection
from npumanager.daemon.info import InfoCache
from npumanager.daemon.memory import give_back_memory
from npumanager.daemon.peer import peer_credentials
from npumanager.daemon.quotas import DaemonLimits, UidUsage
from npumanager.daemon.ratelog import RateLimitedLog
from npumanager.daemon.stats import DaemonStats
from npumanager.errors import DaemonError, NpuManagerError, QuotaExceededError
from npumanager.schemas.limits import (
    FRAMES_PER_TURN,
    HELLO_TIMEOUT_S,
    INT32_MAX,
    MANAGEMENT_RESERVE_FDS,
    MAX_OUTBOX_BYTES,
    OUTBOX_PAUSE_BYTES,
    PROTOCOL_VERSION,
    SHUTDOWN_FLUSH_S,
    TURN_SLICE_S,
)

log = logging.getLogger(__name__)

_RECV_BYTES = 1 << 16
_ACCEPT_PAUSE_S = 0.1
"""How long the daemon stops accepting when it runs out of file descriptors."""
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_OWN_FDS = 16
"""Descriptors the daemon needs for itself (selector, wake pipe, lock, logs, driver)."""
_IDLE_SCAN_S = 1.0
_TRIM_AFTER_BYTES = 1 << 20
"""Freed client buffers past this many bytes are handed back to the system soon after."""
_TRIM_DELAY_S = 0.2
"""Handing memory back walks the heap: at most once in this long, however many are freed."""
_CALL_ERRORS = (NpuManagerError, TypeError, ValueError, LookupError, PermissionError)


class Daemon:
    """Serves one `Service` on a Unix socket until `stop()`."""

    def __init__(
        self,
        service: Service,
        socket_path: Path,
        *,
        socket_group: int | None = None,
        management_group: int | None = None,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
        limits: DaemonLimits | None = None,
        create_socket_dir: bool = True,
    ) -> None:
        self.service = service
        self.socket_path = Path(socket_path)
        self.socket_group = socket_group
        self.management_group = management_group
        self.hello_timeout_s = hello_timeout_s
        self.limits = limits or DaemonLimits()
        self.usage = UidUsage(self.limits)
        self.create_socket_dir = create_socket_dir
        self.stats = DaemonStats()
        self.dirty: set[Connection] = set()
        self.buffered = 0
        self.max_connections = 0
        self._awaiting_hello: dict[Connection, float] = {}
        self._backlog: set[Connection] = set()
        self._connections: dict[int, Connection] = {}
        self._ready: deque[Task] = deque()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._binding: Binding | None = None
        self._stopping = False
        self._loop_thread: int | None = None
        self._accept_resume_at: float | None = None
        self._next_idle_scan = 0.0
        self._freed = 0
        self._trim_at: float | None = None
        self._log = RateLimitedLog(log)
        self.calls = Calls(service, self.post, management_group)
        self._info = InfoCache(self.describe)
        self._handlers: dict[type[p.Call], Handler] = {**self.calls.handlers, p.Info: self._on_info}

    # Binding ----------------------------------------------------------------------------

    def bind(self) -> None:
        """Take the socket path (see `binding.bind`) and raise the descriptor limit."""
        self._binding = bind(
            self.socket_path,
            socket_group=self.socket_group,
            create_parent=self.create_socket_dir,
        )
        descriptors = raise_descriptor_limit()
        self.max_connections = max(1, descriptors - MANAGEMENT_RESERVE_FDS - _OWN_FDS)
        self._selector.register(self._binding.listener, selectors.EVENT_READ, self._accept)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._woken)

    # The loop ---------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Run until `stop()`, then close the service and every connection."""
        if self._binding is None:
            self.bind()
        self._loop_thread = threading.get_ident()
        select = self._selector.select
        try:
            while not self._stopping:
                for key, mask in select(0 if self._backlog else self._timeout()):
                    key.data(key.fileobj, mask)
                self._serve_backlog()
                self._on_time(time.monotonic())
                self._turn()
        finally:
            self._shutdown()

    def stop(self) -> None:
        """Ask the loop to finish (safe from any thread and from a signal handler)."""
        self._stopping = True
        self._wake()

    def post(self, task: Task) -> None:
        """The executor of every remote request: run `task` on the loop thread."""
        self._ready.append(task)
        if threading.get_ident() != self._loop_thread:
            self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"\0")

    def _woken(self, _: Any, __: int) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def _run_ready(self) -> None:
        ready = self._ready
        if ready:
            self._info.changed()
        while ready:
            task = ready.popleft()
            try:
                task()
            except Exception:
                self.stats.internal_errors += 1
                log.exception("a delivery to a client raised")

    def _turn(self) -> None:
        """Run posted deliveries, write what each connection has queued, hand memory back."""
        self._run_ready()
        while self.dirty:
            self._write(self.dirty.pop())
        if self._freed >= _TRIM_AFTER_BYTES and self._trim_at is None:
            self._trim_at = time.monotonic() + _TRIM_DELAY_S

    def _timeout(self) -> float | None:
        """How long the loop may sleep: until accepting resumes or a hello is overdue."""
        times = [self._accept_resume_at] if self._accept_resume_at is not None else []
        if self._awaiting_hello:
            times.append(next(iter(self._awaiting_hello.values())))
        if self.limits.idle_timeout_s > 0 and self._connections:
            times.append(self._next_idle_scan)
        if self._trim_at is not None:
            times.append(self._trim_at)
        return max(0.0, min(times) - time.monotonic()) if times else None

    def _on_time(self, now: float) -> None:
        if self._trim_at is not None and now >= self._trim_at:
            self._trim_at = None
            self._freed = 0
            give_back_memory()
        if self._accept_resume_at is not None and now >= self._accept_resume_at:
            self._resume_accepting()
        waiting = self._awaiting_hello
        while waiting:
            connection, deadline = next(iter(waiting.items()))
            if deadline > now:
                break
            del waiting[connection]
            self._fatal(connection, f"no hello within {self.hello_timeout_s:g} s")
        if self.limits.idle_timeout_s > 0 and now >= self._next_idle_scan:
            self._next_idle_scan = now + _IDLE_SCAN_S
            idle_since = now - self.limits.idle_timeout_s
            for connection in list(self._connections.values()):
                if connection.holds_nothing and connection.last_active < idle_since:
                    self.stats.closed_idle += 1
                    self._fatal(connection, f"idle for {self.limits.idle_timeout_s:g} s")

    # Accepting --------------------------------------------------------------------------

    def _accept(self, listener: Any, _: int) -> None:
        while True:
            try:
                sock, _address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_DESCRIPTORS:
                    self._pause_accepting(exc)
                else:
                    self._log.warning("accept failed: %s", exc)
                return
            try:
                self._admit(sock)
            except Exception:
                self.stats.internal_errors += 1
                log.exception("admitting a connection failed")
                sock.close()

    def _admit(self, sock: socket.socket) -> None:
        try:
            peer = peer_credentials(sock)
        except OSError as exc:
            self._log.warning("no credentials for a new connection (%s); closing it", exc)
            sock.close()
            return
        management = self.calls.may_manage(peer)
        refusal = None
        if not management and len(self._connections) >= self.max_connections:
            refusal = f"the daemon is at its limit of {self.max_connections} connections"
        else:
            try:
                self.usage.take("connections", peer.uid, exempt=management)
            except QuotaExceededError as exc:
                refusal = str(exc)
        if refusal is not None:
            self.stats.refused += 1
            self._log.info("refusing uid %d pid %d: %s", peer.uid, peer.pid, refusal)
            with contextlib.suppress(OSError):
                sock.setblocking(False)
                sock.send(p.encode(p.Error(kind=QuotaExceededError.__name__, message=refusal)))
            sock.close()
            return
        sock.setblocking(False)
        now = time.monotonic()
        connection = Connection(self, sock, peer, usage=self.usage, management=management, now=now)
        self._connections[connection.fd] = connection
        self._selector.register(sock, selectors.EVENT_READ, self._io)
        self._awaiting_hello[connection] = now + self.hello_timeout_s
        self.stats.accepted += 1
        self._info.changed()

    def _pause_accepting(self, exc: OSError) -> None:
        """Out of descriptors: stop accepting for a moment instead of spinning on accept."""
        assert self._binding is not None
        self._selector.unregister(self._binding.listener)
        self._accept_resume_at = time.monotonic() + _ACCEPT_PAUSE_S
        self.stats.accept_pauses += 1
        self._log.warning(
            "cannot accept connections (%s); %d open, trying again in %g s",
            exc.strerror,
            len(self._connections),
            _ACCEPT_PAUSE_S,
        )

    def _resume_accepting(self) -> None:
        self._accept_resume_at = None
        if self._binding is not None:
            self._selector.register(self._binding.listener, selectors.EVENT_READ, self._accept)

    # Reading and writing ----------------------------------------------------------------

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
        self._keep_budget()

    def _keep_budget(self) -> None:
        """Over the daemon-wide buffer budget: drop whoever buffers the most until under it."""
        budget = self.limits.max_buffered_bytes
        while self.buffered > budget and self._connections:
            largest = max(self._connections.values(), key=lambda c: c.buffered)
            self.stats.dropped_over_budget += 1
            self._log.warning(
                "dropping uid %d pid %d: it holds %d of the %d bytes all clients may buffer",
                largest.peer.uid,
                largest.peer.pid,
                largest.buffered,
                budget,
            )
            self.drop(largest)

    def _io(self, sock: Any, mask: int) -> None:
        connection = self._connections.get(sock.fileno())
        if connection is None:
            return
        try:
            if mask & selectors.EVENT_WRITE:
                self._write(connection)
            if mask & selectors.EVENT_READ and not connection.closed:
                self._read(connection)
        except Exception:
            self.stats.internal_errors += 1
            log.exception("internal error serving uid %d; closing it", connection.peer.uid)
            self.drop(connection)

    def _read(self, connection: Connection) -> None:
        if connection in self._backlog or connection.paused:
            return  # it has frames waiting their turn: read no more until they are handled
        try:
            data = connection.sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.drop(connection)
            return
        connection.last_active = time.monotonic()
        connection.reader.push(data)
        self.buffered += len(data)
        self._handle_frames(connection)
        self._keep_budget()

    def _handle_frames(self, connection: Connection) -> None:
        """Handle the connection's frames for one slice of the loop; the rest wait a turn.

        A slice ends after `FRAMES_PER_TURN` frames or `TURN_SLICE_S`, so one client's
        pipeline cannot hold up the others; a client that leaves `OUTBOX_PAUSE_BYTES`
        unread gets nothing more handled until it reads.
        """
        self._backlog.discard(connection)
        reader = connection.reader
        ends = time.perf_counter() + TURN_SLICE_S
        try:
            for _ in range(FRAMES_PER_TURN):
                if connection.closed:
                    return
                if len(connection.outbox) >= OUTBOX_PAUSE_BYTES:
                    self._pause(connection)
                    return
                before = reader.pending
                body = reader.pop()
                if body is None:
                    return
                self.buffered -= before - reader.pending
                self._frame(connection, body)
                if time.perf_counter() >= ends:
                    break
            if not connection.closed:
                self._backlog.add(connection)
        except p.ProtocolError as exc:
            self._fatal(connection, str(exc))

    def _pause(self, connection: Connection) -> None:
        """Stop reading a client that does not read; `_write` resumes it once it drains."""
        if not connection.paused:
            connection.paused = True
            self.stats.backpressure_pauses += 1
            self.dirty.add(connection)

    def _serve_backlog(self) -> None:
        for connection in list(self._backlog):
            try:
                self._handle_frames(connection)
            except Exception:
                self.stats.internal_errors += 1
                log.exception("internal error serving uid %d; closing it", connection.peer.uid)
                self.drop(connection)

    def _write(self, connection: Connection) -> None:
        if connection.closed:
            return
        outbox = connection.outbox
        try:
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
            self._backlog.add(connection)  # frames it sent meanwhile are still buffered
        events = (0 if connection.paused else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if outbox else 0
        )
        if events != connection.events:
            connection.events = events
            self._selector.modify(connection.sock, events, self._io)

    # Frames -----------------------------------------------------------------------------

    def _frame(self, connection: Connection, body: bytes) -> None:
        self.stats.frames_in += 1
        message = p.parse_client(body)
        if isinstance(message, p.Hello):
            self._hello(connection, message)
            return
        if connection.manager is None:
            raise p.ProtocolError("the first frame of a connection must be a hello")
        assert isinstance(message, p.Call)
        seq = message.seq
        if not isinstance(message, p.Info):
            self._info.changed()
        try:
            result = self._handlers[type(message)](connection, message)
        except _CALL_ERRORS as exc:
            self.stats.call_errors += 1
            connection.send(p.Error(seq=seq, kind=type(exc).__name__, message=_clip(str(exc))))
            return
        except Exception as exc:
            self.stats.internal_errors += 1
            log.exception("internal error handling %s from uid %d", message.op, connection.peer.uid)
            connection.send(p.Error(seq=seq, kind=DaemonError.__name__, message=_clip(repr(exc))))
            return
        # The call's own callbacks go first, as they run before an in-process call returns.
        self._run_ready()
        if result is None:
            connection.send_frame(p.reply_frame(seq))
        elif isinstance(result, bytes):
            connection.send_frame(p.result_frame(seq, result))
        else:
            connection.send(p.Reply(seq=seq, result=result))

    def _hello(self, connection: Connection, hello: p.Hello) -> None:
        if connection.manager is not None:
            raise p.ProtocolError("a connection says hello only once")
        if hello.version != PROTOCOL_VERSION:
            raise p.ProtocolError(
                f"protocol version {hello.version} is not supported; this daemon speaks "
                f"version {PROTOCOL_VERSION}"
            )
        peer = connection.peer
        if peer.uid > INT32_MAX:
            raise p.ProtocolError(
                f"uid {peer.uid} is outside the uids the scheduling HAL carries "
                f"(0..{INT32_MAX}); this daemon cannot serve it"
            )
        self._awaiting_hello.pop(connection, None)
        connection.manager = self.service.manager(
            peer.uid, pid=peer.pid, uses_feature=hello.uses_feature
        )
        connection.send(
            p.Welcome(
                version=PROTOCOL_VERSION,
                uid=peer.uid,
                pid=peer.pid,
                gid=peer.gid,
                daemon_pid=os.getpid(),
                management=connection.management,
            )
        )

    def _fatal(self, connection: Connection, message: str) -> None:
        self.stats.protocol_errors += 1
        self._log.info(
            "closing uid %d pid %d: %s", connection.peer.uid, connection.peer.pid, message
        )
        connection.send(p.Error(kind="ProtocolError", message=_clip(message)))
        self._write(connection)
        self.drop(connection)

    def drop(self, connection: Connection) -> None:
        """Forget a connection at once; the client's requests end as if it had died."""
        if connection.closed:
            return
        connection.closed = True
        self.dirty.discard(connection)
        self._backlog.discard(connection)
        self._awaiting_hello.pop(connection, None)
        self._connections.pop(connection.fd, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection.sock)
        connection.sock.close()
        self.usage.give_back("connections", connection.peer.uid)
        self.buffered -= connection.buffered
        self._freed += connection.buffered
        manager = connection.manager
        connection.release()
        if manager is not None:
            self.stats.deaths += 1
            manager.close()
        self._info.changed()

    # Info -------------------------------------------------------------------------------

    def _on_info(self, connection: Connection, message: p.Info) -> bytes:
        uid = None if connection.management else connection.peer.uid
        return self._info.result_json(uid, message.offset, message.limit)

    def describe(self) -> dict[str, Any]:
        """The service's snapshot with the daemon's own: socket, counters, limits, clients."""
        document = self.service.snapshot()
        document["daemon"] = {
            "pid": os.getpid(),
            "socket": str(self.socket_path),
            "protocol_version": PROTOCOL_VERSION,
            "connections": len(self._connections),
            "max_connections": self.max_connections,
            "buffered_bytes": self.buffered,
            "limits": vars(self.limits),
            "suppressed_log_lines": self._log.suppressed,
            "info_snapshots": self._info.renewals,
            **self.stats.as_dict(),
        }
        document["clients"] = [
            {
                "client": c.manager.client,
                "uid": c.peer.uid,
                "pid": c.peer.pid,
                "requests": len(c.requests),
                "models": len(c.models),
            }
            for c in self._connections.values()
            if c.manager is not None
        ]
        return document

    # Shutdown ---------------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Complete every live request, tell the clients within a bound, close everything."""
        try:
            self.service.close()
        except Exception:
            log.exception("closing the service failed")
        self._turn()
        self._flush_all(time.monotonic() + SHUTDOWN_FLUSH_S)
        for connection in list(self._connections.values()):
            connection.manager = None  # the service is closed; nothing more to tell it
            self.drop(connection)
        if self._binding is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self._binding.listener)
            self._binding.close()
            self._binding = None
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _flush_all(self, deadline: float) -> None:
        """Write what every connection still has queued, for all of them until `deadline`."""
        with selectors.DefaultSelector() as writable:
            while True:
                waiting = [c for c in self._connections.values() if c.outbox and not c.closed]
                for connection in waiting:
                    self._write(connection)
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


def _clip(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["Daemon", "DaemonLimits", "DaemonStats"]
