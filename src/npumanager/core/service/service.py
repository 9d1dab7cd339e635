"""The `npu` service: the arbiter's decisions carried out against a driver.

One driver, one model-loading policy (a plugin), the clients' callbacks. `Service` builds
them and is the facade of the service owner's calls; its parts live beside it: `state`
(the one owner of the service's state: its lock, the arbiter, the records, the driver,
with a method for each intention; `carrying` is its base, the carrying out of the
arbiter's actions), `backend` (what the clients' managers call), `requests` (the records
and their delivery queues), `telemetry_bridge` (sinks, listeners, health samples) and
`clocks` (the virtual-time loop and the real-time service thread).

In virtual time (`clock="virtual"`) nothing moves until `advance` or `run_until_idle`;
callbacks run inline unless a client gives an executor. In real time a service thread
waits on the driver and on the arbiter's deadlines, and callbacks run on a dispatcher
thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

from npumanager.checks import check_int
from npumanager.core.arbiter.actions import RequestState
from npumanager.core.arbiter.arbiter import Arbiter
from npumanager.core.arbiter.policy import Policy, build_policy, policy_name
from npumanager.core.client.dispatch import DeliveryStats, run_inline
from npumanager.core.client.manager import NpuManager
from npumanager.core.driver.contract import Driver, VirtualTimeDriver
from npumanager.core.driver.events import WorkEvent
from npumanager.core.plugins.factories import build_with_options
from npumanager.core.plugins.health import HealthSpec, build_health_source
from npumanager.core.plugins.registry import PluginRegistry, load_plugins
from npumanager.core.service.backend import LocalBackend
from npumanager.core.service.carrying import Clock
from npumanager.core.service.clocks import RealTime, VirtualTime
from npumanager.core.service.health_monitor import HealthMonitor
from npumanager.core.service.state import ServiceState
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

if TYPE_CHECKING:
    from npumanager.apps.device_users import DeviceUser

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
        self.policy_name, policy_object = self._make_policy(policy, policy_params)
        arbiter = Arbiter(
            policy_object, unload_grace_ms=unload_grace_ms, attribution_uids=self.attribution_uids
        )
        driver_object = self._make_driver(driver, devices, dict(driver_options or {}))
        self._virtual: VirtualTime | None = None
        self._real: RealTime | None = None
        self._telemetry = TelemetryBridge(
            driver_object, threaded=clock == "real", health_interval_ms=health_interval_ms
        )
        self._state = ServiceState(clock, arbiter, driver_object, self._telemetry)
        self._inspect = (arbiter, driver_object)
        if clock == "virtual":
            if not isinstance(driver_object, VirtualTimeDriver):
                driver_object.close()
                raise IllegalArgumentError(
                    f"a virtual clock needs a driver with advance() and idle(); "
                    f"{type(driver_object).__name__} has none"
                )
            self._virtual = VirtualTime(self._state, driver_object)
        self._dispatcher = (
            ThreadPoolExecutor(1, thread_name_prefix="npu-dispatch") if clock == "real" else None
        )
        self._backend = LocalBackend(
            self._state,
            default_executor=self._dispatcher or run_inline,
            stats=self._stats,
            feature_mode=feature_mode,
            management_uids=self.management_uids,
            set_policy=self.set_policy,
            advance=self.advance,
            quiescent=self.quiescent,
        )
        driver_object.set_callback(_DriverEvents(self._state), debounce_duration_ms=0)
        self._health = HealthMonitor(self._state.health_read)
        for sink in sinks:
            self.add_sink(sink)
        for spec in health:
            self.add_health_source(spec)
        self._state.connect()
        if clock == "real":
            self._real = RealTime(self._state, driver_object)
            self._real.start()

    @property
    def arbiter(self) -> Arbiter:
        """The arbiter, to inspect (its queries change nothing); every input goes through
        the service's calls."""
        return self._inspect[0]

    @property
    def driver(self) -> Driver:
        """The driver, to inspect (``describe_devices``, ``device_state``); everything it
        is told goes through the service."""
        return self._inspect[1]

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
        real = DriverCapability.REAL_TIME in record.capabilities
        service_given = {"clock": self.clock} if real else {}
        made = build_with_options(
            f"driver {driver!r}", record.factory, (devices,), options, service_given
        )
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
        """An `~npumanager.NpuManager` for an app with this uid living in this process."""
        uid = check_int("uid", uid, 0, INT32_MAX)
        return NpuManager(self._backend, self._state.new_client(), uid, pid, uses_feature)

    @property
    def backend(self) -> LocalBackend:
        """What this service's managers call: the public ``Backend`` interface, in process."""
        return self._backend

    def set_uid_importance(self, uid: int, importance: int) -> None:
        """Tell the service how important a uid's process is now (as the activity manager would)."""
        self._state.set_importance(uid, importance)

    def set_policy(
        self, policy: str | ModelPolicy | int, params: Mapping[str, Any] | None = None
    ) -> None:
        """Swap the model-loading policy (the service owner's call: no permission check)."""
        name, policy_object = self._make_policy(policy, params)
        self.policy_name = name
        self._state.set_policy(policy_object)

    def set_uid_access(
        self,
        uid: int,
        *,
        has_direct_access: bool | None = None,
        can_attribute_other_uid: bool | None = None,
    ) -> None:
        """Override what a uid's scheduling config allows (None keeps a value as it is)."""
        self._state.set_access(uid, has_direct_access, can_attribute_other_uid)

    def client_died(self, manager: NpuManager) -> None:
        """A client went away: its requests end and its share is freed."""
        self._state.close_client(manager.client)

    def count_outside_memory(self, held_bytes: Sequence[int]) -> None:
        """Weight memory that processes outside the manager hold on each device (device 0
        first): loads are granted only what is left, and background apps are asked to
        unload if what is loaded no longer fits; ``snapshot()`` shows it by device."""
        self._state.count_outside_memory(held_bytes)

    def set_memory_pressure(self, level: int) -> None:
        """Signal memory pressure: 0 none, 1 moderate, 2 critical (a health source may raise it)."""
        self._state.set_memory_pressure(level)

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
        state = self._state.add_health_state(name)
        self._health.add(state, built)
        return state.name

    def add_heat(self, device: int, millicelsius: int) -> None:
        """A thermal spike on a simulated device (the driver must have a thermal model)."""
        self._state.add_heat(device, millicelsius)

    def add_listener(self, listener: EventListener) -> None:
        """Receive every raw work event, in batches, as the driver reports them."""
        self._state.add_listener(listener)

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
        return self._state.add_sink(name, built, debounce_duration_ms, queue_size)

    def name_uids(self, resolve: Callable[[int], str | None]) -> None:
        """Name the uids that telemetry carries (a daemon: each HAL uid by its app id), for
        sinks that label by app (Prometheus's ``app`` label, Perfetto's tracks)."""
        self._telemetry.hub.uid_names.set(resolve)

    def show_device_users(self, provide: Callable[[], Sequence[DeviceUser]]) -> None:
        """Give sinks that show the device's other users (Prometheus) ``provide``, which
        returns the processes using the accelerator without the manager (a daemon's scan)."""
        self._telemetry.hub.device_users.set(provide)

    def remove_sink(self, handle: SinkHandle) -> None:
        """Stop sending to a sink: what it still has coming is delivered, then it is closed."""
        self._state.remove_sink(handle)

    def sink_stats(self) -> dict[str, SinkStats]:
        """Delivered, dropped, failed and queued events of every sink, by name."""
        return self._state.sink_stats()

    # Queries ----------------------------------------------------------------------------

    @property
    def now_ms(self) -> int:
        """The service clock, in milliseconds."""
        return self._state.now_ms

    def snapshot(self) -> dict[str, Any]:
        """What the service holds now, as plain data: policy, configs, requests, devices."""
        return self._state.snapshot(self.policy_name, self.callback_errors)

    @property
    def callback_errors(self) -> int:
        """Client callbacks that raised (logged, isolated)."""
        return self._stats.failed

    def state_of(self, manager: NpuManager, request: ModelLoadRequest) -> RequestState:
        """Where a live request stands (`UnknownRequestError` if it is not live)."""
        return self._state.state_of(manager.client, request.id)

    def advance(self, ms: int) -> None:
        """Virtual time: run the driver and the policy forward by ``ms`` milliseconds."""
        self._virtual_time("advance").advance(ms)

    def quiescent(self) -> bool:
        """Virtual time: True when no work runs and no decision is due, so nothing will change."""
        if self._virtual is None:
            return self._state.no_deadline()
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
        self._health.stop()
        if not self._state.close():
            return
        if self._real is not None:
            self._real.stop(timeout_s=5)
        if self._dispatcher is not None:
            self._dispatcher.shutdown(wait=True)
        self._telemetry.close()
        self._state.close_driver()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _DriverEvents:
    """The service's batch callback on the driver (raw events, no debounce)."""

    def __init__(self, state: ServiceState) -> None:
        self._state = state

    def on_work_events(self, events: Sequence[WorkEvent]) -> None:
        self._state.driver_events(events)
