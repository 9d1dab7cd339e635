"""Random clients against the arbiter, every policy: invariants after every step.

Checked after every input: committed weight within the budget (bytes within each
device's capacity under `pressure`), every request live or completed exactly once, and
each request's callbacks in a legal order with no redundant repeats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from npumanager.core.arbiter.actions import (
    Action,
    CanLoad,
    Complete,
    RelayConfigs,
    RequestKey,
    RequestState,
    RequestUnload,
    Revoke,
)
from npumanager.core.arbiter.arbiter import Arbiter
from npumanager.core.arbiter.policy import Policy
from npumanager.errors import (
    DuplicateRequestError,
    IllegalArgumentError,
    RequestStateError,
    UnknownRequestError,
)
from npumanager.plugins.policies.budget import BudgetPolicy, budget, turn_taking
from npumanager.plugins.policies.pressure import PressurePolicy, pressure
from npumanager.plugins.policies.status_quo import status_quo
from npumanager.schemas import (
    EndReason,
    Importance,
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    ModelPriority,
    ModelSize,
    ThermalSeverity,
)
from npumanager.schemas.limits import GIB

GRACE_MS = 1000
CLIENT_UIDS = {1: 10001, 2: 10002, 3: 10003, 4: 10003, 5: 10004, 6: 0}
FACTORIES: dict[str, Callable[[], Policy]] = {
    "status_quo": lambda: status_quo(None),
    "turn_taking": lambda: turn_taking(None),
    "budget": lambda: budget(None),
    "budget-wide": lambda: budget({"weights": [1, 2, 3], "max_budget": 6}),
    "pressure": lambda: pressure({"capacity_bytes": [4 * GIB, 3 * GIB]}),
}
STATUS_STATE = {
    ModelLoadStatus.CAN_LOAD_NOW: RequestState.GRANTED,
    ModelLoadStatus.WAIT_FOR_UNLOAD: RequestState.WAITING,
    ModelLoadStatus.NOT_PRIORITIZED: RequestState.NOT_PRIORITIZED,
}


@dataclass
class Tracked:
    """What the test knows of one request instance from the actions it was sent."""

    serial: int
    state: RequestState = RequestState.NEW
    unload_requests: int = 0
    unload_asked_ms: int | None = None
    history: list[str] = field(default_factory=list)


class ArbiterMachine(RuleBasedStateMachine):
    """Drives one arbiter with random clients; subclasses pick the starting policy."""

    start = "budget"

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.arbiter = Arbiter(FACTORIES[self.start](), unload_grace_ms=GRACE_MS)
        self.live: dict[RequestKey, Tracked] = {}
        self.completed: list[RequestKey] = []
        self.completed_serials: list[int] = []
        self.serials = 0
        self.legacy: set[RequestKey] = set()
        """Unloading requests a swap or a capacity change left over the new limit."""

    # ------------------------------------------------------------ plumbing

    def feed(self, actions: list[Action]) -> None:
        for index, action in enumerate(actions):
            if isinstance(action, RelayConfigs):
                assert not action.replace_all
                continue
            tracked = self.live.get(action.key)
            assert tracked is not None, f"{action} for a request that is not live"
            state = tracked.state
            tracked.history.append(type(action).__name__)
            if isinstance(action, CanLoad):
                new = STATUS_STATE[action.status]
                assert state in (
                    RequestState.NEW,
                    RequestState.GRANTED,
                    RequestState.WAITING,
                    RequestState.NOT_PRIORITIZED,
                ), f"{action.status.name} to a {state.value} request"
                assert new is not state, f"redundant {action.status.name}"
                assert state is not RequestState.GRANTED or new is RequestState.NOT_PRIORITIZED
                if isinstance(self.arbiter.policy, PressurePolicy) and new is not (
                    RequestState.NOT_PRIORITIZED
                ):
                    assert action.device is not None
                    assert 0 <= action.device < len(self.arbiter.policy.capacities())
                tracked.state = new
            elif isinstance(action, RequestUnload):
                assert state is RequestState.LOADED, f"unload request to a {state.value} one"
                tracked.unload_requests += 1
                tracked.unload_asked_ms = self.now
                tracked.state = RequestState.UNLOADING
            elif isinstance(action, Revoke):
                assert state in (RequestState.LOADED, RequestState.UNLOADING)
                following = actions[index + 1]
                assert isinstance(following, Complete) and following.key == action.key
            else:
                assert isinstance(action, Complete)
                del self.live[action.key]
                self.completed_serials.append(tracked.serial)
                self.legacy.discard(action.key)
                self.completed.append(action.key)

    def weight_of(self, key: RequestKey) -> int:
        return next(i.weight for i in self.arbiter.requests() if i.key == key)

    def mark_legacy(self) -> None:
        self.legacy = {
            info.key for info in self.arbiter.requests() if info.state is RequestState.UNLOADING
        }

    # --------------------------------------------------------------- rules

    @initialize(grace=st.sampled_from([GRACE_MS]))
    def begin(self, grace: int) -> None:
        assert self.arbiter.unload_grace_ms == grace

    @rule(
        advance=st.integers(0, 400),
        client=st.sampled_from(sorted(CLIENT_UIDS)),
        request_id=st.integers(0, 4),
        size=st.sampled_from(ModelSize),
        priority=st.sampled_from(ModelPriority),
        weight_bytes=st.one_of(st.none(), st.integers(1, 5 * GIB)),
    )
    def request(
        self,
        advance: int,
        client: int,
        request_id: int,
        size: ModelSize,
        priority: ModelPriority,
        weight_bytes: int | None,
    ) -> None:
        self.now += advance
        key = RequestKey(client, request_id)
        request = ModelLoadRequest(id=request_id, size=size, priority=priority)
        if key in self.live:
            with pytest.raises(DuplicateRequestError, match=f"id {request_id}"):
                self.arbiter.request(
                    self.now, client, CLIENT_UIDS[client], request, weight_bytes=weight_bytes
                )
            return
        self.serials += 1
        self.live[key] = Tracked(self.serials)
        actions = self.arbiter.request(
            self.now, client, CLIENT_UIDS[client], request, weight_bytes=weight_bytes
        )
        decision = [a for a in actions if isinstance(a, CanLoad) and a.key == key]
        assert len(decision) == 1 and actions[-1] == decision[0], "one decision, last"
        self.feed(actions)

    @rule(
        advance=st.integers(0, 100),
        client=st.sampled_from(sorted(CLIENT_UIDS)),
        request_id=st.integers(0, 4),
        size=st.sampled_from(ModelSize),
    )
    def request_normal(self, advance: int, client: int, request_id: int, size: ModelSize) -> None:
        self.request(advance, client, request_id, size, ModelPriority.NORMAL, None)

    def _pick(self, data: st.DataObject, states: set[RequestState] | None = None) -> RequestKey:
        keys = sorted(k for k, t in self.live.items() if states is None or t.state in states)
        return data.draw(st.sampled_from(keys))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        key = self._pick(data)
        self.feed(self.arbiter.cancel(self.now, key.client, key.request_id))
        assert self.completed[-1] == key or key not in self.live

    @precondition(lambda self: any(t.state is RequestState.GRANTED for t in self.live.values()))
    @rule(data=st.data())
    def load(self, data: st.DataObject) -> None:
        key = self._pick(data, {RequestState.GRANTED})
        assert self.arbiter.notify_loaded(self.now, key.client, key.request_id) == []
        self.live[key].state = RequestState.LOADED

    @precondition(lambda self: any(t.state is RequestState.GRANTED for t in self.live.values()))
    @rule(data=st.data())
    def load_again(self, data: st.DataObject) -> None:
        self.load(data)

    @precondition(lambda self: any(t.state is RequestState.UNLOADING for t in self.live.values()))
    @rule(data=st.data())
    def obey_unload_request(self, data: st.DataObject) -> None:
        key = self._pick(data, {RequestState.UNLOADING})
        self.feed(self.arbiter.notify_unloaded(self.now, key.client, key.request_id))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def unload(self, data: st.DataObject) -> None:
        key = self._pick(data)
        state = self.live[key].state
        if state in (RequestState.GRANTED, RequestState.LOADED, RequestState.UNLOADING):
            actions = self.arbiter.notify_unloaded(self.now, key.client, key.request_id)
            assert actions[0] == Complete(key, actions[0].request, ModelLoadRequestStatus.COMPLETE)  # type: ignore[union-attr]
            self.feed(actions)
        else:
            with pytest.raises(RequestStateError, match=state.value):
                self.arbiter.notify_unloaded(self.now, key.client, key.request_id)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def load_out_of_turn(self, data: st.DataObject) -> None:
        key = self._pick(data)
        if self.live[key].state is not RequestState.GRANTED:
            with pytest.raises(RequestStateError):
                self.arbiter.notify_loaded(self.now, key.client, key.request_id)

    @rule(client=st.sampled_from(sorted(CLIENT_UIDS)), request_id=st.integers(5, 6))
    def unknown(self, client: int, request_id: int) -> None:
        with pytest.raises(UnknownRequestError):
            self.arbiter.cancel(self.now, client, request_id)

    @rule(advance=st.integers(0, 2 * GRACE_MS))
    def tick(self, advance: int) -> None:
        self.now += advance
        self.feed(self.arbiter.tick(self.now))
        deadline = self.arbiter.next_deadline_ms()
        assert deadline is None or deadline > self.now
        for tracked in self.live.values():
            if tracked.state is RequestState.UNLOADING:
                assert tracked.unload_asked_ms is not None
                assert tracked.unload_asked_ms + GRACE_MS > self.now

    @rule(uid=st.sampled_from(sorted(set(CLIENT_UIDS.values()))), importance=st.integers(-5, 1005))
    def importance(self, uid: int, importance: int) -> None:
        if not 0 <= importance <= 1000:
            before = self.arbiter.scheduling_configs()
            with pytest.raises(IllegalArgumentError, match="importance must be within"):
                self.arbiter.set_importance(self.now, uid, importance)
            assert self.arbiter.scheduling_configs() == before
            return
        self.feed(self.arbiter.set_importance(self.now, uid, importance))

    @rule(uid=st.sampled_from([10001, 10003]), importance=st.sampled_from(Importance))
    def importance_named(self, uid: int, importance: Importance) -> None:
        self.feed(self.arbiter.set_importance(self.now, uid, importance))

    @rule(client=st.sampled_from(sorted(CLIENT_UIDS)))
    def die(self, client: int) -> None:
        before = {k for k in self.live if k.client == client}
        self.feed(self.arbiter.client_died(self.now, client))
        assert not any(k.client == client for k in self.live)
        assert before <= set(self.completed)

    @rule(
        advance=st.integers(0, 50),
        uid=st.sampled_from(sorted(set(CLIENT_UIDS.values()))),
        reason=st.sampled_from([EndReason.COMPLETED, *EndReason]),
    )
    def work(self, advance: int, uid: int, reason: EndReason) -> None:
        self.now += advance
        self.feed(self.arbiter.work_ended(self.now, uid, reason))

    @rule(device=st.integers(0, 1), severity=st.sampled_from(ThermalSeverity))
    def thermal(self, device: int, severity: ThermalSeverity) -> None:
        self.feed(self.arbiter.set_thermal(self.now, device, severity))

    @rule(level=st.integers(0, 2))
    def memory(self, level: int) -> None:
        self.feed(self.arbiter.set_memory_pressure(self.now, level))

    @rule(
        rare=st.integers(0, 5),
        capacities=st.lists(st.integers(0, 6 * GIB), min_size=1, max_size=3),
    )
    def capacity(self, rare: int, capacities: list[int]) -> None:
        if rare:
            return
        self.feed(self.arbiter.set_capacity(self.now, capacities))
        self.mark_legacy()

    @rule(rare=st.integers(0, 3), name=st.sampled_from(sorted(FACTORIES)))
    def swap(self, rare: int, name: str) -> None:
        if rare:
            return
        self.feed(self.arbiter.set_policy(self.now, FACTORIES[name]()))
        self.mark_legacy()

    # ----------------------------------------------------------- invariants

    @invariant()
    def every_request_live_or_completed_once(self) -> None:
        infos = self.arbiter.requests()
        assert {i.key: i.state for i in infos} == {k: t.state for k, t in self.live.items()}
        assert len(set(self.completed_serials)) == len(self.completed_serials)
        live_serials = {t.serial for t in self.live.values()}
        assert live_serials.isdisjoint(self.completed_serials)
        assert len(live_serials) + len(self.completed_serials) == self.serials

    @invariant()
    def at_most_one_unload_request_each(self) -> None:
        assert all(t.unload_requests <= 1 for t in self.live.values())

    @invariant()
    def committed_within_limit(self) -> None:
        policy = self.arbiter.policy
        infos = self.arbiter.requests()
        committed = (RequestState.GRANTED, RequestState.LOADED, RequestState.UNLOADING)
        if isinstance(policy, BudgetPolicy):
            used = sum(i.weight for i in infos if i.state in committed and i.key not in self.legacy)
            assert used <= policy.max_budget
            assert policy.committed_weight == sum(i.weight for i in infos if i.state in committed)
        elif isinstance(policy, PressurePolicy):
            for device, capacity in enumerate(policy.capacities()):
                used = sum(
                    i.weight
                    for i in infos
                    if i.state in committed
                    and (i.device or 0) == device
                    and i.key not in self.legacy
                )
                assert used <= capacity, f"device {device}"

    @invariant()
    def configs_follow_priorities(self) -> None:
        for uid in set(CLIENT_UIDS.values()):
            config = self.arbiter.scheduling_config(uid)
            held_back = config.min_priority == config.max_priority == config.app_priority == 1000
            assert config.app_priority == self.arbiter.uid_priority(uid) or held_back


SETTINGS = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _machine(start: str) -> type[ArbiterMachine]:
    return type(f"ArbiterMachine_{start}", (ArbiterMachine,), {"start": start})


TestStatusQuo = _machine("status_quo").TestCase
TestTurnTaking = _machine("turn_taking").TestCase
TestBudget = _machine("budget").TestCase
TestPressure = _machine("pressure").TestCase
for _case in (TestStatusQuo, TestTurnTaking, TestBudget, TestPressure):
    _case.settings = SETTINGS
del _case
