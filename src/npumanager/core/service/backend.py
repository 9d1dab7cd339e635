"""The in-process `Backend`: what an `NpuManager` of a `Service` calls, request by request.

It checks what a client may do (its feature declaration, its own requests, models and
work, its permissions) and hands every decision to the arbiter through `Decisions`, under
the service lock. A `Service` hands it out as `service.backend`, so a daemon can drive it
for its connections without an app-side manager in between.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, Literal

from npumanager.checks import GroupId
from npumanager.core.arbiter.actions import Action, RequestKey, RequestState
from npumanager.core.client.callbacks import ModelLoadRequestCallback, takes_reason
from npumanager.core.client.dispatch import DeliveryStats, ExecutorLike, SerialQueue
from npumanager.core.client.manager import LoadedModel, NpuManager
from npumanager.core.driver.contract import RealExecution, WorkHandle
from npumanager.core.service.decisions import Decisions
from npumanager.core.service.requests import RequestRecord
from npumanager.errors import (
    FeatureNotDeclaredError,
    FeatureWarning,
    IllegalArgumentError,
    NpuPermissionError,
    RequestStateError,
    UnknownModelError,
    UnknownRequestError,
)
from npumanager.schemas import ModelLoadRequest, ModelPolicy
from npumanager.telemetry import ModelLoadState

_LOADABLE = frozenset({RequestState.GRANTED, RequestState.LOADED})
"""States in which a request may load models: told CAN_LOAD_NOW, or reported loaded."""


class LocalBackend:
    """The `Backend` of a `Service`'s managers (see `core.client.Backend`)."""

    def __init__(
        self,
        decisions: Decisions,
        *,
        default_executor: ExecutorLike,
        stats: DeliveryStats,
        feature_mode: Literal["warn", "block"],
        management_uids: frozenset[int],
        set_policy: Callable[[str | ModelPolicy | int, Mapping[str, Any] | None], None],
        advance: Callable[[int], None],
        quiescent: Callable[[], bool],
    ) -> None:
        self._d = decisions
        self._default_executor = default_executor
        self._stats = stats
        self.feature_mode = feature_mode
        self.management_uids = management_uids
        self._set_policy = set_policy
        self._advance = advance
        self._quiescent = quiescent
        self._warned_clients: set[int] = set()
        self._real: object = None
        """The driver once it was found to run real models (the check is not free)."""

    @property
    def clock(self) -> str:
        """'virtual' or 'real'."""
        return self._d.clock

    @property
    def now_ms(self) -> int:
        """The service clock, in milliseconds."""
        return self._d.now_ms

    def quiescent(self) -> bool:
        """Virtual time: True when nothing will change by itself."""
        return self._quiescent()

    def advance(self, ms: int) -> None:
        """Virtual time: run forward by `ms` milliseconds."""
        self._advance(ms)

    def request_load(
        self,
        manager: NpuManager,
        request: ModelLoadRequest,
        callback: ModelLoadRequestCallback,
        executor: ExecutorLike | None,
        weight_bytes: int | None,
    ) -> None:
        """Register the manager's new request; its decisions go to `callback` on `executor`."""
        self._check_feature(manager)
        d = self._d
        key = RequestKey(manager.client, request.id)
        queue = SerialQueue(executor or self._default_executor, self._stats)
        record = RequestRecord(manager, request, callback, queue, takes_reason(callback))
        with d.lock:
            d.check_open()
            d.requests.add(key, record)
            try:
                actions = d.arbiter.request(
                    d.now_ms, manager.client, manager.uid, request, weight_bytes=weight_bytes
                )
            except Exception:
                d.requests.remove(key)
                raise
            d.telemetry.request_made(manager.uid, key, request, weight_bytes)
            d.perform(actions)
        d.flush()

    def cancel_load(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        """Withdraw one of the manager's live requests."""
        self._d.act(lambda now: self._d.arbiter.cancel(now, manager.client, request.id))

    def notify_loaded(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        """The manager's granted request has its model in driver memory."""
        d, key = self._d, RequestKey(manager.client, request.id)

        def step(now: int) -> list[Action]:
            actions = d.arbiter.notify_loaded(now, manager.client, request.id)
            d.state_changed(key, ModelLoadState.LOADED)
            return actions

        d.act(step)

    def notify_unloaded(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        """The manager released the request's model: its models go, the request completes."""
        d, key = self._d, RequestKey(manager.client, request.id)

        def step(now: int) -> list[Action]:
            actions = d.arbiter.notify_unloaded(now, manager.client, request.id)
            d.state_changed(key, ModelLoadState.UNLOADED)
            d.unload_models(key)
            return actions

        d.act(step)

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
        d = self._d
        with d.lock:
            if d.closed:
                return
        d.act(lambda now: d.arbiter.client_died(now, manager.client))

    def load_model(
        self, manager: NpuManager, request: ModelLoadRequest, weight_bytes: int, sram_bytes: int
    ) -> LoadedModel:
        """Load a granted request's model on its device, within what its grant allows."""
        d = self._d
        with d.lock:
            record = self._granted(manager, request)
            declared = d.arbiter.declared_bytes(manager.client, request.id)
            d.requests.check_allowance(record, declared, weight_bytes)
            device = record.device or 0
            handle = d.driver.load_model(device, weight_bytes=weight_bytes, sram_bytes=sram_bytes)
            return self._keep(record, manager, request, handle, device, weight_bytes)

    def load_real_model(
        self,
        manager: NpuManager,
        request: ModelLoadRequest,
        model: Any,
        path: Any,
        sram_bytes: int,
        sidecars: Mapping[str, int] | None = None,
    ) -> LoadedModel:
        """Open a granted request's real model on its device; its bytes are counted from the
        model before anything is allocated, and a model over what the grant allows is
        refused (`sidecars`: the files it keeps weights in, as descriptors by name).

        The runtime opens the model outside the service lock (that can take seconds), so
        the grant is checked again after: a request revoked meanwhile gets nothing loaded.
        """
        d = self._d
        with d.lock:
            record = self._granted(manager, request)
            driver = self._real_driver()
            device = record.device or 0
            declared = d.arbiter.declared_bytes(manager.client, request.id)
            allowed = d.requests.allowance_left(record, declared)
        handle = driver.load_model(
            device,
            model=model,
            path=path,
            sram_bytes=sram_bytes,
            uid=manager.uid,
            sidecars=sidecars,
            max_weight_bytes=allowed,
        )
        try:
            with d.lock:
                record = self._granted(manager, request)
                if (record.device or 0) != device:
                    raise RequestStateError(
                        f"request {request.id} was moved to device {record.device} while its "
                        "model loaded; load it again"
                    )
                weight = driver.model_bytes(handle)
                declared = d.arbiter.declared_bytes(manager.client, request.id)
                d.requests.check_allowance(record, declared, weight)
                return self._keep(record, manager, request, handle, device, weight)
        except Exception:
            d.driver.unload_model(handle)
            raise

    def unload_real_model(self, model: LoadedModel) -> None:
        """Take back a model just loaded that its client may not keep (a daemon quota)."""
        d = self._d
        with d.lock:
            record = d.requests.get(model.request_key)
            if record is not None and model in record.models:
                record.models.remove(model)
                d.driver.unload_model(model.handle)
                d.telemetry.health_changed()

    def shared_array(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A new array for inputs: in process, plain memory (`numpy.empty`)."""
        import numpy as np

        return np.empty(shape, dtype)

    def submit_inference(
        self,
        model: LoadedModel,
        inputs: Mapping[str, Any],
        job_priority: int,
        original_uid: int | None,
        group_id: GroupId | None,
        feature_id: str | None,
        *,
        inline: bool = False,
        inline_background: bool = True,
        sync: bool = False,
    ) -> WorkHandle:
        """Run one real inference on a loaded model; a future of its outputs (`inline`,
        `sync`: see `RealExecution.submit_future`; `run_admitted` or `outputs` then runs it)."""
        d, manager = self._d, model.manager
        with d.lock:
            if original_uid is not None:
                self._check_attribution(manager, original_uid)
            d.requests.check_model(model)
            future = self._real_driver().submit_future(
                model.handle,
                uid=manager.uid,
                inputs=inputs,
                job_priority=job_priority,
                original_uid=original_uid,
                group_id=group_id,
                feature_id=feature_id,
                debug_pid=manager.pid or 0,
                inline=inline,
                inline_background=inline_background,
                sync=sync,
            )
            d.requests.work_submitted(future.work_id, model)
            return future

    def outputs(self, handle: WorkHandle) -> list[Any]:
        """The outputs of work `submit_inference` returned, run here first when it took a
        channel (`inline`); its failure or cancellation raised."""
        return self._real_driver().outputs(handle, None)

    def run_admitted(self, handle: WorkHandle) -> None:
        """Run here, outside the service lock, work `submit_inference(inline=True)` put on
        a channel; nothing if it took none."""
        self._real_driver().run_admitted(handle)

    def run_inference(
        self,
        model: LoadedModel,
        inputs: Mapping[str, Any],
        job_priority: int,
        timeout: float | None,
    ) -> list[Any]:
        """Run one real inference and return its outputs: on the calling thread when a
        channel is free and nothing waits, outside the service lock."""
        handle = self.submit_inference(
            model, inputs, job_priority, None, None, None, inline=True, sync=timeout is None
        )
        return self._real_driver().outputs(handle, timeout)

    def _keep(
        self,
        record: RequestRecord,
        manager: NpuManager,
        request: ModelLoadRequest,
        handle: int,
        device: int,
        weight_bytes: int,
    ) -> LoadedModel:
        """Record a model just loaded under a request (service lock held)."""
        model = LoadedModel(manager, request, handle, device, weight_bytes=weight_bytes)
        record.models.append(model)
        self._d.telemetry.health_changed()
        return model

    def _granted(self, manager: NpuManager, request: ModelLoadRequest) -> RequestRecord:
        """The record of a live request that may load models now (service lock held)."""
        d = self._d
        record = d.requests.live(RequestKey(manager.client, request.id), request)
        state = d.arbiter.state_of(manager.client, request.id)
        if state not in _LOADABLE:
            raise RequestStateError(
                f"request {request.id} is {state}; a model may be loaded only after CAN_LOAD_NOW"
            )
        return record

    def _real_driver(self) -> RealExecution:
        driver = self._d.driver
        if self._real is driver:
            return driver  # type: ignore[return-value]
        if not isinstance(driver, RealExecution):
            raise IllegalArgumentError(
                f"driver {type(driver).__name__} runs no real models: load with weight_bytes= "
                "and submit cost_cycles, or use a real driver (onnxruntime, openvino)"
            )
        self._real = driver
        return driver

    def _check_attribution(self, manager: NpuManager, original_uid: int | None) -> None:
        if (
            original_uid is not None
            and original_uid != manager.uid
            and not self._d.arbiter.scheduling_config(manager.uid).can_attribute_other_uid
        ):
            raise NpuPermissionError(
                f"uid {manager.uid} may not attribute work to uid {original_uid}"
            )

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
        d, manager = self._d, model.manager
        with d.lock:
            self._check_attribution(manager, original_uid)
            d.requests.check_model(model)
            work_id = d.driver.submit(
                model.handle,
                uid=manager.uid,
                cost_cycles=cost_cycles,
                job_priority=job_priority,
                original_uid=original_uid,
                group_id=group_id,
                feature_id=feature_id,
                debug_pid=manager.pid or 0,
            )
            d.requests.work_submitted(work_id, model)
            return work_id

    def cancel_work(self, model: LoadedModel, work_id: int) -> None:
        """Cancel live work that this model submitted."""
        d = self._d
        with d.lock:
            d.requests.check_model(model)
            d.requests.check_work(model, work_id)
            d.driver.cancel(work_id)

    def live_request(self, manager: NpuManager, request_id: int) -> ModelLoadRequest:
        """The manager's live request with this id (`UnknownRequestError` otherwise)."""
        d = self._d
        with d.lock:
            record = d.requests.get(RequestKey(manager.client, request_id))
        if record is None:
            raise UnknownRequestError(f"request {request_id} is not a live request of this client")
        return record.request

    def loaded_model(self, manager: NpuManager, request_id: int, handle: int) -> LoadedModel:
        """The model `handle` that the manager loaded under a live request."""
        d = self._d
        with d.lock:
            record = d.requests.get(RequestKey(manager.client, request_id))
            for model in record.models if record is not None else ():
                if model.handle == handle:
                    return model
        raise UnknownModelError(f"model {handle} is not loaded by this client")

    def _check_feature(self, manager: NpuManager) -> None:
        if manager.uses_feature:
            return
        if self.feature_mode == "block":
            raise FeatureNotDeclaredError(
                f"uid {manager.uid} did not declare the NPU feature; call "
                "declare_feature() or pass uses_feature=True"
            )
        with self._d.lock:
            first = manager.client not in self._warned_clients
            self._warned_clients.add(manager.client)
        if first:
            warnings.warn(
                f"uid {manager.uid} uses the NPU without declaring the feature",
                FeatureWarning,
                stacklevel=4,
            )
