"""The client API: `NpuManager`, the callback it calls, the listener it hands back.

An app asks before it loads a model: `request_can_load_model(request, callback)`. The
service answers through the callback, on the app's executor, in order per request:
`on_can_load_model` (CAN_LOAD_NOW, WAIT_FOR_UNLOAD or NOT_PRIORITIZED, possibly more than
once), `on_request_unload_model` under pressure, and exactly one
`on_model_load_request_complete` at the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, overload

from npumanager.checks import GroupId, check_runtime_options, check_threads
from npumanager.core.arbiter.actions import RequestKey
from npumanager.core.client.callbacks import (
    ModelLoadRequestCallback,
    StatusListener,
    check_callback,
    takes_reason,
)
from npumanager.core.client.dispatch import ExecutorLike, SerialQueue, Task, check_executor
from npumanager.core.client.lease import AsyncLease, Lease, LeaseEndedError, TimeSource
from npumanager.core.driver.contract import WorkHandle
from npumanager.schemas import (
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    ModelPolicy,
    UnloadReason,
)

__all__ = [
    "AsyncLease",
    "Backend",
    "Delivery",
    "Lease",
    "LeaseEndedError",
    "LoadedModel",
    "ModelLoadRequestCallback",
    "ModelLoadStatusListener",
    "NpuManager",
    "StatusListener",
    "check_callback",
    "takes_reason",
]


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
        self._manager._service.notify_loaded(self._manager, request)

    def notify_model_unloaded(self, request: ModelLoadRequest) -> None:
        """The model is out of driver memory; the request completes."""
        self._manager._service.notify_unloaded(self._manager, request)


class Backend(TimeSource, Protocol):
    """What an `NpuManager` talks to: a `~npumanager.Service`'s `~npumanager.Service.backend`,
    or a `~npumanager.DaemonClient`.

    An app never calls these itself: its `NpuManager`, `ModelLoadStatusListener` and
    `LoadedModel` do, passing themselves so the backend knows which client acts.
    """

    def request_load(
        self,
        manager: NpuManager,
        request: ModelLoadRequest,
        callback: ModelLoadRequestCallback,
        executor: ExecutorLike | None,
        weight_bytes: int | None,
    ) -> None:
        """Register a new request and have its decisions delivered to ``callback`` on
        ``executor``."""

    def cancel_load(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        """Withdraw one of the manager's live requests."""

    def notify_loaded(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        """The manager's granted request has its model in driver memory."""

    def notify_unloaded(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        """The manager released the request's model; the request completes."""

    def set_policy_as(
        self, manager: NpuManager, policy: str | ModelPolicy | int, params: Mapping[str, Any] | None
    ) -> None:
        """Swap the policy on the manager's behalf (it needs the management permission)."""

    def close_client(self, manager: NpuManager) -> None:
        """The manager leaves: its live requests end as if it had died."""

    def load_model(
        self, manager: NpuManager, request: ModelLoadRequest, weight_bytes: int, sram_bytes: int
    ) -> LoadedModel:
        """Load a granted request's model on its device, within what the grant allows."""

    def submit_work(
        self,
        model: LoadedModel,
        cost_cycles: int,
        job_priority: int,
        original_uid: int | None,
        group_id: GroupId | None,
        feature_id: str | None,
    ) -> int:
        """Run one job on a loaded model; its work id."""

    def cancel_work(self, model: LoadedModel, work_id: int) -> None:
        """Cancel live work that this model submitted."""


class InProcessBackend(Protocol):
    """What real inference needs of a backend: the in-process one (`LocalBackend`) and the
    daemon's client (`DaemonClient`) both give it."""

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
        """Open a granted request's real model; its bytes are counted from it."""

    def submit_inference(
        self,
        model: LoadedModel,
        inputs: Mapping[str, Any],
        job_priority: int,
        original_uid: int | None,
        group_id: GroupId | None,
        feature_id: str | None,
    ) -> WorkHandle:
        """Run one real inference; a future of its outputs."""

    def run_inference(
        self,
        model: LoadedModel,
        inputs: Mapping[str, Any],
        job_priority: int,
        timeout: float | None,
    ) -> list[Any]:
        """Run one real inference and return its outputs."""

    def shared_array(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A new, uninitialised array that inferences read without copying it."""


def _in_process(backend: Backend) -> InProcessBackend:
    if not hasattr(backend, "submit_inference"):
        raise NotImplementedError(
            f"{type(backend).__name__} runs no real inference: use a Service's managers or "
            "npumanager.connect()"
        )
    return backend  # type: ignore[return-value]


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
        self.app_id: str | None = None
        """The app the daemon knows this client as (its cgroup's app id): set by
        `~npumanager.connect`; None in process, where callers choose uids themselves."""
        self.listener = ModelLoadStatusListener(self)

    def __repr__(self) -> str:
        return f"NpuManager(uid={self.uid}, pid={self.pid}, client={self.client})"

    @property
    def backend(self) -> Backend:
        """The service or daemon client this manager talks to."""
        return self._service

    def request_can_load_model(
        self,
        request: ModelLoadRequest,
        callback: ModelLoadRequestCallback,
        executor: ExecutorLike | None = None,
        *,
        weight_bytes: int | None = None,
    ) -> None:
        """Ask whether the model of ``request`` may be loaded; the answer comes to ``callback``.

        ``weight_bytes``, if known, lets capacity-aware policies count real bytes.
        """
        if not isinstance(request, ModelLoadRequest):
            raise TypeError(f"request must be a ModelLoadRequest; got {type(request).__name__}")
        check_callback(callback)
        self._service.request_load(self, request, callback, check_executor(executor), weight_bytes)

    def cancel_model_load(self, request: ModelLoadRequest) -> None:
        """Withdraw a live request of this client; it completes (CANCELLED or COMPLETE)."""
        self._service.cancel_load(self, request)

    def set_policy(
        self, policy: str | ModelPolicy | int, params: Mapping[str, Any] | None = None
    ) -> None:
        """Swap the model-loading policy; needs the management permission."""
        self._service.set_policy_as(self, policy, params)

    def close(self) -> None:
        """Leave the service: this client's live requests end as if it had died."""
        self._service.close_client(self)

    def __enter__(self) -> NpuManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def declare_feature(self) -> None:
        """Declare use of the NPU feature (the platform's ``uses-feature``)."""
        self.uses_feature = True

    def load_model(
        self,
        request: ModelLoadRequest,
        *,
        weight_bytes: int | None = None,
        sram_bytes: int = 0,
        model: Any = None,
        path: Any = None,
        threads: int | None = None,
        options: Mapping[str, str] | None = None,
    ) -> LoadedModel:
        """Put a granted request's model into driver memory, on the device it was given.

        A real driver takes the model itself (``model=`` bytes or the runtime's object, or
        ``path=``), its bytes counted from it (in process only); a simulated one, ``weight_bytes``.
        ``threads`` asks how many threads each run of a real model may use (0: one per
        CPU, as the runtimes' own default; None: the driver's setting): never more than the
        CPUs, and one for a model loaded while its app is in a background band.
        ``options`` are runtime options by ``runtime.name``, as the app would set them on
        its runtime (``{"onnxruntime.graph_optimization_level": "0"}``): the driver of that
        runtime applies them and refuses a name or value it does not take; a driver of
        another runtime leaves them alone.
        """
        threads = check_threads(threads)
        options = check_runtime_options(options)
        if model is None and path is None:
            if weight_bytes is None:
                raise TypeError("give weight_bytes= (simulated drivers) or model=/path=")
            return self._service.load_model(self, request, weight_bytes, sram_bytes)
        if weight_bytes is not None:
            raise TypeError("weight_bytes= is counted from model=/path=; give one or the other")
        return _in_process(self._service).load_real_model(
            self, request, model, path, sram_bytes, threads=threads, options=options
        )

    def shared_array(self, shape: int | tuple[int, ...], dtype: Any = "float32") -> Any:
        """A new, uninitialised numpy array to write inputs into, which `LoadedModel.run`
        and `~npumanager.LoadedModel.submit` then read in place: through the daemon it lies
        in the connection's shared segment (no copy of it is made; its room is given back
        when it is garbage collected), in process it is ``numpy.empty``. Any other array
        works too, copied."""
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        return _in_process(self._service).shared_array(dims, dtype)

    def reserve(
        self,
        request: ModelLoadRequest,
        *,
        timeout_s: float | None = None,
        weight_bytes: int | None = None,
    ) -> Lease[LoadedModel]:
        """A context manager that waits for CAN_LOAD_NOW and reports unloaded on exit."""
        return Lease(self, request, timeout_s=timeout_s, weight_bytes=weight_bytes)

    def reserve_async(
        self,
        request: ModelLoadRequest,
        *,
        timeout_s: float | None = None,
        weight_bytes: int | None = None,
    ) -> AsyncLease[LoadedModel]:
        """The same as `reserve`, for ``async with``."""
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
        self.request_key = RequestKey(manager.client, request.id)
        """The key of the request it is loaded under (checked on every run)."""

    @overload
    def submit(
        self,
        work: int | None = None,
        /,
        *,
        cost_cycles: int | None = None,
        job_priority: int = 0,
        original_uid: int | None = None,
        group_id: GroupId | None = None,
        feature_id: str | None = None,
    ) -> int: ...

    @overload
    def submit(
        self,
        work: Mapping[str, Any],
        /,
        *,
        job_priority: int = 0,
        original_uid: int | None = None,
        group_id: GroupId | None = None,
        feature_id: str | None = None,
    ) -> WorkHandle: ...

    def submit(
        self,
        work: int | Mapping[str, Any] | None = None,
        /,
        *,
        cost_cycles: int | None = None,
        job_priority: int = 0,
        original_uid: int | None = None,
        group_id: GroupId | None = None,
        feature_id: str | None = None,
    ) -> int | WorkHandle:
        """Run one job: real ``inputs`` (a mapping of name to array) give a future of the
        outputs (in process, on a real driver); ``cost_cycles`` (simulated) give a work id."""
        if isinstance(work, Mapping):
            return _in_process(self.manager._service).submit_inference(
                self, work, job_priority, original_uid, group_id, feature_id
            )
        cycles = work if cost_cycles is None else cost_cycles
        if cycles is None or (work is not None and cost_cycles is not None):
            raise TypeError("give inputs (a mapping) or cost_cycles, once")
        return self.manager._service.submit_work(
            self, cycles, job_priority, original_uid, group_id, feature_id
        )

    def run(
        self, inputs: Mapping[str, Any], *, job_priority: int = 0, timeout: float | None = None
    ) -> list[Any]:
        """Run one real inference and return its outputs; after ``timeout`` seconds the work
        is cancelled and `TimeoutError` raised."""
        backend = _in_process(self.manager._service)
        return backend.run_inference(self, inputs, job_priority, timeout)

    def cancel(self, work_id: int) -> None:
        """Cancel one of this model's jobs (it ends CANCELLED_USER)."""
        self.manager._service.cancel_work(self, work_id)
