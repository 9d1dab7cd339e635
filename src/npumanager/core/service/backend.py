"""The in-process `Backend`: what an `~npumanager.NpuManager` of a
`~npumanager.Service` calls, request by request.

It checks what a client may do that needs nothing of the service's state (its feature
declaration, the management permission) and hands everything else to the service's one
owner (`state.ServiceState`), which takes the lock. A `Service` hands it out as
``service.backend``, so a daemon can drive it for its connections without an app-side
manager in between.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, Literal

from npumanager.checks import GroupId
from npumanager.core.client.callbacks import ModelLoadRequestCallback, takes_reason
from npumanager.core.client.dispatch import DeliveryStats, ExecutorLike, SerialQueue
from npumanager.core.client.manager import LoadedModel, NpuManager
from npumanager.core.driver.contract import Asked, RealExecution, Tuned, WorkHandle, takes_tuned
from npumanager.core.driver.job import DirectRun, WorkMode
from npumanager.core.service.requests import RequestRecord
from npumanager.core.service.state import ServiceState
from npumanager.errors import FeatureNotDeclaredError, FeatureWarning, NpuPermissionError
from npumanager.schemas import ModelLoadRequest, ModelPolicy, UnloadReason


class LocalBackend:
    """The `Backend` of a `Service`'s managers (see `~npumanager.core.client.manager.Backend`)."""

    def __init__(
        self,
        state: ServiceState,
        *,
        default_executor: ExecutorLike,
        stats: DeliveryStats,
        feature_mode: Literal["warn", "block"],
        management_uids: frozenset[int],
        set_policy: Callable[[str | ModelPolicy | int, Mapping[str, Any] | None], None],
        advance: Callable[[int], None],
        quiescent: Callable[[], bool],
    ) -> None:
        self._state = state
        self._default_executor = default_executor
        self._stats = stats
        self.feature_mode = feature_mode
        self.management_uids = management_uids
        self._set_policy = set_policy
        self._advance = advance
        self._quiescent = quiescent
        self._warned_clients: set[int] = set()

    @property
    def clock(self) -> str:
        """'virtual' or 'real'."""
        return self._state.clock

    @property
    def now_ms(self) -> int:
        """The service clock, in milliseconds."""
        return self._state.now_ms

    def quiescent(self) -> bool:
        """Virtual time: True when nothing will change by itself."""
        return self._quiescent()

    def advance(self, ms: int) -> None:
        """Virtual time: run forward by ``ms`` milliseconds."""
        self._advance(ms)

    def request_load(
        self,
        manager: NpuManager,
        request: ModelLoadRequest,
        callback: ModelLoadRequestCallback,
        executor: ExecutorLike | None,
        weight_bytes: int | None,
    ) -> None:
        """Register the manager's new request; its decisions go to ``callback`` on ``executor``."""
        self._check_feature(manager)
        queue = SerialQueue(executor or self._default_executor, self._stats)
        record = RequestRecord(manager, request, callback, queue, takes_reason(callback))
        self._state.request_load(record, weight_bytes)

    def cancel_load(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        """Withdraw one of the manager's live requests."""
        self._state.cancel_load(manager.client, request.id)

    def notify_loaded(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        """The manager's granted request has its model in driver memory."""
        self._state.notify_loaded(manager.client, request.id)

    def notify_unloaded(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        """The manager released the request's model: its models go, the request completes."""
        self._state.notify_unloaded(manager.client, request.id)

    def set_policy_as(
        self, manager: NpuManager, policy: str | ModelPolicy | int, params: Mapping[str, Any] | None
    ) -> None:
        """Swap the policy on the manager's behalf: its uid needs the management permission."""
        if manager.uid not in self.management_uids:
            raise NpuPermissionError(
                f"uid {manager.uid} may not set the policy: it needs the management "
                "permission (root, the system uid, or a configured management uid)"
            )
        self._set_policy(policy, params)

    def close_client(self, manager: NpuManager) -> None:
        """The manager leaves: as if it died (nothing to do once the service is closed)."""
        self._state.close_client(manager.client)

    def load_model(
        self, manager: NpuManager, request: ModelLoadRequest, weight_bytes: int, sram_bytes: int
    ) -> LoadedModel:
        """Load a granted request's model on its device, within what its grant allows."""
        return self._state.load_model(manager, request, weight_bytes, sram_bytes)

    def check_real_load(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        """Refuse at once a real load that could not open: the request is not granted, or
        the driver runs no real models (before a model's file is looked at)."""
        self._state.check_real_load(manager, request)

    def load_real_model(
        self,
        manager: NpuManager,
        request: ModelLoadRequest,
        model: Any,
        path: Any,
        sram_bytes: int,
        sidecars: Mapping[str, int] | None = None,
        *,
        threads: int | None = None,
        options: Mapping[str, str] | None = None,
    ) -> LoadedModel:
        """Open a granted request's real model on its device; its bytes are counted from the
        model before anything is allocated, and a model over what the grant allows is
        refused (``sidecars``: the files it keeps weights in, as descriptors by name;
        ``threads`` and ``options``: what the app asked of the runtime, hints that a
        driver which takes no ``Tuned`` model does without)."""

        def open_model(driver: RealExecution, device: int, allowed: int) -> int:
            given, where = (model, path)
            if (threads is not None or options) and takes_tuned(driver):
                asked = Asked(threads, dict(options or {}))
                given = None if model is None else Tuned(model, asked)
                where = None if path is None else Tuned(path, asked)
            return driver.load_model(
                device,
                model=given,
                path=where,
                sram_bytes=sram_bytes,
                uid=manager.uid,
                sidecars=sidecars,
                max_weight_bytes=allowed,
            )

        return self._state.load_real_model(manager, request, open_model)

    def unload_real_model(self, model: LoadedModel, reason: UnloadReason | None = None) -> None:
        """Take back a model just loaded that its client may not keep (a daemon quota), or,
        with `reason`, one whose host went (a REVOKED event says why)."""
        self._state.unload_real_model(model, reason)

    def shared_array(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A new array for inputs: in process, plain memory (``numpy.empty``)."""
        import numpy as np

        return np.empty(shape, dtype)

    def submit_inference(
        self,
        model: LoadedModel,
        inputs: Mapping[str, Any] | DirectRun,
        job_priority: int,
        original_uid: int | None,
        group_id: GroupId | None,
        feature_id: str | None,
        mode: WorkMode = WorkMode.QUEUED,
    ) -> WorkHandle:
        """Run one real inference on a loaded model; a future of its outputs (``mode``:
        who runs it, `WorkMode`; `run_admitted` or `outputs` then runs it inline)."""
        job = (job_priority, original_uid, group_id, feature_id)
        return self._state.submit_inference(model, inputs, job, mode)

    def outputs(self, handle: WorkHandle) -> list[Any]:
        """The outputs of work `submit_inference` returned, run here first when it took a
        channel (`WorkMode.INLINE`); its failure or cancellation raised."""
        return self._state.outputs(handle, None)

    def run_admitted(self, handle: WorkHandle) -> None:
        """Run here, outside the service lock, work submitted `WorkMode.INLINE` that took a
        channel; nothing if it took none."""
        self._state.run_admitted(handle)

    def run_inference(
        self,
        model: LoadedModel,
        inputs: Mapping[str, Any],
        job_priority: int,
        timeout: float | None,
    ) -> list[Any]:
        """Run one real inference and return its outputs: on the calling thread when a
        channel is free and nothing waits, outside the service lock."""
        mode = WorkMode.INLINE | (WorkMode.SYNC if timeout is None else WorkMode.QUEUED)
        handle = self.submit_inference(model, inputs, job_priority, None, None, None, mode)
        return self._state.outputs(handle, timeout)

    def submit_work(
        self,
        model: LoadedModel,
        cost_cycles: int,
        job_priority: int,
        original_uid: int | None,
        group_id: GroupId | None,
        feature_id: str | None,
    ) -> int:
        """Run one job on a loaded model (attributed to another uid only with permission)."""
        job = (job_priority, original_uid, group_id, feature_id)
        return self._state.submit_work(model, cost_cycles, job)

    def cancel_work(self, model: LoadedModel, work_id: int) -> None:
        """Cancel live work that this model submitted."""
        self._state.cancel_work(model, work_id)

    def live_request(self, manager: NpuManager, request_id: int) -> ModelLoadRequest:
        """The manager's live request with this id (`UnknownRequestError` otherwise)."""
        return self._state.live_request(manager.client, request_id)

    def model_of(self, manager: NpuManager, handle: int) -> LoadedModel:
        """The model ``handle`` that the manager loaded and holds (`UnknownModelError`
        otherwise)."""
        return self._state.model_of(manager.client, handle)

    def holdings(self, manager: NpuManager) -> tuple[int, int]:
        """How many live requests and loaded models the manager holds."""
        return self._state.holdings(manager.client)

    def _check_feature(self, manager: NpuManager) -> None:
        if manager.uses_feature:
            return
        if self.feature_mode == "block":
            raise FeatureNotDeclaredError(
                f"uid {manager.uid} did not declare the NPU feature; call "
                "declare_feature() or pass uses_feature=True"
            )
        if self._state.first_use_without_feature(manager.client, self._warned_clients):
            warnings.warn(
                f"uid {manager.uid} uses the NPU without declaring the feature",
                FeatureWarning,
                stacklevel=4,
            )
