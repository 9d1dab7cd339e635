"""The service's decisions: a pure state machine over model-load requests.

No threads, no I/O, no clock: every input carries `now_ms` and returns the actions the
service must perform, in order. Bad input raises an `NpuManagerError` before anything
changes. The requests and their deadlines live in a `Ledger` that moves them only along
the state table (`core.states`); uid priorities and configs in a `UidTable`; the pressure
inputs in `Conditions`. The policy (a `Policy`) decides through the verbs of its context.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from npumanager.checks import check_int
from npumanager.core.arbiter.actions import (
    Action,
    RelayConfigs,
    RequestKey,
    RequestState,
)
from npumanager.core.arbiter.context import ArbiterContext, Conditions
from npumanager.core.arbiter.ledger import Ledger
from npumanager.core.arbiter.policy import Entry, Policy, Rank
from npumanager.core.arbiter.states import Step, allows, described, states_allowing
from npumanager.core.arbiter.uids import PINNED, UidTable
from npumanager.errors import (
    DuplicateRequestError,
    IllegalArgumentError,
    RequestStateError,
    UnknownRequestError,
)
from npumanager.schemas import (
    EndReason,
    ModelLoadRequest,
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
)


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
        self._ledger = Ledger(policy)
        self._seq = 0
        self._uids = UidTable(self.attribution_uids)
        self._conditions = Conditions()
        self._policy = policy
        self._ctx = ArbiterContext(self._ledger, self._conditions, self._uids, self.unload_grace_ms)
        policy.attach(self._ctx)
        for uid in self._uids.known_uids():
            self._uids.configs[uid] = self._uids.config_for(uid, policy)

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
        if key in self._ledger.entries:
            raise DuplicateRequestError.of(request.id)
        self._begin(now_ms)
        self._seq += 1
        entry = Entry(key, uid, request, weight_bytes, self._seq)
        self._ledger.add(entry)
        self._policy.admit(entry)
        if entry.state is RequestState.NEW:
            self._ctx.refuse(entry)
        return self._finish()

    def cancel(self, now_ms: int, client: int, request_id: int) -> list[Action]:
        """The client gives up one of its requests: it ends CANCELLED."""
        entry = self._live(client, request_id)
        self._begin(now_ms)
        self._ledger.end(entry, Step.CANCEL)
        self._policy.reevaluate()
        return self._finish()

    def notify_loaded(self, now_ms: int, client: int, request_id: int) -> list[Action]:
        """The client's model is in driver memory; only a granted request may say so."""
        entry = self._guarded(client, request_id, Step.LOADED, "loaded")
        self._begin(now_ms)
        self._ledger.step(entry, Step.LOADED, entry.device)
        return self._finish()

    def notify_unloaded(self, now_ms: int, client: int, request_id: int) -> list[Action]:
        """The client released its model: the request ends COMPLETE and its share is free."""
        entry = self._guarded(client, request_id, Step.UNLOADED, "unloaded")
        self._begin(now_ms)
        self._ledger.end(entry, Step.UNLOADED)
        self._policy.reevaluate()
        return self._finish()

    def set_importance(self, now_ms: int, uid: int, importance: int) -> list[Action]:
        """A uid's process importance (0..1000) changed; it becomes the uid's priority."""
        uid = _uid(uid)
        importance = check_int("importance", importance, MIN_PRIORITY, MAX_PRIORITY)
        if uid in PINNED:
            return []
        self._begin(now_ms)
        old_rank = self.rank(uid)
        self._uids.priority[uid] = importance
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
        if uid in PINNED:
            return []
        current = self.scheduling_config(uid)
        self._begin(now_ms)
        self._uids.access[uid] = (
            current.has_direct_access if has_direct_access is None else has_direct_access,
            current.can_attribute_other_uid
            if can_attribute_other_uid is None
            else can_attribute_other_uid,
        )
        self._relay([uid])
        return self._finish()

    def client_died(self, now_ms: int, client: int) -> list[Action]:
        """A client is gone: its loaded models are revoked and all its requests end."""
        entries = list(self._ledger.by_client.get(client, {}).values())
        self._begin(now_ms)
        for entry in entries:
            revoke = allows(entry.state, Step.REVOKE)
            self._ledger.end(entry, Step.REVOKE if revoke else Step.CANCEL)
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
            self._uids.last_completed[uid] = now_ms
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
        self._policy = self._ledger.policy = policy
        policy.attach(self._ctx)
        self._ctx.refresh_configs()
        policy.reevaluate(UnloadReason.POLICY_CHANGE)
        return self._finish()

    def tick(self, now_ms: int) -> list[Action]:
        """Revoke the models of clients that ignored an unload request past the grace period."""
        self._begin(now_ms)
        if self._ledger.expire(now_ms):
            self._policy.reevaluate()
        return self._finish()

    def connect_driver(self) -> list[Action]:
        """Every known uid's scheduling config, replacing whatever the driver held."""
        return [RelayConfigs(tuple(self._uids.scheduling_configs()), replace_all=True)]

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
        thermal = self._conditions.thermal
        if thermal.get(device, ThermalSeverity.NONE) is not severity:
            thermal[device] = severity
            self._conditions.thermal_max = max(thermal.values())
            self._policy.pressure_changed()
        return self._finish()

    def set_memory_pressure(self, now_ms: int, level: int) -> list[Action]:
        """System memory pressure: 0 none, 1 moderate, 2 critical."""
        level = check_int(
            "memory pressure level", level, MEMORY_PRESSURE_NONE, MEMORY_PRESSURE_CRITICAL
        )
        self._begin(now_ms)
        if level != self._conditions.memory_pressure:
            self._conditions.memory_pressure = level
            self._policy.pressure_changed()
        return self._finish()

    def set_capacity(self, now_ms: int, device_capacities_bytes: Sequence[int]) -> list[Action]:
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
        self._begin(now_ms)
        if capacities != self._conditions.capacities:
            self._conditions.capacities = capacities
            self._policy.pressure_changed()
        return self._finish()

    # ---------------------------------------------------------------- queries

    def next_deadline_ms(self) -> int | None:
        """When `tick` next has something to do, or None (every input leaves a live one first)."""
        deadlines = self._ledger.deadlines
        return deadlines[0][0] if deadlines else None

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
            for e in self._ledger.entries.values()
        ]

    def uid_priority(self, uid: int) -> int:
        """The uid's priority: pinned for root and system, 1000 for uids never ranked."""
        return self._uids.uid_priority(uid)

    def rank(self, uid: int) -> Rank:
        """(priority, last completion ms, uid): the order policies rank uids by."""
        return self._uids.rank(uid)

    @property
    def policy(self) -> Policy:
        """The policy in force (its `name` and `params` describe it)."""
        return self._policy

    @property
    def memory_pressure(self) -> int:
        """The last memory pressure level given: 0 none, 1 moderate, 2 critical."""
        return self._ctx.memory_pressure

    @property
    def capacities(self) -> tuple[int, ...] | None:
        """The driver's weight memory per device, once given."""
        return self._ctx.capacities

    def thermal(self, device: int) -> ThermalSeverity:
        """The last thermal severity given for the device."""
        return self._ctx.thermal(device)

    def scheduling_configs(self) -> list[SchedulingConfig]:
        """Every config the driver holds, by uid."""
        return self._uids.scheduling_configs()

    def scheduling_config(self, uid: int) -> SchedulingConfig:
        """The config the driver holds (or would hold) for the uid."""
        return self._uids.scheduling_config(uid, self._policy)

    # --------------------------------------------------------------- private

    def _check_policy(self, policy: Policy) -> None:
        if not isinstance(policy, Policy):
            raise IllegalArgumentError(f"policy must be a Policy; got {policy!r}")
        if policy.attached:
            raise IllegalArgumentError(
                f"policy {policy.name!r} is already in use by an arbiter; build a new one"
            )

    def _begin(self, now_ms: int) -> None:
        self._conditions.now_ms = now_ms
        self._ledger.out = []

    def _finish(self) -> list[Action]:
        return self._ledger.take()

    def _guarded(self, client: int, request_id: int, step: Step, what: str) -> Entry:
        """The live request, if `step` is allowed in its state; else a `RequestStateError`."""
        entry = self._live(client, request_id)
        if not allows(entry.state, step):
            raise RequestStateError(
                f"request {request_id} of client {client} is {entry.state.value}; only a "
                f"{described(states_allowing(step))} request can be {what}"
            )
        return entry

    def _live(self, client: int, request_id: int) -> Entry:
        entry = self._ledger.entries.get(RequestKey(client, request_id))
        if entry is None:
            raise UnknownRequestError(f"client {client} has no live request with id {request_id}")
        return entry

    def _relay(self, uids: Iterable[int]) -> None:
        relay = self._uids.relay(uids, self._policy)
        if relay is not None:
            self._ledger.out.append(relay)
