"""The one owner of the service's state: its lock, the arbiter, the request records and the
driver, with a method for each thing a client or the service's owner means to do.

`Service`, the in-process backend (`LocalBackend`), the daemon's calls and its lanes are
facades over it: none of them takes the lock or touches the arbiter, the records or the
driver (`tests/test_import_graph.py` holds the code to that). A method takes the lock for
what it decides, calls the runtime outside it when that can take long (opening a model,
running an inference), and flushes the callbacks it queued once the lock is released.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from npumanager.checks import GroupId
from npumanager.core.arbiter.actions import Action, Complete, RequestKey, RequestState, Revoke
from npumanager.core.arbiter.policy import Policy
from npumanager.core.client.manager import LoadedModel, NpuManager
from npumanager.core.driver.contract import RealExecution, ThermalModel, WorkHandle
from npumanager.core.driver.job import DirectRun, Job, WorkMode
from npumanager.core.plugins.health import SourceState
from npumanager.core.service.carrying import Carrying
from npumanager.core.service.requests import RequestRecord
from npumanager.core.service.snapshot import build_snapshot
from npumanager.core.service.telemetry_bridge import EventListener
from npumanager.errors import (
    IllegalArgumentError,
    NpuPermissionError,
    RequestStateError,
    UnknownRequestError,
)
from npumanager.schemas import ModelLoadRequest, UnloadReason
from npumanager.telemetry import ModelLoadState, SinkHandle, SinkStats

_LOADABLE = frozenset({RequestState.GRANTED, RequestState.LOADED})
"""States in which a request may load models: told CAN_LOAD_NOW, or reported loaded."""


class ServiceState(Carrying):
    """The service's state and every decision about it (see the module's docstring)."""

    _next_client = 1
    _real: object = None
    """The driver once it was found to run real models (the check is not free)."""

    def connect(self) -> None:
        """Tell the arbiter the driver's capacities and read the devices once."""
        with self._lock:
            self.perform(self._arbiter.set_capacity(self.now_ms, self.capacities()))
            self.perform(self._arbiter.connect_driver())
            self.sample_devices()

    def new_client(self) -> int:
        """A client number no manager of this service has had."""
        with self._lock:
            client = self._next_client
            self._next_client += 1
            return client

    # The service owner's intentions ------------------------------------------------------

    def set_importance(self, uid: int, importance: int) -> None:
        """A uid's process importance changed."""
        self.act(lambda now: self._arbiter.set_importance(now, uid, importance))

    def set_policy(self, policy: Policy) -> None:
        """Swap the model-loading policy."""
        self.act(lambda now: self._arbiter.set_policy(now, policy))

    def set_access(
        self, uid: int, has_direct_access: bool | None, can_attribute_other_uid: bool | None
    ) -> None:
        """Override what a uid's scheduling config allows (None keeps a value)."""
        self.act(
            lambda now: self._arbiter.set_access(
                now,
                uid,
                has_direct_access=has_direct_access,
                can_attribute_other_uid=can_attribute_other_uid,
            )
        )

    def set_memory_pressure(self, level: int) -> None:
        """The service owner's memory level (a health source's may be higher)."""
        self.act(lambda now: self.signal_memory(now, level))

    def add_heat(self, device: int, millicelsius: int) -> None:
        """A thermal spike on a simulated device (the driver must have a thermal model)."""
        driver = self._driver
        if not isinstance(driver, ThermalModel):
            raise IllegalArgumentError(f"driver {type(driver).__name__} has no thermal model")
        with self._lock:
            self.check_open()
            driver.add_heat(device, millicelsius)
            self.after_step()
        self.flush()

    def add_health_state(self, name: str) -> SourceState:
        """Room for a new health source's readings."""
        with self._lock:
            self.check_open()
            return self._telemetry.health.add(name)

    def add_listener(self, listener: EventListener) -> None:
        """Receive every raw work event, in batches."""
        with self._lock:
            self._telemetry.add_listener(listener)

    def add_sink(self, name: str, sink: Any, debounce_ms: int, queue_size: int) -> SinkHandle:
        """Send telemetry to a built sink."""
        with self._lock:
            self.check_open()
            return self._telemetry.add_sink(name, sink, debounce_ms, queue_size)

    def remove_sink(self, handle: SinkHandle) -> None:
        """Stop sending to a sink (it gets what it still has coming, then closes)."""
        with self._lock:
            self._telemetry.remove_sink(handle)

    def sink_stats(self) -> dict[str, SinkStats]:
        """Delivered, dropped, failed and queued events of every sink, by name."""
        return self._telemetry.stats()

    def snapshot(self, policy_name: str, callback_errors: int) -> dict[str, Any]:
        """What the service holds now, as plain data."""
        with self._lock:
            return build_snapshot(
                self._arbiter,
                self._driver,
                policy_name=policy_name,
                sinks=self.sink_stats(),
                callback_errors=callback_errors,
                model_devices=self._records.model_devices(),
                health=self._telemetry.health,
                outside_bytes=self.outside_bytes,
            )

    def state_of(self, client: int, request_id: int) -> RequestState:
        """Where a live request stands (`UnknownRequestError` if it is not live)."""
        with self._lock:
            return self._arbiter.state_of(client, request_id)

    def no_deadline(self) -> bool:
        """True when the arbiter has nothing due."""
        with self._lock:
            return self._arbiter.next_deadline_ms() is None

    def close(self) -> bool:
        """End every live request (its client gets the completion); False if it was
        closed already."""
        with self._lock:
            if self.closed:
                return False
            for client in self._records.clients():
                final = [
                    action
                    for action in self._arbiter.client_died(self.now_ms, client)
                    if isinstance(action, Complete | Revoke)
                ]
                self.perform(final)
            self.closed = True
        self.flush()
        return True

    def close_driver(self) -> None:
        """Close the driver, last of all (`close` ended every request first)."""
        self._driver.close()

    # The clients' intentions -------------------------------------------------------------

    def request_load(self, record: RequestRecord, weight_bytes: int | None) -> None:
        """A client asks to load a model; its decisions go to the record's callback."""
        manager, request = record.manager, record.request
        key = RequestKey(manager.client, request.id)
        with self._lock:
            self.check_open()
            actions = self._arbiter.request(
                self.now_ms, manager.client, manager.uid, request, weight_bytes=weight_bytes
            )
            self._records.add(key, record)
            self._telemetry.request_made(manager.uid, key, request, weight_bytes)
            self.perform(actions)
        self.flush()

    def cancel_load(self, client: int, request_id: int) -> None:
        """A client withdraws one of its live requests."""
        self.act(lambda now: self._arbiter.cancel(now, client, request_id))

    def notify_loaded(self, client: int, request_id: int) -> None:
        """A client's granted request has its model in driver memory."""

        def step(now: int) -> list[Action]:
            actions = self._arbiter.notify_loaded(now, client, request_id)
            self.state_changed(RequestKey(client, request_id), ModelLoadState.LOADED)
            return actions

        self.act(step)

    def notify_unloaded(self, client: int, request_id: int) -> None:
        """A client released a request's model: its models go, the request completes."""
        key = RequestKey(client, request_id)

        def step(now: int) -> list[Action]:
            actions = self._arbiter.notify_unloaded(now, client, request_id)
            self.state_changed(key, ModelLoadState.UNLOADED)
            self.unload_models(key)
            return actions

        self.act(step)

    def close_client(self, client: int) -> None:
        """A client leaves or dies: its requests end and its share is freed (nothing to do
        once the service is closed)."""
        with self._lock:
            if self.closed:
                return
        self.act(lambda now: self._arbiter.client_died(now, client))

    def first_use_without_feature(self, client: int, warned: set[int]) -> bool:
        """True the first time a client that declared no feature is seen in `warned`."""
        with self._lock:
            first = client not in warned
            warned.add(client)
            return first

    def live_request(self, client: int, request_id: int) -> ModelLoadRequest:
        """A client's live request with this id (`UnknownRequestError` otherwise)."""
        with self._lock:
            record = self._records.get(RequestKey(client, request_id))
        if record is None:
            raise UnknownRequestError(f"request {request_id} is not a live request of this client")
        return record.request

    def model_of(self, client: int, handle: int) -> LoadedModel:
        """The model ``handle`` that a client loaded and holds (`UnknownModelError`
        otherwise)."""
        with self._lock:
            return self._records.model(client, handle)

    def holdings(self, client: int) -> tuple[int, int]:
        """How many live requests and loaded models a client holds."""
        with self._lock:
            return self._records.holdings(client)

    # Models ------------------------------------------------------------------------------

    def load_model(
        self, manager: NpuManager, request: ModelLoadRequest, weight_bytes: int, sram_bytes: int
    ) -> LoadedModel:
        """Load a granted request's model (bytes only) within what its grant allows."""
        with self._lock:
            record = self._granted(manager, request)
            declared = self._arbiter.declared_bytes(manager.client, request.id)
            self._records.check_allowance(record, declared, weight_bytes)
            device = record.device or 0
            handle = self._driver.load_model(
                device, weight_bytes=weight_bytes, sram_bytes=sram_bytes
            )
            return self._keep(record, handle, device, weight_bytes)

    def check_real_load(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        """Raise now what `load_real_model` would raise before opening anything: the
        request is not granted, or the driver runs no real models."""
        with self._lock:
            self._granted(manager, request)
            self._real_driver()

    def load_real_model(
        self,
        manager: NpuManager,
        request: ModelLoadRequest,
        open_model: Callable[[RealExecution, int, int], int],
    ) -> LoadedModel:
        """Open a granted request's real model with `open_model(driver, device, allowance)`
        outside the lock (a runtime may take seconds); the grant is checked again after,
        and a model its request may no longer hold is unloaded."""
        with self._lock:
            record = self._granted(manager, request)
            driver = self._real_driver()
            device = record.device or 0
            declared = self._arbiter.declared_bytes(manager.client, request.id)
            allowed = self._records.allowance_left(record, declared)
        handle = open_model(driver, device, allowed)
        try:
            with self._lock:
                record = self._granted(manager, request)
                if (record.device or 0) != device:
                    raise RequestStateError(
                        f"request {request.id} was moved to device {record.device} while its "
                        "model loaded; load it again"
                    )
                weight = driver.model_bytes(handle)
                declared = self._arbiter.declared_bytes(manager.client, request.id)
                self._records.check_allowance(record, declared, weight)
                return self._keep(record, handle, device, weight)
        except Exception:
            self._driver.unload_model(handle)
            raise

    def unload_real_model(self, model: LoadedModel, reason: UnloadReason | None = None) -> None:
        """Take back a model just loaded that its client may not keep (a daemon quota), or,
        with `reason`, one whose host went (a REVOKED event says why)."""
        with self._lock:
            record = self._records.get(model.request_key)
            if record is not None and model in record.models:
                self._records.drop_models(record, model)
                self._driver.unload_model(model.handle)
                self._telemetry.health_changed()
                if reason is not None:
                    self._telemetry.revoked(
                        record.manager.uid, model.request_key, record.request, reason, model.device
                    )

    def _keep(self, record: RequestRecord, handle: int, device: int, weight: int) -> LoadedModel:
        """Record a model just loaded under a request (lock held)."""
        model = LoadedModel(record.manager, record.request, handle, device, weight_bytes=weight)
        self._records.keep_model(record, model)
        self._telemetry.health_changed()
        return model

    def _granted(self, manager: NpuManager, request: ModelLoadRequest) -> RequestRecord:
        """The record of a live request that may load models now (lock held)."""
        record = self._records.live(RequestKey(manager.client, request.id), request)
        state = self._arbiter.state_of(manager.client, request.id)
        if state not in _LOADABLE:
            raise RequestStateError(
                f"request {request.id} is {state}; a model may be loaded only after CAN_LOAD_NOW"
            )
        return record

    # Work --------------------------------------------------------------------------------

    def submit_inference(
        self,
        model: LoadedModel,
        inputs: Mapping[str, Any] | DirectRun,
        job: tuple[int, int | None, GroupId | None, str | None],
        mode: WorkMode,
    ) -> WorkHandle:
        """Queue one real inference on a loaded model; ``job`` is its priority, original
        uid, group and feature, ``mode`` who runs it (`WorkMode`)."""
        job_priority, original_uid, group_id, feature_id = job
        manager = model.manager
        with self._lock:
            if original_uid is not None:
                self._check_attribution(manager, original_uid)
            self._records.check_model(model)
            work = Job(
                manager.uid, job_priority, original_uid, group_id, feature_id, manager.pid or 0
            )
            future = self._real_driver().submit_future(model.handle, work, inputs, mode)
            self._records.work_submitted(future.work_id, model)
            return future

    def outputs(self, handle: WorkHandle, timeout: float | None) -> list[Any]:
        """The outputs of a real inference, run here first when it took a channel."""
        return self._real_driver().outputs(handle, timeout)

    def run_admitted(self, handle: WorkHandle) -> None:
        """Run here, outside the lock, an inference that took a channel; nothing if not."""
        self._real_driver().run_admitted(handle)

    def submit_work(
        self,
        model: LoadedModel,
        cost_cycles: int,
        job: tuple[int, int | None, GroupId | None, str | None],
    ) -> int:
        """Run one job of `cost_cycles` on a loaded model (`job` as in `submit_inference`)."""
        job_priority, original_uid, group_id, feature_id = job
        manager = model.manager
        with self._lock:
            self._check_attribution(manager, original_uid)
            self._records.check_model(model)
            work_id = self._driver.submit(
                model.handle,
                uid=manager.uid,
                cost_cycles=cost_cycles,
                job_priority=job_priority,
                original_uid=original_uid,
                group_id=group_id,
                feature_id=feature_id,
                debug_pid=manager.pid or 0,
            )
            self._records.work_submitted(work_id, model)
            return work_id

    def cancel_work(self, model: LoadedModel, work_id: int) -> None:
        """Cancel live work that this model submitted."""
        with self._lock:
            self._records.check_model(model)
            self._records.check_work(model, work_id)
            self._driver.cancel(work_id)

    def _check_attribution(self, manager: NpuManager, original_uid: int | None) -> None:
        if (
            original_uid is not None
            and original_uid != manager.uid
            and not self._arbiter.scheduling_config(manager.uid).can_attribute_other_uid
        ):
            raise NpuPermissionError(
                f"uid {manager.uid} may not attribute work to uid {original_uid}"
            )

    def _real_driver(self) -> RealExecution:
        driver = self._driver
        if self._real is driver:
            return driver  # type: ignore[return-value]
        if not isinstance(driver, RealExecution):
            raise IllegalArgumentError(
                f"driver {type(driver).__name__} runs no real models: load with weight_bytes= "
                "and submit cost_cycles, or use a real driver (onnxruntime, openvino)"
            )
        self._real = driver
        return driver
