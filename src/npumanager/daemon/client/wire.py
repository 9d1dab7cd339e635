"""One socket to the daemon: the hello, calls and their replies, the reader thread (the
protocol itself, framing, states and the pairing of calls and answers, is the wire's:
`daemon.wire.connection`).

`WireClient` sends each call with its seq and waits for the reply or error with that seq
(raising the daemon's error as the same class the in-process service raises); every other
frame goes to `_on_message` on the reader thread. `DaemonClient` builds the `NpuManager`
backend on it.
"""

from __future__ import annotations

import array
import contextlib
import itertools
import logging
import socket
import threading
from pathlib import Path
from typing import Any

from npumanager import errors
from npumanager.daemon.peer import default_socket_path
from npumanager.daemon.wire import protocol as p
from npumanager.daemon.wire.connection import NEED_DATA, Event, Role, WireConnection
from npumanager.errors import DaemonError, DaemonUnavailableError, ExecutionError
from npumanager.schemas.limits import DEFAULT_CALL_TIMEOUT_S, PROTOCOL_VERSION

log = logging.getLogger("npumanager.daemon.client.client")

_RECV_BYTES = 1 << 16
ERRORS: dict[str, type[Exception]] = {
    name: value
    for name, value in vars(errors).items()
    if isinstance(value, type) and issubclass(value, errors.NpuManagerError)
}
ERRORS.update(
    TypeError=TypeError, ValueError=ValueError, LookupError=LookupError, ProtocolError=DaemonError
)


class _Pending:
    """One call waiting for its reply: a lock held until the reply is in."""

    __slots__ = ("_lock", "error", "finished", "result")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.finished = False
        self.result: dict[str, Any] | None = None
        self.error: Exception | None = None

    def finish(self) -> None:
        self.finished = True
        self._lock.release()

    def wait(self, timeout: float) -> bool:
        return self._lock.acquire(timeout=timeout)


def unavailable(path: Path, exc: OSError) -> DaemonUnavailableError:
    if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
        return DaemonUnavailableError(
            f"no npu-manager daemon is listening on {path} (start one with `npu-manager serve`)"
        )
    if isinstance(exc, PermissionError):
        return DaemonUnavailableError(
            f"permission denied on {path}: the socket admits its owner and group only"
        )
    return DaemonUnavailableError(f"cannot reach the daemon on {path}: {exc.strerror or exc}")


class WireClient:
    """One connection: its socket, its calls in flight and the thread that reads replies."""

    def __init__(
        self,
        socket_path: str | Path | None,
        *,
        uses_feature: bool,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        self.socket_path = Path(socket_path) if socket_path is not None else default_socket_path()
        self.timeout_s = timeout_s
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(timeout_s)
            sock.connect(str(self.socket_path))
        except OSError as exc:
            sock.close()
            raise unavailable(self.socket_path, exc) from None
        self._sock = sock
        self._send_lock = threading.Lock()
        self._wire = WireConnection(Role.CLIENT)
        self._seq = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._closed = False
        self._lost: str | None = None
        self.welcome = self._handshake(uses_feature)
        self._thread = threading.Thread(target=self._read_forever, name="npu-client", daemon=True)
        self._reader_ident: int | None = None

    def start_reading(self) -> None:
        """Start the reader thread (once the subclass is ready for its frames)."""
        self._sock.settimeout(None)
        self._thread.start()

    def close_socket(self) -> None:
        """Shut the socket and wait for the reader thread (unless it is the caller)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if threading.get_ident() != self._reader_ident and self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sock.close()

    # What a subclass handles (on the reader thread) -------------------------------------

    def _on_message(self, message: Any) -> None:
        """A frame that is not the answer to a call."""

    def _on_refused(self, seq: int, error: Exception) -> None:
        """An error for a call nobody waits on (one sent with `send_only`)."""

    def _on_lost(self, error: Exception) -> None:
        """The connection is gone."""

    def _handshake(self, uses_feature: bool) -> p.Welcome:
        self._send(p.Hello(version=PROTOCOL_VERSION, uses_feature=uses_feature))
        while True:
            try:
                data = self._sock.recv(_RECV_BYTES)
            except OSError as exc:
                self._sock.close()
                raise unavailable(self.socket_path, exc) from None
            if not data:
                self._sock.close()
                raise DaemonUnavailableError(
                    f"the daemon on {self.socket_path} closed the connection"
                )
            self._wire.receive_data(data)
            while (event := self._next_event()) is not NEED_DATA:
                if isinstance(event, p.Welcome):
                    return event
                if isinstance(event, p.Error):
                    self._sock.close()
                    raise DaemonError(f"the daemon refused the connection: {event.message}")

    def _next_event(self) -> Event:
        try:
            return self._wire.next_event()
        except p.ProtocolError as exc:
            self._sock.close()
            raise DaemonError(f"the daemon sent an unreadable frame: {exc}") from None

    def next_seq(self) -> int:
        """A seq no call of this connection has used."""
        return next(self._seq)

    def call(
        self,
        kind: type[p.Call],
        *,
        seq: int | None = None,
        fds: list[int] | None = None,
        **fields: Any,
    ) -> dict[str, Any] | None:
        """One call (with descriptors sent alongside, if any); its result or its error."""
        return self._call(kind, seq=seq, fds=fds, **fields)

    def send_only(self, kind: type[p.Call], seq: int, **fields: Any) -> None:
        """Send one call without waiting: its answer goes to whoever expects `seq`."""
        self.send_frame(p.encode(kind(seq=seq, **fields)), seq)

    def send_frame(self, frame: bytes, seq: int) -> None:
        """Send one call encoded elsewhere, of this seq, without waiting for its answer."""
        if self._lost is not None:
            raise DaemonUnavailableError(self._lost)
        if self._closed:
            raise DaemonUnavailableError("this connection to the daemon is closed")
        try:
            with self._send_lock:
                self._wire.sent_call(seq)
                self._sock.sendall(frame)
        except OSError:
            self._lose("the daemon closed the connection")
            raise DaemonUnavailableError(self._lost or "the daemon closed the connection") from None

    @staticmethod
    def error_class(kind: str | None) -> type[Exception]:
        """The exception class the daemon named (`ExecutionError` when it names none)."""
        return ERRORS.get(kind or "", ExecutionError)

    @staticmethod
    def refusal_class(kind: str | None) -> type[Exception]:
        """The exception class of a refused call the daemon named (`DaemonError` when it
        names none this client knows)."""
        return ERRORS.get(kind or "", DaemonError)

    def _send(self, message: p.WireModel, fds: list[int] | None = None) -> None:
        with self._send_lock:
            frame = self._wire.send(message)
            if not fds:
                self._sock.sendall(frame)
                return
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
            sent = self._sock.sendmsg([frame], rights)
            if sent < len(frame):
                self._sock.sendall(frame[sent:])

    def _call(
        self,
        kind: type[p.Call],
        *,
        seq: int | None = None,
        fds: list[int] | None = None,
        **fields: Any,
    ) -> dict[str, Any] | None:
        """Send one call of this kind and wait for its reply; raise its error."""
        if self._lost is not None:
            raise DaemonUnavailableError(self._lost)
        if self._closed:
            raise DaemonUnavailableError("this connection to the daemon is closed")
        seq = next(self._seq) if seq is None else seq
        pending = _Pending()
        self._pending[seq] = pending
        try:
            self._send(kind(seq=seq, **fields), fds)
        except OSError:
            self._pending.pop(seq, None)
            self._lose("the daemon closed the connection")
            raise DaemonUnavailableError(self._lost or "the daemon closed the connection") from None
        if threading.get_ident() == self._reader_ident:
            # A callback running on the reader thread: read the reply here.
            while not pending.finished and self._pump():
                pass
        elif not pending.wait(self.timeout_s):
            self._pending.pop(seq, None)
            raise DaemonError(f"the daemon did not answer within {self.timeout_s:g} s")
        if pending.error is not None:
            raise pending.error
        return pending.result

    def _read_forever(self) -> None:
        self._reader_ident = threading.get_ident()
        while self._pump():
            pass

    def _pump(self) -> bool:
        """Read once and handle every complete frame; False once the connection is gone."""
        if self._lost is not None:
            return False
        try:
            data = self._sock.recv(_RECV_BYTES)
        except OSError:
            data = b""
        if not data:
            self._lose("the daemon closed the connection")
            return False
        self._wire.receive_data(data)
        try:
            while (event := self._wire.next_event()) is not NEED_DATA:
                self._handle(event)
        except p.ProtocolError as exc:
            log.error("the daemon sent a frame this client cannot read: %s", exc)
            self._lose(f"the daemon sent an unreadable frame: {exc}")
            return False
        return True

    def _lose(self, why: str) -> None:
        if self._lost is None:
            self._lost = why if not self._closed else "this connection to the daemon is closed"
        self._on_lost(DaemonUnavailableError(self._lost))
        for seq in list(self._pending):
            pending = self._pending.pop(seq, None)  # whoever pops a call finishes it
            if pending is not None:
                pending.error = DaemonUnavailableError(self._lost)
                pending.finish()

    def _handle(self, message: Any) -> None:
        if isinstance(message, p.Reply | p.Error) and message.seq is not None:
            pending = self._pending.pop(message.seq, None)
            if pending is None:
                if isinstance(message, p.Error):
                    error = ERRORS.get(message.kind, DaemonError)(message.message)
                    self._on_refused(message.seq, error)
                return
            if isinstance(message, p.Error):
                pending.error = ERRORS.get(message.kind, DaemonError)(message.message)
            else:
                pending.result = message.result
            pending.finish()
        elif isinstance(message, p.Error):
            log.error("the daemon is closing this connection: %s", message.message)
            self._lose(f"the daemon closed the connection: {message.message}")
        else:
            self._on_message(message)
