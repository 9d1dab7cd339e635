"""The client API: `NpuManager`, the callback it calls, the listener it hands back.

An app asks before it loads a model: `request_can_load_model(request, callback)`. The
service answers through the callback, on the app's executor, in order per request:
`on_can_load_model` (CAN_LOAD_NOW, WAIT_FOR_UNLOAD or NOT_PRIORITIZED, possibly more than
once), `on_request_unload_model` under pressure, and exactly one
`on_model_load_request_complete` at the end.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from npumanager.core.dispatch import ExecutorLike, SerialQueue, Task, check_executor
from npumanager.schemas import (
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    ModelPolicy,
    UnloadReason,
)

if TYPE_CHECKING:
    from npumanager.core.lease import AsyncLease, Lease


class ModelLoadRequestCallback:
    """Override what you need; every method does nothing by default."""

    def on_can_load_model(
        self, request: ModelLoadRequest, status: ModelLoadStatus, listener: ModelLoadStatusListener
    ) -> None:
        """A decision: load now, wait for others to unload, or not now."""

    def on_request_unload_model(
        self, request: ModelLoadRequest, reason: UnloadReason | None = None
    ) -> None:
        """Release the model, then call `listener.notify_model_unloaded(request)`."""

    def on_model_load_request_complete(
        self, request: ModelLoadRequest, status: ModelLoadRequestStatus
    ) -> None:
        """The request is over: CANCELLED (before loading) or COMPLETE (unloaded)."""


def takes_reason(callback: object) -> bool:
    """True if the callback's `on_request_unload_model` accepts a reason argument."""
    method = getattr(callback, "on_request_unload_model", None)
    if method is None:
        return False
    function = getattr(method, "__func__", None)
    if function is None:
        return _accepts_two(method)
    return _function_accepts_reason(function)


@functools.lru_cache(maxsize=256)
def _function_accepts_reason(function: Any) -> bool:
    """For a plain function (self, request[, reason]): whether the reason fits."""
    return _accepts_two(functools.partial(function, None))


def _accepts_two(method: Any) -> bool:
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return True
    params = list(signature.parameters.values())
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params):
        return True
    return len(params) >= 2


def check_callback(callback: object) -> None:
    """A `TypeError` naming what is missing, unless `callback` has the three methods."""
    missing = [
        name
        for name in (
            "on_can_load_model",
            "on_request_unload_model",
            "on_model_load_request_complete",
        )
        if not callable(getattr(callback, name, None))
    ]
    if missing:
        raise TypeError(
            f"callback must implement {', '.join(missing)} "
            "(subclass npumanager.ModelLoadRequestCallback)"
        )


@dataclass
class Delivery:
    """One live request's callback, fed in order through its queue by either backend."""

    manager: NpuManager
    request: ModelLoadRequest
    callback: ModelLoadRequestCallback
    queue: SerialQueue
    with_reason: bool

    def decided(self, status: ModelLoadStatus) -> Task:
        """The task that tells the callback `on_can_load_model`."""

        def task() -> None:
            self.callback.on_can_load_model(self.request, status, self.manager.listener)

        return task

    def unload_asked(self, reason: UnloadReason | None) -> Task:
        """The task that tells the callback `on_request_unload_model` (with the reason if it
        takes one)."""

        def task() -> None:
            if self.with_reason:
                self.callback.on_request_unload_model(self.request, reason)
            else:
                self.callback.on_request_unload_model(self.request)

        return task

    def completed(self, status: ModelLoadRequestStatus) -> Task:
        """The task that tells the callback `on_model_load_request_complete`."""

        def task() -> None:
            self.callback.on_model_load_request_complete(self.request, status)

        return task


class ModelLoadStatusListener:
    """The token handed with a decision: report loaded and unloaded through it."""

    def __init__(self, manager: NpuManager) -> None:
        self._manager = manager

    def notify_model_loaded(self, request: ModelLoadRequest) -> None:
        """The model is fully in driver memory."""
        self._manager._service._notify_loaded(self._manager, request)

    def notify_model_unloaded(self, request: ModelLoadRequest) -> None:
        """The model is out of driver memory; the request completes."""
        self._manager._service._notify_unloaded(self._manager, request)


POLICY_NAMES: dict[ModelPolicy, str] = {
    ModelPolicy.STATUS_QUO: "status_quo",
    ModelPolicy.TURN_TAKING: "turn_taking",
    ModelPolicy.BUDGET: "budget",
}
"""The platform's policy constants by the plugin name that implements each."""


class Backend(Protocol):
    """What an `NpuManager` talks to: the in-process `Service`, or a `DaemonClient`.

    The leading underscore marks these as the two backends' contract, not an app's API.
    """

    @property
    def clock(self) -> str:
        """'virtual' or 'real'."""

    @property
    def now_ms(self) -> int:
        """The service clock, in milliseconds."""

    def quiescent(self) -> bool:
        """Virtual time: True when nothing will change by itself."""

    def advance(self, ms: int) -> None:
        """Virtual time: run forward by `ms` milliseconds."""

    def _request(
        self,
        manager: NpuManager,
        request: ModelLoadRequest,
        callback: ModelLoadRequestCallback,
        executor: ExecutorLike | None,
        weight_bytes: int | None,
    ) -> None: ...

    def _cancel(self, manager: NpuManager, request: ModelLoadRequest) -> None: ...

    def _notify_loaded(self, manager: NpuManager, request: ModelLoadRequest) -> None: ...

    def _notify_unloaded(self, manager: NpuManager, request: ModelLoadRequest) -> None: ...

    def _set_policy_as(
        self, manager: NpuManager, policy: str | ModelPolicy | int, params: Mapping[str, Any] | None
    ) -> None: ...

    def _close_client(self, manager: NpuManager) -> None: ...

    def _load_model(
        self, manager: NpuManager, request: ModelLoadRequest, weight_bytes: int, sram_bytes: int
    ) -> LoadedModel: ...

    def _submit(
        self,
        model: LoadedModel,
        cost_cycles: int,
        job_priority: int,
        original_uid: int | None,
        group_id: Any,
        feature_id: str | None,
    ) -> int: ...

    def _cancel_work(self, model: LoadedModel, work_id: int) -> None: ...


class NpuManager:
    """One client of the service, bound to a uid (and a pid, for the record)."""

    def __init__(
        self, service: Backend, client: int, uid: int, pid: int | None, uses_feature: bool
    ) -> None:
        self._service = service
        self.client = client
        self.uid = uid
        self.pid = pid
        self.uses_feature = uses_feature
        self.listener = ModelLoadStatusListener(self)

    def __repr__(self) -> str:
        return f"NpuManager(uid={self.uid}, pid={self.pid}, client={self.client})"

    def request_can_load_model(
        self,
        request: ModelLoadRequest,
        callback: ModelLoadRequestCallback,
        executor: ExecutorLike | None = None,
        *,
        weight_bytes: int | None = None,
    ) -> None:
        """Ask whether the model of `request` may be loaded; the answer comes to `callback`.

        `weight_bytes`, if known, lets capacity-aware policies count real bytes.
        """
        if not isinstance(request, ModelLoadRequest):
            raise TypeError(f"request must be a ModelLoadRequest; got {type(request).__name__}")
        check_callback(callback)
        self._service._request(self, request, callback, check_executor(executor), weight_bytes)

    def cancel_model_load(self, request: ModelLoadRequest) -> None:
        """Withdraw a live request of this client; it completes (CANCELLED or COMPLETE)."""
        self._service._cancel(self, request)

    def set_policy(
        self, policy: str | ModelPolicy | int, params: Mapping[str, Any] | None = None
    ) -> None:
        """Swap the model-loading policy; needs the management permission."""
        self._service._set_policy_as(self, policy, params)

    def close(self) -> None:
        """Leave the service: this client's live requests end as if it had died."""
        self._service._close_client(self)

    def __enter__(self) -> NpuManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def declare_feature(self) -> None:
        """Declare use of the NPU feature (the platform's `uses-feature`)."""
        self.uses_feature = True

    def load_model(
        self, request: ModelLoadRequest, *, weight_bytes: int, sram_bytes: int = 0
    ) -> LoadedModel:
        """Put a granted request's model into driver memory, on the device it was given."""
        return self._service._load_model(self, request, weight_bytes, sram_bytes)

    def reserve(
        self,
        request: ModelLoadRequest,
        *,
        timeout_s: float | None = None,
        weight_bytes: int | None = None,
    ) -> Lease:
        """A context manager that waits for CAN_LOAD_NOW and reports unloaded on exit."""
        from npumanager.core.lease import Lease

        return Lease(self, request, timeout_s=timeout_s, weight_bytes=weight_bytes)

    def reserve_async(
        self,
        request: ModelLoadRequest,
        *,
        timeout_s: float | None = None,
        weight_bytes: int | None = None,
    ) -> AsyncLease:
        """The same as `reserve`, for `async with`."""
        from npumanager.core.lease import AsyncLease

        return AsyncLease(self, request, timeout_s=timeout_s, weight_bytes=weight_bytes)


class LoadedModel:
    """A model in driver memory under a granted request; submit work to it."""

    def __init__(
        self,
        manager: NpuManager,
        request: ModelLoadRequest,
        handle: int,
        device: int,
        *,
        weight_bytes: int = 0,
    ) -> None:
        self.manager = manager
        self.request = request
        self.handle = handle
        self.device = device
        self.weight_bytes = weight_bytes

    def submit(
        self,
        cost_cycles: int,
        *,
        job_priority: int = 0,
        original_uid: int | None = None,
        group_id: Any = None,
        feature_id: str | None = None,
    ) -> int:
        """Run one job of `cost_cycles` on the model; returns the work id."""
        return self.manager._service._submit(
            self, cost_cycles, job_priority, original_uid, group_id, feature_id
        )

    def cancel(self, work_id: int) -> None:
        """Cancel one of this model's jobs (it ends CANCELLED_USER)."""
        self.manager._service._cancel_work(self, work_id)
