"""The `npu` service: the arbiter's decisions carried out against a driver.

One driver, one model-loading policy (a plugin), the clients' callbacks. `Service` builds
them and is the facade of the owner's calls; its parts live beside it: `decisions` (the
service lock, every arbiter input and the carrying out of its actions), `backend` (what
the clients' managers call), `requests` (the records and their delivery queues),
`telemetry_bridge` (sinks, listeners, health samples) and `clocks` (the virtual-time loop
and the real-time service thread).

In virtual time (`clock="virtual"`) nothing moves until `advance` or `run_until_idle`;
callbacks run inline unless a client gives an executor. In real time a service thread
waits on the driver and on the arbiter's deadlines, and callbacks run on a dispatcher
thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from npumanager.checks import check_int
from npumanager.core.arbiter.actions import Complete, RequestState, Revoke
from npumanager.core.arbiter.arbiter import Arbiter
from npumanager.core.arbiter.policy import Policy, build_policy, policy_name
from npumanager.core.client.dispatch import DeliveryStats, run_inline
from npumanager.core.client.manager import NpuManager
from npumanager.core.driver.contract import Driver, ThermalModel, VirtualTimeDriver
from npumanager.core.driver.events import WorkEvent
from npumanager.core.plugins.health import HealthSpec, build_health_source
from npumanager.core.plugins.registry import PluginRegistry, load_plugins
from npumanager.core.service.backend import LocalBackend
from npumanager.core.service.clocks import RealTime, VirtualTime
from npumanager.core.service.decisions import Clock, Decisions
from npumanager.core.service.health_monitor import HealthMonitor
from npumanager.core.service.snapshot import build_snapshot
from npumanager.core.service.telemetry_bridge import EventListener, TelemetryBridge
from npumanager.errors import IllegalArgumentError
from npumanager.schemas import DriverCapability, ModelLoadRequest, ModelPolicy
from npumanager.schemas.device import DeviceSpec
from npumanager.schemas.limits import (
    DEFAULT_HEALTH_INTERVAL_MS,
    DEFAULT_RUN_UNTIL_IDLE_MS,
    DEFAULT_SINK_QUEUE_EVENTS,
    DEFAULT_UNLOAD_GRACE_MS,
    HEALTH_SAMPLE_INTERVAL_MS,
    INT32_MAX,
    MAX_HEALTH_INTERVAL_MS,
    ROOT_UID,
    SYSTEM_UID,
)
from npumanager.telemetry import SinkHandle, SinkStats, TelemetryHub

__all__ = ["Clock", "EventListener", "Service", "policy_name"]


class Service:
    """The arbiter service: policy decisions, driver, callbacks."""

    def __init__(
        self,
        driver: str | Driver = "vnpu",
        policy: str | ModelPolicy | int = "status_quo",
        *,
        policy_params: Mapping[str, Any] | None = None,
        clock: Clock = "real",
        devices: int | Sequence[DeviceSpec | Mapping[str, Any]] = 1,
        driver_options: Mapping[str, Any] | None = None,
        unload_grace_ms: int = DEFAULT_UNLOAD_GRACE_MS,
        feature_mode: Literal["warn", "block"] = "warn",
        attribution_uids: Iterable[int] = (),
        management_uids: Iterable[int] = (),
        registry: PluginRegistry | None = None,
        sinks: Iterable[Any] = (),
        health_interval_ms: int | None = None,
        health: Iterable[HealthSpec] = (),
    ) -> None:
        if clock not in ("real", "virtual"):
            raise IllegalArgumentError(f"clock must be 'real' or 'virtual'; got {clock!r}")
        if health_interval_ms is None:
            real = clock == "real"
            health_interval_ms = DEFAULT_HEALTH_INTERVAL_MS if real else HEALTH_SAMPLE_INTERVAL_MS
        health_interval_ms = check_int(
            "health_interval_ms", health_interval_ms, 1, MAX_HEALTH_INTERVAL_MS
        )
        if feature_mode not in ("warn", "block"):
            raise IllegalArgumentError(
                f"feature_mode must be 'warn' or 'block'; got {feature_mode!r}"
            )
        self.clock: Clock = clock
        self.feature_mode = feature_mode
        self.registry = registry or load_plugins()
        self.management_uids = frozenset({ROOT_UID, SYSTEM_UID, *management_uids})
        self.attribution_uids = frozenset({ROOT_UID, SYSTEM_UID, *attribution_uids})
        self._stats = DeliveryStats()
        self._next_client = 1
        self.policy_name, policy_object = self._make_policy(policy, policy_params)
        self.arbiter = Arbiter(
            policy_object, unload_grace_ms=unload_grace_ms, attribution_uids=self.attribution_uids
        )
        self.driver: Driver = self._make_driver(driver, devices, dict(driver_options or {}))
        self._virtual: VirtualTime | None = None
        self._real: RealTime | None = None
        self._telemetry = TelemetryBridge(
            self.driver, threaded=clock == "real", health_interval_ms=health_interval_ms
        )
        self._decisions = Decisions(clock, self.arbiter, self.driver, self._telemetry)
        self._lock = self._decisions.lock
        if clock == "virtual":
            if not isinstance(self.driver, VirtualTimeDriver):
                self.driver.close()
                raise IllegalArgumentError(
                    f"a virtual clock needs a driver with advance() and idle(); "
                    f"{type(self.driver).__name__} has none"
                )
            self._virtual = VirtualTime(self._decisions, self.driver)
        self._dispatcher = (
            ThreadPoolExecutor(1, thread_name_prefix="npu-dispatch") if clock == "real" else None
        )
        self._backend = LocalBackend(
            self._decisions,
            default_executor=self._dispatcher or run_inline,
            stats=self._stats,
            feature_mode=feature_mode,
            management_uids=self.management_uids,
            set_policy=self.set_policy,
            advance=self.advance,
            quiescent=self.quiescent,
        )
        self.driver.set_callback(_DriverEvents(self._decisions), debounce_duration_ms=0)
        self._health = HealthMonitor(self._decisions.health_read)
        for sink in sinks:
            self.add_sink(sink)
        for spec in health:
            self.add_health_source(spec)
        with self._lock:
            capacities = [d.weight_memory_bytes for d in self.driver.describe_devices()]
            self._decisions.perform(self.arbiter.set_capacity(self.now_ms, capacities))
            self._decisions.perform(self.arbiter.connect_driver())
            self._decisions.sample_devices()
        if clock == "real":
            self._real = RealTime(self._decisions, self.driver)
            self._real.start()

    def _make_driver(
        self,
        driver: str | Driver,
        devices: int | Sequence[DeviceSpec | Mapping[str, Any]],
        options: dict[str, Any],
    ) -> Driver:
        if not isinstance(driver, str):
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
        try:
            made = record.factory(devices, **options)
        except TypeError as exc:
            if "keyword argument" not in str(exc):
                raise
            given = ", ".join(sorted(options)) or "none"
            raise IllegalArgumentError(
                f"driver {driver!r} refused its options ({given}): {exc}"
            ) from None
        if not isinstance(made, Driver):
            missing = [n for n in vars(Driver) if not n.startswith("_") and not hasattr(made, n)]
            raise IllegalArgumentError(
                f"driver {driver!r} built a {type(made).__name__}, which is not a Driver: "
                f"it lacks {', '.join(missing)} (see npumanager.core.driver.contract.Driver)"
            )
        return made

    def _make_policy(
        self, policy: str | ModelPolicy | int, params: Mapping[str, Any] | None
    ) -> tuple[str, Policy]:
        name = policy_name(policy)
        return name, build_policy(self.registry.policy(name), params)

    # The service owner's calls ------------------------------------------------------------

    def manager(
        self, uid: int, *, pid: int | None = None, uses_feature: bool = False
    ) -> NpuManager:
        """An `NpuManager` for an app with this uid living in this process."""
        uid = check_int("uid", uid, 0, INT32_MAX)
        with self._lock:
            client = self._next_client
            self._next_client += 1
        return NpuManager(self._backend, client, uid, pid, uses_feature)

    @property
    def backend(self) -> LocalBackend:
        """What this service's managers call: the public ``Backend`` interface, in process."""
        return self._backend

    def set_uid_importance(self, uid: int, importance: int) -> None:
        """Tell the service how important a uid's process is now (as the activity manager would)."""
        self._decisions.act(lambda now: self.arbiter.set_importance(now, uid, importance))

    def set_policy(
        self, policy: str | ModelPolicy | int, params: Mapping[str, Any] | None = None
    ) -> None:
        """Swap the model-loading policy (the service owner's call: no permission check)."""
        name, policy_object = self._make_policy(policy, params)
        with self._lock:
            self.policy_name = name
        self._decisions.act(lambda now: self.arbiter.set_policy(now, policy_object))

    def set_uid_access(
        self,
        uid: int,
        *,
        has_direct_access: bool | None = None,
        can_attribute_other_uid: bool | None = None,
    ) -> None:
        """Override what a uid's scheduling config allows (None keeps a value as it is)."""
        self._decisions.act(
            lambda now: self.arbiter.set_access(
                now,
                uid,
                has_direct_access=has_direct_access,
                can_attribute_other_uid=can_attribute_other_uid,
            )
        )

    def client_died(self, manager: NpuManager) -> None:
        """A client went away: its requests end and its share is freed."""
        self._decisions.act(lambda now: self.arbiter.client_died(now, manager.client))

    def set_memory_pressure(self, level: int) -> None:
        """Signal memory pressure: 0 none, 1 moderate, 2 critical (a health source may raise it)."""
        self._decisions.act(lambda now: self._decisions.signal_memory(now, level))

    def add_health_source(self, source: HealthSpec, **options: Any) -> str:
        """Read device health from a source too: a registered name (built with ``options``),
        ``(name, options)`` or an object with ``read()``; its name in ``snapshot()["health"]``.

        Health sources read the machine as it is now, so they need the real clock.
        """
        if self.clock != "real":
            raise IllegalArgumentError("health sources read the real machine: use clock='real'")
        if options:
            if not isinstance(source, str):
                raise IllegalArgumentError("options are for a health source given by name")
            source = (source, options)
        name, built = build_health_source(self.registry, source)
        with self._lock:
            self._decisions.check_open()
            state = self._telemetry.health.add(name)
        self._health.add(state, built)
        return state.name

    def add_heat(self, device: int, millicelsius: int) -> None:
        """A thermal spike on a simulated device (the driver must have a thermal model)."""
        driver = self.driver
        if not isinstance(driver, ThermalModel):
            raise IllegalArgumentError(f"driver {type(driver).__name__} has no thermal model")
        with self._lock:
            self._decisions.check_open()
            driver.add_heat(device, millicelsius)
            self._decisions.after_step()
        self._decisions.flush()

    def add_listener(self, listener: EventListener) -> None:
        """Receive every raw work event, in batches, as the driver reports them."""
        with self._lock:
            self._telemetry.add_listener(listener)

    def add_sink(
        self,
        sink: Any,
        *,
        debounce_duration_ms: int = 0,
        queue_size: int = DEFAULT_SINK_QUEUE_EVENTS,
        **options: Any,
    ) -> SinkHandle:
        """Send telemetry to a sink: a registered name (built with ``options``) or an object.

        Work events reach it through its own debouncer with the platform's rules
        (``debounce_duration_ms``, 0 for raw events); model-load events and device samples
        are never debounced. In real time at most ``queue_size`` events wait for a slow
        sink; more are dropped and counted (`sink_stats`).
        """
        TelemetryHub.check_options(debounce_duration_ms, queue_size)
        name, built = self._telemetry.build_sink(self.registry, sink, options)
        with self._lock:
            self._decisions.check_open()
            return self._telemetry.add_sink(name, built, debounce_duration_ms, queue_size)

    def remove_sink(self, handle: SinkHandle) -> None:
        """Stop sending to a sink: what it still has coming is delivered, then it is closed."""
        with self._lock:
            self._telemetry.remove_sink(handle)

    def sink_stats(self) -> dict[str, SinkStats]:
        """Delivered, dropped, failed and queued events of every sink, by name."""
        return self._telemetry.stats()

    # Queries ----------------------------------------------------------------------------

    @property
    def now_ms(self) -> int:
        """The service clock, in milliseconds."""
        return self._decisions.now_ms

    def snapshot(self) -> dict[str, Any]:
        """What the service holds now, as plain data: policy, configs, requests, devices."""
        with self._lock:
            return build_snapshot(
                self.arbiter,
                self.driver,
                policy_name=self.policy_name,
                sinks=self.sink_stats(),
                callback_errors=self.callback_errors,
                model_devices=self._decisions.requests.model_devices(),
                health=self._telemetry.health,
            )

    @property
    def callback_errors(self) -> int:
        """Client callbacks that raised (logged, isolated)."""
        return self._stats.failed

    def state_of(self, manager: NpuManager, request: ModelLoadRequest) -> RequestState:
        """Where a live request stands (`UnknownRequestError` if it is not live)."""
        with self._lock:
            return self.arbiter.state_of(manager.client, request.id)

    def advance(self, ms: int) -> None:
        """Virtual time: run the driver and the policy forward by ``ms`` milliseconds."""
        self._virtual_time("advance").advance(ms)

    def quiescent(self) -> bool:
        """Virtual time: True when no work runs and no decision is due, so nothing will change."""
        if self._virtual is None:
            with self._lock:
                return self.arbiter.next_deadline_ms() is None
        return self._virtual.quiescent()

    def run_until_idle(self, max_ms: int = DEFAULT_RUN_UNTIL_IDLE_MS) -> None:
        """Virtual time: advance until the driver is idle and no decision is due."""
        self._virtual_time("run_until_idle").run_until_idle(max_ms)

    def _virtual_time(self, what: str) -> VirtualTime:
        if self._virtual is None:
            raise IllegalArgumentError(
                f"{what}() needs a virtual clock; this service runs in real time"
            )
        return self._virtual

    # Closing ----------------------------------------------------------------------------

    def close(self) -> None:
        """End every live request (its client gets the completion), stop, close the driver."""
        d = self._decisions
        self._health.stop()
        with self._lock:
            if d.closed:
                return
            for client in d.requests.clients():
                final = [
                    action
                    for action in self.arbiter.client_died(self.now_ms, client)
                    if isinstance(action, Complete | Revoke)
                ]
                d.perform(final)
            d.closed = True
        d.flush()
        if self._real is not None:
            self._real.stop(timeout_s=5)
        if self._dispatcher is not None:
            self._dispatcher.shutdown(wait=True)
        self._telemetry.close()
        self.driver.close()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _DriverEvents:
    """The service's batch callback on the driver (raw events, no debounce)."""

    def __init__(self, decisions: Decisions) -> None:
        self._decisions = decisions

    def on_work_events(self, events: Sequence[WorkEvent]) -> None:
        with self._decisions.lock:
            self._decisions.on_work_events(events)
