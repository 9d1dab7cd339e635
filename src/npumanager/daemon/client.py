"""The client side of the daemon: `connect()` gives an `NpuManager` that talks over the socket.

One `DaemonClient` is one connection, one client of the service, one `NpuManager`. Calls
are synchronous: each waits for its reply and raises the daemon's error as the same
exception class the in-process service raises. Decisions arrive on a reader thread and
are delivered to each request's callback on its executor, in order, exactly as in process
(the default executor is one dispatcher thread per connection).
"""

from __future__ import annotations

import array
import contextlib
import itertools
import logging
import socket
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from npumanager import errors
from npumanager.checks import group_bytes
from npumanager.core.client import (
    Delivery,
    LoadedModel,
    ModelLoadRequestCallback,
    NpuManager,
    takes_reason,
)
from npumanager.core.dispatch import DeliveryStats, ExecutorLike, SerialQueue
from npumanager.daemon import protocol as p
from npumanager.daemon.peer import default_socket_path
from npumanager.daemon.remote_inference import RemoteInference, RemoteWork
from npumanager.errors import (
    DaemonError,
    DaemonUnavailableError,
    ExecutionError,
    IllegalArgumentError,
)
from npumanager.schemas import (
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    ModelPolicy,
    NpuUuid,
    UnloadReason,
)
from npumanager.schemas.limits import (
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_CLIENT_SHARED_BYTES,
    DEFAULT_INFO_LIMIT,
    PROTOCOL_VERSION,
)

log = logging.getLogger(__name__)

_RECV_BYTES = 1 << 16
_ERRORS: dict[str, type[Exception]] = {
    name: value
    for name, value in vars(errors).items()
    if isinstance(value, type) and issubclass(value, errors.NpuManagerError)
}
_ERRORS.update(
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


def _unavailable(path: Path, exc: OSError) -> DaemonUnavailableError:
    if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
        return DaemonUnavailableError(
            f"no npu-manager daemon is listening on {path} (start one with `npu-manager serve`)"
        )
    if isinstance(exc, PermissionError):
        return DaemonUnavailableError(
            f"permission denied on {path}: the socket admits its owner and group only"
        )
    return DaemonUnavailableError(f"cannot reach the daemon on {path}: {exc.strerror or exc}")


class DaemonClient:
    """One connection to the daemon; `manager()` is its `NpuManager`."""

    clock = "real"

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        uses_feature: bool = False,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        shared_bytes: int = DEFAULT_CLIENT_SHARED_BYTES,
    ) -> None:
        self.socket_path = Path(socket_path) if socket_path is not None else default_socket_path()
        self.timeout_s = timeout_s
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(timeout_s)
            sock.connect(str(self.socket_path))
        except OSError as exc:
            sock.close()
            raise _unavailable(self.socket_path, exc) from None
        self._sock = sock
        self._send_lock = threading.Lock()
        self._reader = p.FrameReader()
        self._seq = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._remote: dict[int, Delivery] = {}
        self._stats = DeliveryStats()
        self._dispatcher: ThreadPoolExecutor | None = None
        self._closed = False
        self._lost: str | None = None
        self._inference = RemoteInference(self, shared_bytes)
        welcome = self._handshake(uses_feature)
        self.uid = welcome.uid
        self.pid = welcome.pid
        self.gid = welcome.gid
        self.daemon_pid = welcome.daemon_pid
        self.may_manage = welcome.management
        self._manager = NpuManager(self, 1, welcome.uid, welcome.pid, uses_feature)
        sock.settimeout(None)
        self._thread = threading.Thread(target=self._read_forever, name="npu-client", daemon=True)
        self._reader_ident: int | None = None
        self._thread.start()

    def _handshake(self, uses_feature: bool) -> p.Welcome:
        self._send(p.Hello(version=PROTOCOL_VERSION, uses_feature=uses_feature))
        while True:
            try:
                data = self._sock.recv(_RECV_BYTES)
            except OSError as exc:
                self._sock.close()
                raise _unavailable(self.socket_path, exc) from None
            if not data:
                self._sock.close()
                raise DaemonUnavailableError(
                    f"the daemon on {self.socket_path} closed the connection"
                )
            for body in self._reader.feed(data):
                message = p.parse_daemon(body)
                if isinstance(message, p.Welcome):
                    return message
                if isinstance(message, p.Error):
                    self._sock.close()
                    raise DaemonError(f"the daemon refused the connection: {message.message}")

    # Public -----------------------------------------------------------------------------

    def manager(self) -> NpuManager:
        """This connection's `NpuManager` (the same object every time)."""
        return self._manager

    def info(self, *, offset: int = 0, limit: int = DEFAULT_INFO_LIMIT) -> dict[str, Any]:
        """The daemon's state: policy, priorities, requests by state, devices, clients.

        Each list holds at most `limit` entries from `offset` on (counts are whole); without
        the management permission, only this uid's entries are listed.
        """
        return self._call(p.Info, offset=offset, limit=limit) or {}

    def set_policy(
        self, policy: str | ModelPolicy | int, params: Mapping[str, Any] | None = None
    ) -> str:
        """Swap the daemon's policy (management permission); returns the policy now in force."""
        name: str | int = policy if isinstance(policy, str) else int(policy)
        result = self._call(
            p.SetPolicy, policy=name, params=dict(params) if params is not None else None
        )
        return str((result or {}).get("policy", name))

    def set_uid_importance(self, uid: int, importance: int) -> None:
        """Set a uid's importance (management permission)."""
        self._call(p.SetImportance, uid=uid, importance=int(importance))

    def set_uid_access(
        self,
        uid: int,
        *,
        has_direct_access: bool | None = None,
        can_attribute_other_uid: bool | None = None,
    ) -> None:
        """Override a uid's direct access or attribution (management permission)."""
        self._call(
            p.SetAccess,
            uid=uid,
            has_direct_access=has_direct_access,
            can_attribute_other_uid=can_attribute_other_uid,
        )

    @property
    def now_ms(self) -> int:
        """The monotonic clock in milliseconds (the daemon runs in real time)."""
        return time.monotonic_ns() // 1_000_000

    def quiescent(self) -> bool:
        """Always False: a daemon's clock runs by itself."""
        return False

    def advance(self, ms: int) -> None:
        """Refused: a daemon runs in real time."""
        raise IllegalArgumentError("advance() needs a virtual clock; the daemon runs in real time")

    @property
    def callback_errors(self) -> int:
        """Callbacks of this connection that raised (logged, isolated)."""
        return self._stats.failed

    def close(self) -> None:
        """Leave: the daemon ends this client's requests, as if it had died."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if threading.get_ident() != self._reader_ident:
            self._thread.join(timeout=5)
        self._sock.close()
        if self._dispatcher is not None:
            self._dispatcher.shutdown(wait=False)

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # What NpuManager calls --------------------------------------------------------------

    def close_client(self, _manager: NpuManager) -> None:
        self.close()

    def request_load(
        self,
        manager: NpuManager,
        request: ModelLoadRequest,
        callback: ModelLoadRequestCallback,
        executor: ExecutorLike | None,
        weight_bytes: int | None,
    ) -> None:
        executor = executor or self._default_executor()
        remote = Delivery(
            manager, request, callback, SerialQueue(executor, self._stats), takes_reason(callback)
        )
        if self._remote.setdefault(request.id, remote) is not remote:
            raise errors.DuplicateRequestError(
                f"request id {request.id} is already live for this client; ids may be "
                "reused only after the request completes"
            )
        try:
            self._call(
                p.RequestCanLoad,
                request=request,
                weight_bytes=weight_bytes,
                uses_feature=manager.uses_feature,
            )
        except BaseException:
            if self._remote.get(request.id) is remote:
                del self._remote[request.id]
            raise

    def cancel_load(self, _manager: NpuManager, request: ModelLoadRequest) -> None:
        self._call(p.CancelLoad, request_id=request.id)

    def notify_loaded(self, _manager: NpuManager, request: ModelLoadRequest) -> None:
        self._call(p.NotifyLoaded, request_id=request.id)

    def notify_unloaded(self, _manager: NpuManager, request: ModelLoadRequest) -> None:
        self._call(p.NotifyUnloaded, request_id=request.id)

    def set_policy_as(
        self,
        _manager: NpuManager,
        policy: str | ModelPolicy | int,
        params: Mapping[str, Any] | None,
    ) -> None:
        self.set_policy(policy, params)

    def load_model(
        self, manager: NpuManager, request: ModelLoadRequest, weight_bytes: int, sram_bytes: int
    ) -> LoadedModel:
        result = self._call(
            p.LoadModel, request_id=request.id, weight_bytes=weight_bytes, sram_bytes=sram_bytes
        )
        assert result is not None
        return LoadedModel(manager, request, int(result["model"]), int(result["device"]))

    def submit_work(
        self,
        model: LoadedModel,
        cost_cycles: int,
        job_priority: int,
        original_uid: int | None,
        group_id: Any,
        feature_id: str | None,
    ) -> int:
        raw = group_bytes(group_id)
        result = self._call(
            p.Submit,
            model=model.handle,
            cost_cycles=cost_cycles,
            job_priority=job_priority,
            original_uid=original_uid,
            group_id=None if raw is None else NpuUuid(value=raw),
            feature_id=feature_id,
        )
        assert result is not None
        return int(result["work_id"])

    def cancel_work(self, model: LoadedModel, work_id: int) -> None:
        self._call(p.CancelWork, model=model.handle, work_id=work_id)

    def load_real_model(
        self, manager: NpuManager, request: ModelLoadRequest, model: Any, path: Any, sram: int
    ) -> LoadedModel:
        return self._inference.load(manager, request, model, path, sram)

    def submit_inference(
        self,
        model: LoadedModel,
        inputs: Mapping[str, Any],
        job_priority: int,
        original_uid: int | None,
        group_id: Any,
        feature_id: str | None,
    ) -> RemoteWork:
        return self._inference.submit(
            model, inputs, job_priority, original_uid, group_id, feature_id
        )

    def run_inference(
        self,
        model: LoadedModel,
        inputs: Mapping[str, Any],
        job_priority: int,
        timeout: float | None,
    ) -> list[Any]:
        return self._inference.run(model, inputs, job_priority, timeout)

    # What the real-inference side needs of the wire ---------------------------------------

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
        self.send_frame(p.encode(kind(seq=seq, **fields)))

    def send_frame(self, frame: bytes) -> None:
        """Send one encoded call without waiting for its answer."""
        if self._lost is not None:
            raise DaemonUnavailableError(self._lost)
        if self._closed:
            raise DaemonUnavailableError("this connection to the daemon is closed")
        try:
            with self._send_lock:
                self._sock.sendall(frame)
        except OSError:
            self._lose("the daemon closed the connection")
            raise DaemonUnavailableError(self._lost or "the daemon closed the connection") from None

    @staticmethod
    def error_class(kind: str | None) -> type[Exception]:
        """The exception class the daemon named (`ExecutionError` when it names none)."""
        return _ERRORS.get(kind or "", ExecutionError)

    # The wire ---------------------------------------------------------------------------

    def _default_executor(self) -> ThreadPoolExecutor:
        if self._dispatcher is None:
            self._dispatcher = ThreadPoolExecutor(1, thread_name_prefix="npu-client-dispatch")
        return self._dispatcher

    def _send(self, message: p.WireModel, fds: list[int] | None = None) -> None:
        frame = p.encode(message)
        with self._send_lock:
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
        try:
            for body in self._reader.feed(data):
                self._handle(p.parse_daemon(body))
        except p.ProtocolError as exc:
            log.error("the daemon sent a frame this client cannot read: %s", exc)
            self._lose(f"the daemon sent an unreadable frame: {exc}")
            return False
        return True

    def _lose(self, why: str) -> None:
        if self._lost is None:
            self._lost = why if not self._closed else "this connection to the daemon is closed"
        self._inference.lost(DaemonUnavailableError(self._lost))
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
                    error = _ERRORS.get(message.kind, DaemonError)(message.message)
                    self._inference.refused(message.seq, error)
                return
            if isinstance(message, p.Error):
                pending.error = _ERRORS.get(message.kind, DaemonError)(message.message)
            else:
                pending.result = message.result
            pending.finish()
        elif isinstance(message, p.Error):
            log.error("the daemon is closing this connection: %s", message.message)
            self._lose(f"the daemon closed the connection: {message.message}")
        elif isinstance(message, p.WorkEnded):
            self._inference.ended(message)
        elif isinstance(message, p.Decision | p.UnloadAsked | p.Completed):
            self._event(message)

    def _event(self, message: p.Decision | p.UnloadAsked | p.Completed) -> None:
        remote = self._remote.get(message.request_id)
        if remote is None:
            log.warning("an event for request %d, which is not live here", message.request_id)
            return
        if isinstance(message, p.Decision):
            task = remote.decided(ModelLoadStatus(message.status))
        elif isinstance(message, p.UnloadAsked):
            reason = None if message.reason is None else UnloadReason(message.reason)
            task = remote.unload_asked(reason)
        else:
            del self._remote[message.request_id]
            task = remote.completed(ModelLoadRequestStatus(message.status))
        if remote.queue.put(task):
            remote.queue.schedule()


def connect(
    socket_path: str | Path | None = None,
    *,
    uses_feature: bool = False,
    timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    shared_bytes: int = DEFAULT_CLIENT_SHARED_BYTES,
) -> NpuManager:
    """An `NpuManager` served by the daemon on `socket_path` (default: the per-user socket).

    The daemon knows the caller by the kernel's credentials of the connection. Close the
    manager (or use it as a context manager) to leave; its requests then end. Real
    inference (`load_model(path=...)`, `LoadedModel.run`) moves tensors through a shared
    segment of `shared_bytes`, made on first use.
    """
    client = DaemonClient(
        socket_path, uses_feature=uses_feature, timeout_s=timeout_s, shared_bytes=shared_bytes
    )
    return client.manager()
