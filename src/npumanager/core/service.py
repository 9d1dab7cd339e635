"""The `npu` service: the arbiter's decisions carried out against a driver.

One driver, one model-loading policy (a plugin), the clients' callbacks. Every input
goes to the pure `Arbiter`; the actions it returns are performed here: configs are
relayed to the driver, models revoked, callbacks delivered on each client's executor.
Driver events come back in batches and feed the policy's bookkeeping and the listeners.
Telemetry sinks get the work events, every request's steps and device-health samples
through a `TelemetryHub`: in virtual time inline at every step boundary, in real time on a
worker thread per sink behind a bounded queue.

In virtual time (`clock="virtual"`) nothing moves until `advance` or `run_until_idle`;
callbacks run inline unless a client gives an executor. In real time a service thread
waits on the driver's event descriptor and on the arbiter's deadlines, and callbacks run
on a dispatcher thread.
"""

from __future__ import annotations

import logging
import select
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from npumanager.core.actions import (
    Action,
    CanLoad,
    Complete,
    RelayConfigs,
    RequestKey,
    RequestState,
    RequestUnload,
    Revoke,
)
from npumanager.core.arbiter import Arbiter
from npumanager.core.client import (
    POLICY_NAMES,
    Delivery,
    LoadedModel,
    ModelLoadRequestCallback,
    NpuManager,
    takes_reason,
)
from npumanager.core.dispatch import (
    DeliveryStats,
    ExecutorLike,
    SerialQueue,
    run_inline,
)
from npumanager.core.driver import DriverBase
from npumanager.core.events import EventKind, WorkEvent
from npumanager.core.plugins import PluginRegistry, load_plugins
from npumanager.core.policy import Policy, build_policy
from npumanager.errors import (
    CapacityError,
    DuplicateRequestError,
    FeatureNotDeclaredError,
    FeatureWarning,
    IllegalArgumentError,
    NpuPermissionError,
    PolicyParamsError,
    RequestStateError,
    UnknownModelError,
    UnknownRequestError,
    UnknownWorkError,
)
from npumanager.schemas import (
    DriverCapability,
    EndReason,
    ModelLoadRequest,
    ModelPolicy,
    ThermalSeverity,
)
from npumanager.schemas.device import DeviceStatus
from npumanager.schemas.limits import (
    DEFAULT_SINK_QUEUE_EVENTS,
    DEFAULT_UNLOAD_GRACE_MS,
    HEALTH_SAMPLE_INTERVAL_MS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    ROOT_UID,
    SINK_CLOSE_TIMEOUT_S,
    SYSTEM_UID,
    grant_allowance_bytes,
)
from npumanager.telemetry import ModelLoadState, SinkHandle, SinkStats, TelemetryHub
from npumanager.telemetry.health import HealthSampler
from npumanager.telemetry.model_events import from_action, requested, state_changed
from npumanager.vendor_drivers.simulated import check_int

log = logging.getLogger(__name__)

Clock = Literal["real", "virtual"]
EventListener = Callable[[Sequence[WorkEvent]], None]
_VIRTUAL_STEP_US = 1000
"""In virtual time the service looks at device health and deadlines every millisecond."""


@dataclass
class _Context(Delivery):
    """What the service keeps for one live request: its delivery, device and models."""

    device: int | None = None
    models: list[LoadedModel] = field(default_factory=list)


class Service:
    """The arbiter service: policy decisions, driver, callbacks."""

    def __init__(
        self,
        driver: str | DriverBase = "vnpu",
        policy: str | ModelPolicy | int = "status_quo",
        *,
        policy_params: Mapping[str, Any] | None = None,
        clock: Clock = "real",
        devices: Any = 1,
        driver_options: Mapping[str, Any] | None = None,
        unload_grace_ms: int = DEFAULT_UNLOAD_GRACE_MS,
        feature_mode: Literal["warn", "block"] = "warn",
        attribution_uids: Iterable[int] = (),
        management_uids: Iterable[int] = (),
        registry: PluginRegistry | None = None,
        sinks: Iterable[Any] = (),
    ) -> None:
        if clock not in ("real", "virtual"):
            raise IllegalArgumentError(f"clock must be 'real' or 'virtual'; got {clock!r}")
        if feature_mode not in ("warn", "block"):
            raise IllegalArgumentError(
                f"feature_mode must be 'warn' or 'block'; got {feature_mode!r}"
            )
        self.clock: Clock = clock
        self.feature_mode = feature_mode
        self.registry = registry or load_plugins()
        self.management_uids = frozenset({ROOT_UID, SYSTEM_UID, *management_uids})
        self.attribution_uids = frozenset({ROOT_UID, SYSTEM_UID, *attribution_uids})
        self._lock = threading.RLock()
        self._stats = DeliveryStats()
        self._contexts: dict[RequestKey, _Context] = {}
        self._listeners: list[EventListener] = []
        self._next_client = 1
        self._warned_clients: set[int] = set()
        self._severity: dict[int, ThermalSeverity] = {}
        self._completed: dict[int, None] = {}
        self._work_models: dict[int, LoadedModel] = {}
        self._pending: list[Action] = []
        self._to_schedule: list[SerialQueue] = []
        self._closed = False
        self._telemetry = TelemetryHub(
            threaded=clock == "real", close_timeout_s=SINK_CLOSE_TIMEOUT_S
        )
        self._sampler = HealthSampler(HEALTH_SAMPLE_INTERVAL_MS * 1000)
        self.policy_name, policy_object = self._make_policy(policy, policy_params)
        self.driver = self._make_driver(driver, devices, dict(driver_options or {}))
        self.arbiter = Arbiter(
            policy_object,
            unload_grace_ms=check_int("unload_grace_ms", unload_grace_ms, 0, 1 << 40),
            attribution_uids=self.attribution_uids,
        )
        self.driver.set_callback(_DriverEvents(self), debounce_duration_ms=0)
        self._dispatcher: ThreadPoolExecutor | None = None
        self._default_executor: ExecutorLike = run_inline
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        for sink in sinks:
            self.add_sink(sink)
        with self._lock:
            capacities = [d.weight_memory_bytes for d in self.driver.describe_devices()]
            self._perform(self.arbiter.set_capacity(capacities, now_ms=self.now_ms))
            self._perform(self.arbiter.connect_driver())
            self._sample_devices()
        if clock == "real":
            self._dispatcher = ThreadPoolExecutor(1, thread_name_prefix="npu-dispatch")
            self._default_executor = self._dispatcher
            self._thread = threading.Thread(target=self._serve, name="npu-service", daemon=True)
            self._thread.start()

    # Construction ---------------------------------------------------------------------

    def _make_driver(self, driver: str | DriverBase, devices: Any, options: dict[str, Any]) -> Any:
        if isinstance(driver, DriverBase):
            return driver
        record = self.registry.driver(driver)
        needed = (
            DriverCapability.REAL_TIME if self.clock == "real" else DriverCapability.VIRTUAL_TIME
        )
        if needed not in record.capabilities:
            claimed = ", ".join(sorted(record.capabilities)) or "none"
            raise IllegalArgumentError(
                f"driver {driver!r} cannot run a {self.clock} clock (it claims: {claimed})"
            )
        if DriverCapability.REAL_TIME in record.capabilities:
            options.setdefault("clock", self.clock)
        return record.factory(devices, **options)

    def _make_policy(
        self, policy: str | ModelPolicy | int, params: Mapping[str, Any] | None
    ) -> tuple[str, Policy]:
        name = policy_name(policy)
        return name, build_policy(self.registry.policy(name), params)

    # Clients ----------------------------------------------------------------------------

    def manager(
        self, uid: int, *, pid: int | None = None, uses_feature: bool = False
    ) -> NpuManager:
        """An `NpuManager` for an app with this uid living in this process."""
        uid = check_int("uid", uid, 0, (1 << 31) - 1)
        with self._lock:
            client = self._next_client
            self._next_client += 1
        return NpuManager(self, client, uid, pid, uses_feature)

    def set_uid_importance(self, uid: int, importance: int) -> None:
        """Tell the service how important a uid's process is now (as the activity manager would)."""
        uid = check_int("uid", uid, 0, (1 << 31) - 1)
        importance = check_int("importance", int(importance), MIN_PRIORITY, MAX_PRIORITY)
        self._act(lambda now: self.arbiter.set_importance(now, uid, importance))

    def set_policy(
        self, policy: str | ModelPolicy | int, params: Mapping[str, Any] | None = None
    ) -> None:
        """Swap the model-loading policy (the service owner's call: no permission check)."""
        name, policy_object = self._make_policy(policy, params)
        with self._lock:
            self.policy_name = name
        self._act(lambda now: self.arbiter.set_policy(now, policy_object))

    def set_uid_access(
        self,
        uid: int,
        *,
        has_direct_access: bool | None = None,
        can_attribute_other_uid: bool | None = None,
    ) -> None:
        """Override what a uid's scheduling config allows (None keeps a value as it is)."""
        self._act(
            lambda now: self.arbiter.set_access(
                now,
                uid,
                has_direct_access=has_direct_access,
                can_attribute_other_uid=can_attribute_other_uid,
            )
        )

    def client_died(self, manager: NpuManager) -> None:
        """A client went away: its requests end and its share is freed."""
        self._act(lambda now: self.arbiter.client_died(now, manager.client))

    def _close_client(self, manager: NpuManager) -> None:
        with self._lock:
            if self._closed:
                return
        self.client_died(manager)

    def add_listener(self, listener: EventListener) -> None:
        """Receive every raw work event, in batches, as the driver reports them."""
        with self._lock:
            self._listeners.append(listener)

    def add_sink(
        self,
        sink: Any,
        *,
        debounce_duration_ms: int = 0,
        queue_size: int = DEFAULT_SINK_QUEUE_EVENTS,
        **options: Any,
    ) -> SinkHandle:
        """Send telemetry to a sink: a registered name (built with `options`) or an object.

        Work events reach it through its own debouncer with the platform's rules
        (`debounce_duration_ms`, 0 for raw events); model-load events and device samples
        are never debounced. In real time at most `queue_size` events wait for a slow
        sink; more are dropped and counted (`sink_stats`).
        """
        TelemetryHub.check_options(debounce_duration_ms, queue_size)
        if isinstance(sink, str):
            name, factory = sink, self.registry.sink(sink).factory
            try:
                sink = factory(**options)
            except TypeError as exc:
                raise IllegalArgumentError(f"sink {name!r}: {exc}") from None
        elif options:
            raise IllegalArgumentError(
                f"options ({', '.join(sorted(options))}) are for a sink given by name; "
                "configure a sink object yourself"
            )
        else:
            name = type(sink).__name__
        with self._lock:
            self._open()
            return self._telemetry.add(
                sink, name=name, debounce_duration_ms=debounce_duration_ms, queue_size=queue_size
            )

    def remove_sink(self, handle: SinkHandle) -> None:
        """Stop sending to a sink: what it still has coming is delivered, then it is closed."""
        with self._lock:
            self._telemetry.remove(handle)

    def sink_stats(self) -> dict[str, SinkStats]:
        """Delivered, dropped, failed and queued events of every sink, by name."""
        return self._telemetry.stats()

    def _now_us(self) -> int:
        """The telemetry clock: the driver's, on which work events are stamped."""
        now = getattr(self.driver, "now_us", None)
        return int(now) if now is not None else time.monotonic_ns() // 1000

    def _emit_state(self, key: RequestKey, state: ModelLoadState) -> None:
        context = self._contexts.get(key)
        if self._telemetry and context is not None:
            uid, now_us = context.manager.uid, self._now_us()
            event = state_changed(uid, key, context.request, state, context.device, now_us)
            self._telemetry.publish((event,))

    @property
    def now_ms(self) -> int:
        """The service clock, in milliseconds."""
        if self.clock == "virtual":
            return int(self.driver.now_us) // 1000
        return time.monotonic_ns() // 1_000_000

    def snapshot(self) -> dict[str, Any]:
        """What the service holds now, as plain data: policy, configs, requests, devices."""
        from npumanager.core.snapshot import build_snapshot

        with self._lock:
            return build_snapshot(self)

    @property
    def callback_errors(self) -> int:
        """Client callbacks that raised (logged, isolated)."""
        return self._stats.failed

    def state_of(self, manager: NpuManager, request: ModelLoadRequest) -> RequestState:
        """Where a live request stands (`UnknownRequestError` if it is not live)."""
        return self.arbiter.state_of(manager.client, request.id)

    # The request flow, called through NpuManager ------------------------------------------

    def _request(
        self,
        manager: NpuManager,
        request: ModelLoadRequest,
        callback: ModelLoadRequestCallback,
        executor: ExecutorLike | None,
        weight_bytes: int | None,
    ) -> None:
        self._check_feature(manager)
        key = RequestKey(manager.client, request.id)
        queue = SerialQueue(executor or self._default_executor, self._stats)
        context = _Context(manager, request, callback, queue, takes_reason(callback))
        with self._lock:
            self._open()
            if key in self._contexts:
                raise DuplicateRequestError(
                    f"request id {request.id} is already live for this client; ids may be "
                    "reused only after the request completes"
                )
            self._contexts[key] = context
            try:
                actions = self.arbiter.request(
                    self.now_ms, manager.client, manager.uid, request, weight_bytes=weight_bytes
                )
            except Exception:
                del self._contexts[key]
                raise
            if self._telemetry:
                event = requested(manager.uid, key, request, weight_bytes, self._now_us())
                self._telemetry.publish((event,))
            self._perform(actions)
        self._flush()

    def _cancel(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        self._act(lambda now: self.arbiter.cancel(now, manager.client, request.id))

    def _notify_loaded(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        def step(now: int) -> list[Action]:
            actions = self.arbiter.notify_loaded(now, manager.client, request.id)
            self._emit_state(RequestKey(manager.client, request.id), ModelLoadState.LOADED)
            return actions

        self._act(step)

    def _notify_unloaded(self, manager: NpuManager, request: ModelLoadRequest) -> None:
        def step(now: int) -> list[Action]:
            actions = self.arbiter.notify_unloaded(now, manager.client, request.id)
            self._emit_state(RequestKey(manager.client, request.id), ModelLoadState.UNLOADED)
            self._unload_models(RequestKey(manager.client, request.id))
            return actions

        self._act(step)

    def _set_policy_as(
        self, manager: NpuManager, policy: str | ModelPolicy | int, params: Mapping[str, Any] | None
    ) -> None:
        if manager.uid not in self.management_uids:
            raise NpuPermissionError(
                f"uid {manager.uid} may not set the policy: it needs the management "
                "permission (root, the system uid, or a configured management uid)"
            )
        self.set_policy(policy, params)

    def _load_model(
        self, manager: NpuManager, request: ModelLoadRequest, weight_bytes: int, sram_bytes: int
    ) -> LoadedModel:
        key = RequestKey(manager.client, request.id)
        with self._lock:
            context = self._contexts.get(key)
            if context is None or context.request != request:
                raise UnknownRequestError(
                    f"request {request.id} is not a live request of this client"
                )
            state = self.arbiter.state_of(manager.client, request.id)
            if state not in (RequestState.GRANTED, RequestState.LOADED):
                raise RequestStateError(
                    f"request {request.id} is {state}; a model may be loaded only after "
                    "CAN_LOAD_NOW"
                )
            self._check_allowance(key, request, context, weight_bytes)
            device = context.device or 0
            handle = self.driver.load_model(
                device, weight_bytes=weight_bytes, sram_bytes=sram_bytes
            )
            model = LoadedModel(manager, request, handle, device, weight_bytes=weight_bytes)
            context.models.append(model)
            self._emit_health()
            return model

    def _check_allowance(
        self, key: RequestKey, request: ModelLoadRequest, context: _Context, weight_bytes: int
    ) -> None:
        """Refuse a load that would take the request past what its grant allows."""
        declared = self.arbiter.declared_bytes(key.client, key.request_id)
        allowed = grant_allowance_bytes(request.size, declared)
        held = sum(model.weight_bytes for model in context.models)
        if held + weight_bytes <= allowed:
            return
        grant = (
            f"declared {declared} bytes"
            if declared is not None
            else f"{request.size.name} (at most {allowed} bytes without declared weight_bytes)"
        )
        raise CapacityError(
            f"request {request.id} was granted {grant} and holds {held} of {allowed} bytes; "
            f"loading {weight_bytes} more would exceed the grant: ask for a larger size class "
            "or declare weight_bytes when requesting"
        )

    def _submit(
        self,
        model: LoadedModel,
        cost_cycles: int,
        job_priority: int,
        original_uid: int | None,
        group_id: Any,
        feature_id: str | None,
    ) -> int:
        manager = model.manager
        if (
            original_uid is not None
            and original_uid != manager.uid
            and not self.arbiter.scheduling_config(manager.uid).can_attribute_other_uid
        ):
            raise NpuPermissionError(
                f"uid {manager.uid} may not attribute work to uid {original_uid}"
            )
        with self._lock:
            self._check_model(model)
            work_id = int(
                self.driver.submit(
                    model.handle,
                    uid=manager.uid,
                    cost_cycles=cost_cycles,
                    job_priority=job_priority,
                    original_uid=original_uid,
                    group_id=group_id,
                    feature_id=feature_id,
                    debug_pid=manager.pid or 0,
                )
            )
            self._work_models[work_id] = model
            return work_id

    def _cancel_work(self, model: LoadedModel, work_id: int) -> None:
        with self._lock:
            self._check_model(model)
            if self._work_models.get(work_id) is not model:
                raise UnknownWorkError(
                    f"work {work_id} is not live work of model {model.handle}: a model may "
                    "cancel only work it submitted and that has not ended"
                )
            self.driver.cancel(work_id)

    def _check_model(self, model: LoadedModel) -> None:
        context = self._contexts.get(RequestKey(model.manager.client, model.request.id))
        if context is None or model not in context.models:
            raise UnknownModelError(
                f"model {model.handle} is no longer loaded (its request ended or it was revoked)"
            )

    def _check_feature(self, manager: NpuManager) -> None:
        if manager.uses_feature:
            return
        if self.feature_mode == "block":
            raise FeatureNotDeclaredError(
                f"uid {manager.uid} did not declare the NPU feature; call "
                "declare_feature() or pass uses_feature=True"
            )
        if manager.client not in self._warned_clients:
            self._warned_clients.add(manager.client)
            warnings.warn(
                f"uid {manager.uid} uses the NPU without declaring the feature",
                FeatureWarning,
                stacklevel=4,
            )

    # Performing decisions ---------------------------------------------------------------

    def _act(self, step: Callable[[int], list[Action]]) -> None:
        with self._lock:
            self._open()
            self._perform(step(self.now_ms))
        self._flush()

    def _perform(self, actions: Iterable[Action]) -> None:
        """Carry out driver-side actions now and queue deliveries (lock held)."""
        for action in actions:
            if isinstance(action, RelayConfigs):
                if action.replace_all:
                    self.driver.set_scheduling_configs(action.configs)
                else:
                    self.driver.update_scheduling_configs(action.configs)
                continue
            context = self._contexts.get(action.key)
            if context is None:
                log.warning("action for a request the service does not know: %r", action)
                continue
            if isinstance(action, CanLoad) and action.device is not None:
                context.device = action.device
            if self._telemetry:
                event = from_action(context.manager.uid, action, context.device, self._now_us())
                self._telemetry.publish((event,))
            if isinstance(action, CanLoad):
                self._deliver(context, context.decided(action.status))
            elif isinstance(action, RequestUnload):
                self._deliver(context, context.unload_asked(action.reason))
            elif isinstance(action, Revoke):
                self._unload_models(action.key)
            elif isinstance(action, Complete):
                self._unload_models(action.key)
                del self._contexts[action.key]
                self._deliver(context, context.completed(action.status))

    def _deliver(self, context: _Context, task: Callable[[], None]) -> None:
        if context.queue.put(task):
            self._to_schedule.append(context.queue)

    def _flush(self) -> None:
        """Schedule the queues that got deliveries, outside the lock."""
        while True:
            with self._lock:
                queues, self._to_schedule = self._to_schedule, []
            if not queues:
                self._telemetry.drain()
                return
            for queue in queues:
                queue.schedule()

    def _unload_models(self, key: RequestKey) -> None:
        context = self._contexts.get(key)
        if context is None:
            return
        for model in context.models:
            self.driver.unload_model(model.handle)
        if context.models:
            self._emit_health()
        context.models.clear()

    # Driver events and time -------------------------------------------------------------

    def _on_work_events(self, events: Sequence[WorkEvent]) -> None:
        if self._telemetry:
            self._telemetry.publish_work(events)
        for listener in self._listeners:
            try:
                listener(events)
            except Exception:
                log.exception("event listener %r raised", listener)
        for event in events:
            if event.kind == EventKind.ENDED and event.reason != EndReason.PAUSED:
                self._work_models.pop(event.id, None)
                if event.reason == EndReason.COMPLETED:
                    self._completed[event.original_uid] = None
        if self._completed:
            now = self.now_ms
            uids, self._completed = list(self._completed), {}
            for uid in uids:
                self._pending.extend(self.arbiter.work_ended(now, uid, EndReason.COMPLETED))

    def _sample_devices(self) -> None:
        now = self.now_ms
        for device in range(self.driver.device_count):
            state = self.driver.device_state(device)
            if self._telemetry:
                self._publish_sample(state)
            severity = state.severity
            if self._severity.get(device, ThermalSeverity.NONE) != severity:
                self._severity[device] = severity
                self._perform(self.arbiter.set_thermal(now, device, severity))

    def _emit_health(self) -> None:
        """Sample device health for the sinks now (a model came or went)."""
        if self._telemetry:
            for device in range(self.driver.device_count):
                self._publish_sample(self.driver.device_state(device))

    def _publish_sample(self, state: DeviceStatus) -> None:
        sample = self._sampler.sample(state, state.now_us)
        if sample is not None:
            self._telemetry.publish((sample,))

    def _after_driver_step(self) -> None:
        pending, self._pending = self._pending, []
        self._perform(pending)
        self._sample_devices()
        self._perform(self.arbiter.tick(self.now_ms))
        if self._telemetry.debouncing:
            self._telemetry.step(self._now_us())

    def set_memory_pressure(self, level: int) -> None:
        """Signal memory pressure: 0 none, 1 moderate, 2 critical."""
        level = check_int("level", level, 0, 2)
        self._act(lambda now: self.arbiter.set_memory_pressure(now, level))

    def add_heat(self, device: int, millicelsius: int) -> None:
        """A thermal spike on a simulated device (the driver must support it)."""
        with self._lock:
            self._open()
            self.driver.add_heat(device, millicelsius)
            self._after_driver_step()
        self._flush()

    def advance(self, ms: int) -> None:
        """Virtual time: run the driver and the policy forward by `ms` milliseconds."""
        self._virtual_only("advance")
        target_us = (self.now_ms + check_int("ms", ms, 0, 1 << 40)) * 1000
        while True:
            with self._lock:
                self._open()
                now_us = int(self.driver.now_us)
                if now_us >= target_us:
                    break
                step = min(target_us, (now_us // _VIRTUAL_STEP_US + 1) * _VIRTUAL_STEP_US)
                self.driver.advance(step - now_us)
                self._after_driver_step()
            self._flush()
        self._flush()

    def quiescent(self) -> bool:
        """Virtual time: True when no work runs and no decision is due, so nothing will change."""
        engine = getattr(self.driver, "engine", None)
        busy = engine is not None and not engine.idle()
        return not busy and self.arbiter.next_deadline_ms() is None

    def run_until_idle(self, max_ms: int = 60_000) -> None:
        """Virtual time: advance until the driver is idle and no decision is due."""
        self._virtual_only("run_until_idle")
        deadline = self.now_ms + check_int("max_ms", max_ms, 0, 1 << 40)
        while self.now_ms < deadline and not self.quiescent():
            self.advance(1)

    def _virtual_only(self, what: str) -> None:
        if self.clock != "virtual":
            raise IllegalArgumentError(
                f"{what}() needs a virtual clock; this service runs in real time"
            )

    def _serve(self) -> None:
        fileno = getattr(self.driver, "fileno", None)
        fd = fileno() if callable(fileno) else None
        while not self._stop.is_set():
            due = self.arbiter.next_deadline_ms()
            timeout = 0.05 if due is None else max(0.0, min(0.05, (due - self.now_ms) / 1000))
            if fd is not None:
                select.select([fd], [], [], timeout)
            else:
                self._stop.wait(timeout)
            with self._lock:
                if self._closed:
                    return
                self.driver.pump()
                self._after_driver_step()
            self._flush()

    # Closing ----------------------------------------------------------------------------

    def _open(self) -> None:
        if self._closed:
            raise IllegalArgumentError("the service is closed")

    def close(self) -> None:
        """End every live request (its client gets the completion), stop, close the driver."""
        with self._lock:
            if self._closed:
                return
            clients = sorted({key.client for key in self._contexts})
            for client in clients:
                final = [
                    action
                    for action in self.arbiter.client_died(self.now_ms, client)
                    if isinstance(action, Complete | Revoke)
                ]
                self._perform(final)
            self._closed = True
        self._flush()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._dispatcher is not None:
            self._dispatcher.shutdown(wait=True)
        self._telemetry.close()
        self.driver.close()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def policy_name(policy: str | ModelPolicy | int) -> str:
    """The plugin name for a policy given by name or by the platform's constant."""
    if isinstance(policy, str):
        return policy.replace("-", "_")
    try:
        return POLICY_NAMES[ModelPolicy(policy)]
    except ValueError:
        allowed = ", ".join(f"{p.name}={p.value}" for p in ModelPolicy)
        raise PolicyParamsError(f"unknown policy {policy!r}; allowed: {allowed}") from None


class _DriverEvents:
    """The service's batch callback on the driver (raw events, no debounce)."""

    def __init__(self, service: Service) -> None:
        self._service = service

    def on_work_events(self, events: Sequence[WorkEvent]) -> None:
        self._service._on_work_events(events)
