"""The client side of the daemon: `connect()` gives an `NpuManager` that talks over the socket.

One `DaemonClient` is one connection, one client of the service, one `NpuManager`. Calls
are synchronous: each waits for its reply and raises the daemon's error as the same
exception class the in-process service raises. Decisions arrive on a reader thread and
are delivered to each request's callback on its executor, in order, exactly as in process
(the default executor is one dispatcher thread per connection). With a real driver in the
daemon, `load_model(path=...)` sends the file's descriptor and `LoadedModel.run/submit`
move tensors through the connection's shared segment (`daemon.client.inference`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from npumanager import errors
from npumanager.checks import check_int, group_bytes
from npumanager.core.client.dispatch import DeliveryStats, ExecutorLike, SerialQueue
from npumanager.core.client.lease import asked_fields
from npumanager.core.client.manager import (
    Delivery,
    LoadedModel,
    ModelLoadRequestCallback,
    NpuManager,
    takes_reason,
)
from npumanager.daemon.client import models as remote_models
from npumanager.daemon.client.inference import RemoteInference, RemoteWork
from npumanager.daemon.client.wire import WireClient
from npumanager.daemon.wire import protocol as p
from npumanager.errors import (
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
    DEFAULT_LANE_SPIN_US,
    MAX_LANE_SPIN_US,
)

log = logging.getLogger(__name__)


class DaemonClient(WireClient):
    """One connection to the daemon; `manager()` is its `NpuManager`."""

    clock = "real"

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        uses_feature: bool = False,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        shared_bytes: int = DEFAULT_CLIENT_SHARED_BYTES,
        lane_spin_us: int = DEFAULT_LANE_SPIN_US,
    ) -> None:
        spin = check_int("lane_spin_us", lane_spin_us, 0, MAX_LANE_SPIN_US)
        super().__init__(socket_path, uses_feature=uses_feature, timeout_s=timeout_s)
        self._remote: dict[int, Delivery] = {}
        self._stats = DeliveryStats()
        self._dispatcher: ThreadPoolExecutor | None = None
        self._inference = RemoteInference(self, shared_bytes, spin)
        welcome = self.welcome
        self.uid = welcome.uid
        self.pid = welcome.pid
        self.gid = welcome.gid
        self.daemon_pid = welcome.daemon_pid
        self.may_manage = welcome.management
        self.app_id = welcome.app_id
        """The app the daemon found this process in (its cgroup's), or ``uid:<uid>``."""
        self.hal_uid = welcome.hal_uid
        """The uid the arbiter, the policies and the driver know the app by (its work's
        ``WorkInfo.uid``); the real uid, ``uid``, still decides permissions."""
        self._manager = NpuManager(self, 1, welcome.hal_uid, welcome.pid, uses_feature)
        self._manager.app_id = welcome.app_id
        self.start_reading()

    # Public -----------------------------------------------------------------------------

    def manager(self) -> NpuManager:
        """This connection's `NpuManager` (the same object every time)."""
        return self._manager

    def info(self, *, offset: int = 0, limit: int = DEFAULT_INFO_LIMIT) -> dict[str, Any]:
        """The daemon's state: policy, priorities, requests by state, devices, clients.

        Each list holds at most ``limit`` entries from ``offset`` on (counts are whole); without
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

    def set_uid_importance(self, uid: int, importance: int | None) -> None:
        """Pin the importance of every app of a uid (management permission); None takes
        the pin away, so the importance sources rank its apps again."""
        self._call(
            p.SetImportance, uid=uid, importance=None if importance is None else int(importance)
        )

    def set_app_importance(self, app_id: str, importance: int | None) -> None:
        """Pin an app's importance by its app id, whether or not it runs yet (management
        permission); None takes the pin away."""
        self._call(
            p.SetImportance,
            app_id=app_id,
            importance=None if importance is None else int(importance),
        )

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
        self._inference.close()
        self.close_socket()
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
            raise errors.DuplicateRequestError.of(request.id)
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
        self,
        manager: NpuManager,
        request: ModelLoadRequest,
        model: Any,
        path: Any,
        sram: int,
        *,
        threads: int | None = None,
        options: Mapping[str, str] | None = None,
    ) -> LoadedModel:
        asked = asked_fields(threads, options)
        return remote_models.load(
            self, self._inference.segment, manager, request, model, path, sram, asked
        )

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

    def shared_array(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._inference.shared_array(shape, dtype)

    # The wire ---------------------------------------------------------------------------

    def _default_executor(self) -> ThreadPoolExecutor:
        if self._dispatcher is None:
            self._dispatcher = ThreadPoolExecutor(1, thread_name_prefix="npu-client-dispatch")
        return self._dispatcher

    def _on_message(self, message: Any) -> None:
        if isinstance(message, p.WorkEnded):
            self._inference.ended(message)
        elif isinstance(message, p.Decision | p.UnloadAsked | p.Completed):
            self._event(message)

    def _on_refused(self, seq: int, error: Exception) -> None:
        self._inference.refused(seq, error)

    def _on_lost(self, error: Exception) -> None:
        self._inference.lost(error)

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
    lane_spin_us: int = DEFAULT_LANE_SPIN_US,
) -> NpuManager:
    """An `~npumanager.NpuManager` served by the daemon on ``socket_path`` (default: the
    per-user socket).

    The daemon knows the caller by the kernel's credentials of the connection. Close the
    manager (or use it as a context manager) to leave; its requests then end. Real
    inference (``load_model(path=...)``, `~npumanager.LoadedModel.run`) moves tensors
    through a shared segment of ``shared_bytes``, made on first use. While a run's replies
    come within ``lane_spin_us`` microseconds, the caller polls for them that long before
    it sleeps (quicker answers for up to that much CPU a run; 0: always sleep).
    """
    client = DaemonClient(
        socket_path,
        uses_feature=uses_feature,
        timeout_s=timeout_s,
        shared_bytes=shared_bytes,
        lane_spin_us=lane_spin_us,
    )
    return client.manager()
