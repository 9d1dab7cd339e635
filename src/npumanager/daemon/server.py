"""The daemon: one `Service` shared by every process that connects to its Unix socket.

One thread runs a selector loop over the listening socket, the clients' connections and
a wake-up descriptor. Frames are handled on that thread; the service's deliveries for a
connection are posted to it too, so every write to a client happens there, and a reply
and the decision it caused leave in one send. A client is known by the kernel's
credentials of its socket. When its connection closes, however it died, its requests end
at once (its loaded work is cancelled, the policy re-evaluates).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import selectors
import socket
import stat
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from npumanager.core.dispatch import Task
from npumanager.core.service import Service
from npumanager.daemon import protocol as p
from npumanager.daemon.calls import Calls, Handler
from npumanager.daemon.connection import Connection
from npumanager.daemon.peer import answers, peer_credentials
from npumanager.errors import DaemonError, NpuManagerError
from npumanager.schemas.limits import HELLO_TIMEOUT_S, PROTOCOL_VERSION, SOCKET_MODE

log = logging.getLogger(__name__)

_RECV_BYTES = 1 << 16
_LISTEN_BACKLOG = 512
_ACCEPT_PAUSE_S = 0.1
"""How long the daemon stops accepting when it runs out of file descriptors."""
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class DaemonStats:
    """Counters the daemon reports in `info`."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.accepted = 0
        self.frames_in = 0
        self.frames_out = 0
        self.protocol_errors = 0
        self.call_errors = 0
        self.internal_errors = 0
        self.dropped_slow = 0
        self.deaths = 0
        self.accept_pauses = 0

    def as_dict(self) -> dict[str, Any]:
        """Every counter, and the uptime in seconds."""
        counters = {k: v for k, v in vars(self).items() if k != "started"}
        return {"uptime_s": round(time.monotonic() - self.started, 3), **counters}


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
    ) -> None:
        self.service = service
        self.socket_path = Path(socket_path)
        self.socket_group = socket_group
        self.management_group = management_group
        self.hello_timeout_s = hello_timeout_s
        self._awaiting_hello: deque[tuple[float, Connection]] = deque()
        self.stats = DaemonStats()
        self.dirty: set[Connection] = set()
        self._connections: dict[int, Connection] = {}
        self._ready: deque[Task] = deque()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._listener: socket.socket | None = None
        self._lock_fd: int | None = None
        self._stopping = False
        self._loop_thread: int | None = None
        self._accept_resume_at: float | None = None
        self.calls = Calls(service, self.post, management_group)
        self._handlers: dict[type[p.Call], Handler] = {**self.calls.handlers, p.Info: self._on_info}

    # Binding ----------------------------------------------------------------------------

    def bind(self) -> None:
        """Take the socket path: refuse a live daemon, replace a stale socket, listen."""
        path = self.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _take_lock(path)
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                self._release_lock()
                raise NpuManagerError(
                    f"{path} exists and is not a socket; remove it or choose --socket"
                )
            if answers(path):
                self._release_lock()
                raise NpuManagerError(f"a daemon is already serving {path}")
            log.info("replacing the stale socket %s", path)
            path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o777 & ~SOCKET_MODE)
        try:
            listener.bind(str(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, SOCKET_MODE)
        if self.socket_group is not None:
            os.chown(path, -1, self.socket_group)
        listener.listen(_LISTEN_BACKLOG)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, self._accept)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._woken)

    # The loop ---------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Run until `stop()`, then close the service and every connection."""
        if self._listener is None:
            self.bind()
        self._loop_thread = threading.get_ident()
        select = self._selector.select
        try:
            while not self._stopping:
                for key, mask in select(self._timeout()):
                    key.data(key.fileobj, mask)
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
        while ready:
            ready.popleft()()

    def _turn(self) -> None:
        """Run posted deliveries, then write what each connection has queued."""
        self._run_ready()
        while self.dirty:
            connection = self.dirty.pop()
            self._write(connection)

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
                    log.warning("accept failed: %s", exc)
                return
            try:
                peer = peer_credentials(sock)
            except OSError as exc:
                log.warning("no credentials for a new connection (%s); closing it", exc)
                sock.close()
                continue
            sock.setblocking(False)
            connection = Connection(self, sock, peer)
            self._connections[sock.fileno()] = connection
            self._selector.register(sock, selectors.EVENT_READ, self._io)
            self._awaiting_hello.append((time.monotonic() + self.hello_timeout_s, connection))
            self.stats.accepted += 1

    def _timeout(self) -> float | None:
        """How long the loop may sleep: until accepting resumes or a hello is overdue."""
        times = [self._accept_resume_at] if self._accept_resume_at is not None else []
        if self._awaiting_hello:
            times.append(self._awaiting_hello[0][0])
        return max(0.0, min(times) - time.monotonic()) if times else None

    def _on_time(self, now: float) -> None:
        if self._accept_resume_at is not None and now >= self._accept_resume_at:
            self._resume_accepting()
        waiting = self._awaiting_hello
        while waiting and (waiting[0][1].manager is not None or waiting[0][1].closed):
            waiting.popleft()
        while waiting and waiting[0][0] <= now:
            _, connection = waiting.popleft()
            if connection.manager is None and not connection.closed:
                self._fatal(connection, f"no hello within {self.hello_timeout_s:g} s")

    def _pause_accepting(self, exc: OSError) -> None:
        """Out of descriptors: stop accepting for a moment instead of spinning on accept."""
        assert self._listener is not None
        self._selector.unregister(self._listener)
        self._accept_resume_at = time.monotonic() + _ACCEPT_PAUSE_S
        self.stats.accept_pauses += 1
        log.warning(
            "cannot accept connections (%s); %d open, trying again in %g s",
            exc.strerror,
            len(self._connections),
            _ACCEPT_PAUSE_S,
        )

    def _resume_accepting(self) -> None:
        self._accept_resume_at = None
        if self._listener is not None:
            self._selector.register(self._listener, selectors.EVENT_READ, self._accept)

    def _io(self, sock: Any, mask: int) -> None:
        connection = self._connections.get(sock.fileno())
        if connection is None:
            return
        if mask & selectors.EVENT_WRITE:
            self._write(connection)
        if mask & selectors.EVENT_READ and not connection.closed:
            self._read(connection)

    def _read(self, connection: Connection) -> None:
        try:
            data = connection.sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.drop(connection)
            return
        try:
            for body in connection.reader.feed(data):
                if connection.closed:
                    return
                self._frame(connection, body)
        except p.ProtocolError as exc:
            self._fatal(connection, str(exc))

    def _write(self, connection: Connection) -> None:
        if connection.closed:
            return
        outbox = connection.outbox
        try:
            while outbox:
                sent = connection.sock.send(outbox)
                del outbox[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self.drop(connection)
            return
        wants_write = bool(outbox)
        if wants_write != connection.writing:
            connection.writing = wants_write
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if wants_write else 0)
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
        try:
            result = self._handlers[type(message)](connection, message)
        except (NpuManagerError, TypeError, ValueError, LookupError, PermissionError) as exc:
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
                management=self.calls.may_manage(peer),
            )
        )

    def _fatal(self, connection: Connection, message: str) -> None:
        self.stats.protocol_errors += 1
        log.info("closing uid %d pid %d: %s", connection.peer.uid, connection.peer.pid, message)
        connection.send(p.Error(kind="ProtocolError", message=_clip(message)))
        self._write(connection)
        self.drop(connection)

    def drop(self, connection: Connection) -> None:
        """Forget a connection; the client's requests end as if it had died."""
        if connection.closed:
            return
        connection.closed = True
        self.dirty.discard(connection)
        self._connections.pop(connection.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection.sock)
        connection.sock.close()
        if connection.manager is not None:
            self.stats.deaths += 1
            connection.manager.close()
        connection.models.clear()
        connection.requests.clear()

    def _on_info(self, _connection: Connection, _message: p.Info) -> dict[str, Any]:
        return self.describe()

    def describe(self) -> dict[str, Any]:
        """The service's snapshot with the daemon's own: socket, counters, connections."""
        document = self.service.snapshot()
        document["daemon"] = {
            "pid": os.getpid(),
            "socket": str(self.socket_path),
            "protocol_version": PROTOCOL_VERSION,
            "connections": len(self._connections),
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
        """Complete every live request, tell the clients, close everything."""
        try:
            self.service.close()
        except Exception:
            log.exception("closing the service failed")
        self._turn()
        for connection in list(self._connections.values()):
            with contextlib.suppress(OSError):
                connection.sock.setblocking(True)
                connection.sock.settimeout(1.0)
                connection.sock.sendall(connection.outbox)
            connection.manager = None  # the service is closed; nothing more to tell it
            self.drop(connection)
        if self._listener is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self._listener)
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            self._listener = None
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _take_lock(path: Path) -> int:
    """Hold `<socket>.lock` for the daemon's life; a second daemon on the path is refused."""
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
            raise NpuManagerError(f"a daemon is already serving {path}") from None
        raise
    return fd


def _clip(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["Daemon", "DaemonStats"]
