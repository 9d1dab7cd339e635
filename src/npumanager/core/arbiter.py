"""The service's decisions: a pure state machine over model-load requests.

No threads, no I/O, no clock: every input carries `now_ms` and returns the actions the
service must perform, in order. Bad input raises an `NpuManagerError` before anything
changes. The arbiter keeps the requests, uid priorities, completion times, deadlines and
pressure inputs; the policy (a `Policy`) decides through the verbs of `PolicyContext`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from npumanager.checks import check_int
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
from npumanager.core.policy import Entry, Policy, Rank
from npumanager.errors import (
    DuplicateRequestError,
    IllegalArgumentError,
    RequestStateError,
    UnknownRequestError,
)
from npumanager.schemas import (
    EndReason,
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    SchedulingConfig,
    ThermalSeverity,
    UnloadReason,
)
from npumanager.schemas.limits import (
    DEFAULT_UNLOAD_GRACE_MS,
    INT32_MAX,
    INT64_MAX,
    MAX_DEVICES,
    MAX_PRIORITY,
    MEMORY_PRESSURE_CRITICAL,
    MEMORY_PRESSURE_NONE,
    MIN_PRIORITY,
    PINNED_PRIORITY,
    ROOT_UID,
    SYSTEM_UID,
    UNKNOWN_UID_PRIORITY,
)

_PINNED = frozenset({ROOT_UID, SYSTEM_UID})
_UNLOADABLE = frozenset({RequestState.GRANTED, RequestState.LOADED, RequestState.UNLOADING})
_REVOKED_ON_DEATH = frozenset({RequestState.LOADED, RequestState.UNLOADING})


@dataclass(frozen=True)
class RequestInfo:
    """A snapshot of one live request, for queries and `npu-manager info`.

    `weight` is what the current policy counts against its limit (0 for a policy without
    one); `weight_bytes` is the size the client gave, if any.
    """

    key: RequestKey
    uid: int
    request: ModelLoadRequest
    state: RequestState
    weight: int
    weight_bytes: int | None
    device: int | None


def _uid(value: object) -> int:
    return check_int("uid", value, 0, INT32_MAX)


class Arbiter:
    """Decides which model loads may proceed, and who must unload, under one policy."""

    def __init__(
        self,
        policy: Policy,
        *,
        unload_grace_ms: int = DEFAULT_UNLOAD_GRACE_MS,
        attribution_uids: frozenset[int] = frozenset(),
    ) -> None:
        self._check_policy(policy)
        self.unload_grace_ms = check_int("unload_grace_ms", unload_grace_ms, 0, INT64_MAX)
        self.attribution_uids = frozenset(_uid(uid) for uid in attribution_uids)
        self._entries: dict[RequestKey, Entry] = {}
        self._by_uid: dict[int, dict[RequestKey, Entry]] = {}
        self._by_client: dict[int, dict[RequestKey, Entry]] = {}
        self._seq = 0
        self._priority: dict[int, int] = {}
        self._last_completed: dict[int, int] = {}
        self._configs: dict[int, SchedulingConfig] = {}
        self._access: dict[int, tuple[bool, bool]] = {}
        self._deadlines: list[tuple[int, int, RequestKey]] = []
        self._thermal: dict[int, ThermalSeverity] = {}
        self._thermal_max = ThermalSeverity.NONE
        self._memory_pressure = MEMORY_PRESSURE_NONE
        self._capacities: tuple[int, ...] | None = None
        self._now = 0
        self._out: list[Action] = []
        self._policy = policy
        self._ctx = _Context(self)
        policy.attach(self._ctx)
        for uid in self._known_uids():
            self._configs[uid] = self._config_for(uid)

    # ----------------------------------------------------------------- inputs

    def request(
        self,
        now_ms: int,
        client: int,
        uid: int,
        request: ModelLoadRequest,
        *,
        weight_bytes: int | None = None,
    ) -> list[Action]:
        """A client asks whether it may load a model; its decision comes back at once."""
        if not isinstance(request, ModelLoadRequest):
            raise IllegalArgumentError(f"request must be a ModelLoadRequest; got {request!r}")
        uid = _uid(uid)
        if weight_bytes is not None:
            check_int("weight_bytes", weight_bytes, 1, INT64_MAX)
        key = RequestKey(client, request.id)
        if key in self._entries:
            raise DuplicateRequestError(
                f"client {client} already has a live request with id {request.id}"
            )
        self._begin(now_ms)
        self._seq += 1
        entry = Entry(key, uid, request, weight_bytes, self._seq)
        self._entries[key] = entry
        self._by_uid.setdefault(uid, {})[key] = entry
        self._by_client.setdefault(client, {})[key] = entry
        self._policy.track(entry)
        self._policy.admit(entry)
        if entry.state is RequestState.NEW:
            self._ctx.refuse(entry)
        return self._finish()

    def cancel(self, now_ms: int, client: int, request_id: int) -> list[Action]:
        """The client gives up one of its requests: it ends CANCELLED."""
        entry = self._live(client, request_id)
        self._begin(now_ms)
        self._end(entry, ModelLoadRequestStatus.CANCELLED)
        self._policy.reevaluate()
        return self._finish()

    def notify_loaded(self, now_ms: int, client: int, request_id: int) -> list[Action]:
        """The client's model is in driver memory; only a granted request may say so."""
        entry = self._live(client, request_id)
        if entry.state is not RequestState.GRANTED:
            raise RequestStateError(
                f"request {request_id} of client {client} is {entry.state.value}; "
                f"only a granted request can be loaded"
            )
        self._begin(now_ms)
        self._move(entry, RequestState.LOADED, entry.device)
        return self._finish()

    def notify_unloaded(self, now_ms: int, client: int, request_id: int) -> list[Action]:
        """The client released its model: the request ends COMPLETE and its share is free."""
        entry = self._live(client, request_id)
        if entry.state not in _UNLOADABLE:
            raise RequestStateError(
                f"request {request_id} of client {client} is {entry.state.value}; "
                f"only a granted, loaded or unloading request can be unloaded"
            )
        self._begin(now_ms)
        self._end(entry, ModelLoadRequestStatus.COMPLETE)
        self._policy.reevaluate()
        return self._finish()

    def set_importance(self, now_ms: int, uid: int, importance: int) -> list[Action]:
        """A uid's process importance (0..1000) changed; it becomes the uid's priority."""
        uid = _uid(uid)
        importance = check_int("importance", importance, MIN_PRIORITY, MAX_PRIORITY)
        if uid in _PINNED:
            return []
        self._begin(now_ms)
        old_rank = self.rank(uid)
        self._priority[uid] = importance
        self._relay([uid])
        if self.rank(uid) != old_rank:
            self._policy.rank_changed(uid, old_rank)
            self._policy.reevaluate()
        return self._finish()

    def set_access(
        self,
        now_ms: int,
        uid: int,
        *,
        has_direct_access: bool | None = None,
        can_attribute_other_uid: bool | None = None,
    ) -> list[Action]:
        """Override what a uid's scheduling config allows; None keeps the current value.

        Root and the system uid keep direct access and attribution whatever is asked.
        """
        uid = _uid(uid)
        for name, value in (
            ("has_direct_access", has_direct_access),
            ("can_attribute_other_uid", can_attribute_other_uid),
        ):
            if value is not None and not isinstance(value, bool):
                raise IllegalArgumentError(f"{name} must be true, false or None; got {value!r}")
        if uid in _PINNED:
            return []
        current = self.scheduling_config(uid)
        self._begin(now_ms)
        self._access[uid] = (
            current.has_direct_access if has_direct_access is None else has_direct_access,
            current.can_attribute_other_uid
            if can_attribute_other_uid is None
            else can_attribute_other_uid,
        )
        self._relay([uid])
        return self._finish()

    def client_died(self, now_ms: int, client: int) -> list[Action]:
        """A client is gone: its loaded models are revoked and all its requests end."""
        entries = list(self._by_client.get(client, {}).values())
        self._begin(now_ms)
        for entry in entries:
            if entry.state in _REVOKED_ON_DEATH:
                self._out.append(Revoke(entry.key, entry.request, UnloadReason.CLIENT_UNRESPONSIVE))
                self._end(entry, ModelLoadRequestStatus.COMPLETE)
            else:
                self._end(entry, ModelLoadRequestStatus.CANCELLED)
        if entries:
            self._policy.reevaluate()
        return self._finish()

    def work_ended(self, now_ms: int, uid: int, reason: EndReason) -> list[Action]:
        """The driver reports a uid's work ended; a completion feeds the tie-break."""
        uid = _uid(uid)
        try:
            reason = EndReason(reason)
        except ValueError:
            allowed = ", ".join(f"{r.name}={r.value}" for r in EndReason)
            raise IllegalArgumentError(f"reason must be one of {allowed}; got {reason!r}") from None
        self._begin(now_ms)
        if reason is EndReason.COMPLETED:
            old_rank = self.rank(uid)
            self._last_completed[uid] = now_ms
            if self.rank(uid) != old_rank:
                self._policy.rank_changed(uid, old_rank)
            self._policy.work_completed(uid)
        return self._finish()

    def set_policy(self, now_ms: int, policy: Policy) -> list[Action]:
        """Swap the policy; live requests carry over and are re-evaluated under the new one."""
        if policy is not self._policy:
            self._check_policy(policy)
        self._begin(now_ms)
        self._policy.detach()
        self._policy = policy
        policy.attach(self._ctx)
        self._ctx.refresh_configs()
        policy.reevaluate(UnloadReason.POLICY_CHANGE)
        return self._finish()

    def tick(self, now_ms: int) -> list[Action]:
        """Revoke the models of clients that ignored an unload request past the grace period."""
        self._begin(now_ms)
        expired = False
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_ms:
            deadline = heapq.heappop(deadlines)
            if not self._deadline_live(deadline):
                continue
            key = deadline[2]
            entry = self._entries[key]
            self._out.append(Revoke(key, entry.request, UnloadReason.CLIENT_UNRESPONSIVE))
            self._end(entry, ModelLoadRequestStatus.COMPLETE)
            expired = True
        if expired:
            self._policy.reevaluate()
        return self._finish()

    def connect_driver(self) -> list[Action]:
        """Every known uid's scheduling config, replacing whatever the driver held."""
        configs = tuple(self._configs[uid] for uid in sorted(self._configs))
        return [RelayConfigs(configs, replace_all=True)]

    def set_thermal(self, now_ms: int, device: int, severity: ThermalSeverity) -> list[Action]:
        """A device's thermal severity changed (acted on by the `pressure` policy)."""
        device = check_int("device", device, 0, MAX_DEVICES - 1)
        try:
            severity = ThermalSeverity(severity)
        except ValueError:
            allowed = ", ".join(f"{s.name}={s.value}" for s in ThermalSeverity)
            raise IllegalArgumentError(
                f"severity must be one of {allowed}; got {severity!r}"
            ) from None
        self._begin(now_ms)
        if self._thermal.get(device, ThermalSeverity.NONE) is not severity:
            self._thermal[device] = severity
            self._thermal_max = max(self._thermal.values())
            self._policy.pressure_changed()
        return self._finish()

    def set_memory_pressure(self, now_ms: int, level: int) -> list[Action]:
        """System memory pressure: 0 none, 1 moderate, 2 critical."""
        level = check_int(
            "memory pressure level", level, MEMORY_PRESSURE_NONE, MEMORY_PRESSURE_CRITICAL
        )
        self._begin(now_ms)
        if level != self._memory_pressure:
            self._memory_pressure = level
            self._policy.pressure_changed()
        return self._finish()

    def set_capacity(
        self, device_capacities_bytes: Sequence[int], *, now_ms: int | None = None
    ) -> list[Action]:
        """The driver's weight memory per device, in bytes (device 0 first)."""
        if isinstance(device_capacities_bytes, str | bytes) or not isinstance(
            device_capacities_bytes, Sequence
        ):
            raise IllegalArgumentError(
                f"device capacities must be a sequence of ints; got {device_capacities_bytes!r}"
            )
        if not 1 <= len(device_capacities_bytes) <= MAX_DEVICES:
            raise IllegalArgumentError(
                f"device capacities must list 1..{MAX_DEVICES} devices; "
                f"got {len(device_capacities_bytes)}"
            )
        capacities = tuple(
            check_int(f"capacity of device {i}", c, 0, INT64_MAX)
            for i, c in enumerate(device_capacities_bytes)
        )
        self._begin(self._now if now_ms is None else now_ms)
        if capacities != self._capacities:
            self._capacities = capacities
            self._policy.pressure_changed()
        return self._finish()

    # ---------------------------------------------------------------- queries

    def next_deadline_ms(self) -> int | None:
        """When `tick` next has something to do, or None (every input leaves a live one first)."""
        return self._deadlines[0][0] if self._deadlines else None

    def state_of(self, client: int, request_id: int) -> RequestState:
        """Where a live request stands; `UnknownRequestError` if it is not live."""
        return self._live(client, request_id).state

    def declared_bytes(self, client: int, request_id: int) -> int | None:
        """The weight bytes a live request declared when it asked, or None."""
        return self._live(client, request_id).weight_bytes

    def requests(self) -> list[RequestInfo]:
        """Every live request, in arrival order."""
        weight = self._policy.weight
        return [
            RequestInfo(e.key, e.uid, e.request, e.state, weight(e), e.weight_bytes, e.device)
            for e in self._entries.values()
        ]

    def uid_priority(self, uid: int) -> int:
        """The uid's priority: pinned for root and system, 1000 for uids never ranked."""
        if uid in _PINNED:
            return PINNED_PRIORITY
        return self._priority.get(uid, UNKNOWN_UID_PRIORITY)

    def rank(self, uid: int) -> Rank:
        """(priority, last completion ms, uid): the order policies rank uids by."""
        return (self.uid_priority(uid), self._last_completed.get(uid, 0), uid)

    @property
    def policy(self) -> Policy:
        """The policy in force (its `name` and `params` describe it)."""
        return self._policy

    @property
    def memory_pressure(self) -> int:
        """The last memory pressure level given: 0 none, 1 moderate, 2 critical."""
        return self._memory_pressure

    @property
    def capacities(self) -> tuple[int, ...] | None:
        """The driver's weight memory per device, once given."""
        return self._capacities

    def thermal(self, device: int) -> ThermalSeverity:
        """The last thermal severity given for the device."""
        return self._thermal.get(device, ThermalSeverity.NONE)

    def scheduling_configs(self) -> list[SchedulingConfig]:
        """Every config the driver holds, by uid."""
        return [self._configs[uid] for uid in sorted(self._configs)]

    def scheduling_config(self, uid: int) -> SchedulingConfig:
        """The config the driver holds (or would hold) for the uid."""
        return self._configs.get(uid) or self._config_for(uid)

    # --------------------------------------------------------------- private

    def _check_policy(self, policy: Policy) -> None:
        if not isinstance(policy, Policy):
            raise IllegalArgumentError(f"policy must be a Policy; got {policy!r}")
        if policy.attached:
            raise IllegalArgumentError(
                f"policy {policy.name!r} is already in use by an arbiter; build a new one"
            )

    def _begin(self, now_ms: int) -> None:
        self._now = now_ms
        self._out = []

    def _finish(self) -> list[Action]:
        deadlines = self._deadlines
        while deadlines and not self._deadline_live(deadlines[0]):
            heapq.heappop(deadlines)
        out = self._out
        self._out = []
        return out

    def _deadline_live(self, deadline: tuple[int, int, RequestKey]) -> bool:
        _, seq, key = deadline
        entry = self._entries.get(key)
        return entry is not None and entry.seq == seq and entry.state is RequestState.UNLOADING

    def _live(self, client: int, request_id: int) -> Entry:
        entry = self._entries.get(RequestKey(client, request_id))
        if entry is None:
            raise UnknownRequestError(f"client {client} has no live request with id {request_id}")
        return entry

    def _move(self, entry: Entry, state: RequestState, device: int | None) -> None:
        old_state, old_device = entry.state, entry.device
        entry.state = state
        entry.device = device
        if state is not RequestState.UNLOADING:
            entry.unload_deadline_ms = None
        self._policy.moved(entry, old_state, old_device)

    def _end(self, entry: Entry, status: ModelLoadRequestStatus) -> None:
        key = entry.key
        del self._entries[key]
        by_uid = self._by_uid[entry.uid]
        del by_uid[key]
        if not by_uid:
            del self._by_uid[entry.uid]
        by_client = self._by_client[key.client]
        del by_client[key]
        if not by_client:
            del self._by_client[key.client]
        self._out.append(Complete(key, entry.request, status))
        self._policy.untrack(entry)

    def _known_uids(self) -> Iterator[int]:
        yield from _PINNED
        yield from self.attribution_uids - _PINNED
        yield from (uid for uid in self._priority if uid not in self.attribution_uids)
        yield from (
            uid
            for uid in self._access
            if uid not in self._priority and uid not in self.attribution_uids
        )

    def _config_for(self, uid: int) -> SchedulingConfig:
        priority = self.uid_priority(uid)
        app, low, high = self._policy.config_override(uid, priority) or (
            priority,
            MIN_PRIORITY,
            MAX_PRIORITY,
        )
        direct, attribute = self._access.get(uid, (True, uid in self.attribution_uids))
        return SchedulingConfig(
            uid=uid,
            app_priority=app,
            min_priority=low,
            max_priority=high,
            has_direct_access=direct,
            can_attribute_other_uid=attribute,
        )

    def _relay(self, uids: Iterable[int]) -> None:
        changed = []
        for uid in uids:
            config = self._config_for(uid)
            if self._configs.get(uid) != config:
                self._configs[uid] = config
                changed.append(config)
        if changed:
            self._out.append(RelayConfigs(tuple(changed), replace_all=False))


class _Context:
    """The arbiter as its policy sees it: queries, and verbs that record actions."""

    __slots__ = ("_a",)

    def __init__(self, arbiter: Arbiter) -> None:
        self._a = arbiter

    @property
    def now_ms(self) -> int:
        """The time of the input being handled."""
        return self._a._now

    @property
    def memory_pressure(self) -> int:
        """0 none, 1 moderate, 2 critical."""
        return self._a._memory_pressure

    @property
    def capacities(self) -> tuple[int, ...] | None:
        """Weight memory per device, once reported."""
        return self._a._capacities

    @property
    def thermal_max(self) -> ThermalSeverity:
        """The hottest device's severity."""
        return self._a._thermal_max

    def thermal(self, device: int) -> ThermalSeverity:
        """One device's thermal severity."""
        return self._a._thermal.get(device, ThermalSeverity.NONE)

    def uid_priority(self, uid: int) -> int:
        """The uid's priority."""
        return self._a.uid_priority(uid)

    def rank(self, uid: int) -> Rank:
        """(priority, last completion ms, uid)."""
        return self._a.rank(uid)

    def entries(self) -> Iterable[Entry]:
        """Every live request, in arrival order."""
        return self._a._entries.values()

    def entries_of_uid(self, uid: int) -> Iterable[Entry]:
        """The uid's live requests, in arrival order."""
        return self._a._by_uid.get(uid, {}).values()

    def grant(self, entry: Entry, device: int | None = None) -> None:
        """Tell the request CAN_LOAD_NOW."""
        state = entry.state
        if state is RequestState.GRANTED and entry.device == device:
            return
        if state not in (RequestState.NEW, RequestState.WAITING, RequestState.NOT_PRIORITIZED):
            raise RuntimeError(f"policy bug: cannot grant a request that is {state.value}")
        a = self._a
        a._out.append(CanLoad(entry.key, entry.request, ModelLoadStatus.CAN_LOAD_NOW, device))
        a._move(entry, RequestState.GRANTED, device)

    def wait(self, entry: Entry, device: int | None = None) -> None:
        """Tell the request WAIT_FOR_UNLOAD; a waiting one only moves its reservation."""
        state = entry.state
        a = self._a
        if state is RequestState.WAITING:
            if entry.device != device:
                a._move(entry, state, device)
            return
        if state not in (RequestState.NEW, RequestState.NOT_PRIORITIZED):
            raise RuntimeError(f"policy bug: cannot make a {state.value} request wait")
        a._out.append(CanLoad(entry.key, entry.request, ModelLoadStatus.WAIT_FOR_UNLOAD, device))
        a._move(entry, RequestState.WAITING, device)

    def refuse(self, entry: Entry) -> None:
        """Tell the request NOT_PRIORITIZED."""
        state = entry.state
        if state is RequestState.NOT_PRIORITIZED:
            return
        if state not in (RequestState.NEW, RequestState.WAITING, RequestState.GRANTED):
            raise RuntimeError(f"policy bug: cannot refuse a request that is {state.value}")
        a = self._a
        a._out.append(CanLoad(entry.key, entry.request, ModelLoadStatus.NOT_PRIORITIZED))
        a._move(entry, RequestState.NOT_PRIORITIZED, None)

    def ask_unload(self, entry: Entry, reason: UnloadReason) -> None:
        """Ask a loaded request to unload; it is revoked if still unloading at the deadline."""
        state = entry.state
        if state is RequestState.UNLOADING:
            return
        if state is not RequestState.LOADED:
            raise RuntimeError(f"policy bug: cannot ask a {state.value} request to unload")
        a = self._a
        a._out.append(RequestUnload(entry.key, entry.request, reason))
        deadline = a._now + a.unload_grace_ms
        entry.unload_deadline_ms = deadline
        heapq.heappush(a._deadlines, (deadline, entry.seq, entry.key))
        a._move(entry, RequestState.UNLOADING, entry.device)

    def cancel(self, entry: Entry) -> None:
        """End the request with CANCELLED."""
        self._a._end(entry, ModelLoadRequestStatus.CANCELLED)

    def refresh_configs(self) -> None:
        """Relay every known uid's config that differs from what was last relayed."""
        self._a._relay(sorted(self._a._known_uids()))
