"""The pressure policy: bytes per device, placement, opportunistic loads, thermal, memory."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.arbiter import kinds
from npumanager.core.arbiter.actions import CanLoad, RelayConfigs, RequestKey, RequestState
from npumanager.core.arbiter.arbiter import Arbiter
from npumanager.plugins.policies.budget import budget
from npumanager.plugins.policies.pressure import PressurePolicy, pressure
from npumanager.schemas import (
    Importance,
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    ModelPriority,
    ModelSize,
    SchedulingConfig,
    ThermalSeverity,
    UnloadReason,
)
from npumanager.schemas.limits import GIB, NOMINAL_MODEL_BYTES

CAN_LOAD_NOW = ModelLoadStatus.CAN_LOAD_NOW
WAIT = ModelLoadStatus.WAIT_FOR_UNLOAD
NOT_PRIORITIZED = ModelLoadStatus.NOT_PRIORITIZED
COMPLETE = ModelLoadRequestStatus.COMPLETE
NORMAL, BACKGROUND, OPPORTUNISTIC = ModelPriority
F, S, V, B, G = 10_001, 10_002, 10_003, 10_004, 10_005
"""Foreground, foreground service, visible, cached (background) and gone uids."""
IMPORTANCE = {
    F: Importance.FOREGROUND,
    S: Importance.FOREGROUND_SERVICE,
    V: Importance.VISIBLE,
    B: Importance.CACHED,
    G: Importance.GONE,
}


def make(*capacities: int, **params: Any) -> Arbiter:
    arbiter = Arbiter(pressure({"capacity_bytes": list(capacities), **params}))
    for uid, importance in IMPORTANCE.items():
        arbiter.set_importance(0, uid, importance)
    return arbiter


def req(
    request_id: int, priority: ModelPriority = NORMAL, size: ModelSize = ModelSize.LESS_THAN_1GB
) -> ModelLoadRequest:
    return ModelLoadRequest(id=request_id, size=size, priority=priority)


def ask(
    arbiter: Arbiter,
    uid: int,
    request_id: int,
    gib: float,
    priority: ModelPriority = NORMAL,
    *,
    load: bool = False,
) -> list[tuple[Any, ...]]:
    """A request of `gib` GiB from the uid (client number = uid); optionally loaded."""
    actions = arbiter.request(0, uid, uid, req(request_id, priority), weight_bytes=int(gib * GIB))
    if load:
        arbiter.notify_loaded(0, uid, request_id)
    return kinds(actions)


def device_of(arbiter: Arbiter, uid: int, request_id: int) -> int | None:
    return next(i.device for i in arbiter.requests() if i.key == RequestKey(uid, request_id))


def test_weight_is_the_given_bytes_else_the_nominal_size() -> None:
    arbiter = make(16 * GIB)
    arbiter.request(0, F, F, req(1), weight_bytes=1234)
    for request_id, size in enumerate(ModelSize, start=2):
        arbiter.request(0, F, F, ModelLoadRequest(id=request_id, size=size))
    assert [i.weight for i in arbiter.requests()] == [1234, *NOMINAL_MODEL_BYTES]
    assert NOMINAL_MODEL_BYTES == (GIB, 2 * GIB, 4 * GIB)


def test_each_grant_is_placed_on_the_tightest_device_with_room() -> None:
    arbiter = make(4 * GIB, 2 * GIB)
    actions = arbiter.request(0, F, F, req(1), weight_bytes=3 * GIB // 2)
    assert actions == [CanLoad(RequestKey(F, 1), req(1), CAN_LOAD_NOW, device=1)]
    ask(arbiter, F, 2, 2)
    assert device_of(arbiter, F, 2) == 0
    assert ask(arbiter, F, 3, 3) == [("can_load", F, 3, NOT_PRIORITIZED)]
    assert ask(arbiter, F, 4, 5) == [("can_load", F, 4, NOT_PRIORITIZED)]
    arbiter.cancel(1, F, 2)
    assert device_of(arbiter, F, 3) == 0
    assert arbiter.state_of(F, 3) is RequestState.GRANTED


def test_driver_capacity_replaces_the_params_and_a_shrink_asks_for_unloads() -> None:
    arbiter = make(2 * GIB)
    ask(arbiter, F, 1, 2, load=True)
    ask(arbiter, V, 2, 2)
    assert arbiter.state_of(V, 2) is RequestState.NOT_PRIORITIZED
    assert kinds(arbiter.set_capacity(1, [2 * GIB, 4 * GIB])) == [("can_load", V, 2, CAN_LOAD_NOW)]
    assert device_of(arbiter, V, 2) == 1
    arbiter.notify_loaded(1, V, 2)
    assert arbiter.set_capacity(1, [2 * GIB, 4 * GIB]) == []
    assert kinds(arbiter.set_capacity(1, [4 * GIB])) == [
        ("unload", V, 2, UnloadReason.HIGHER_PRIORITY_REQUEST)
    ]
    assert isinstance(arbiter.policy, PressurePolicy)
    assert arbiter.policy.capacities() == (4 * GIB,)


def test_a_more_important_request_evicts_a_lesser_model_and_waits_on_its_device() -> None:
    arbiter = make(4 * GIB, 1 * GIB)
    ask(arbiter, B, 1, 4, load=True)
    assert ask(arbiter, F, 2, 3) == [
        ("unload", B, 1, UnloadReason.HIGHER_PRIORITY_REQUEST),
        ("can_load", F, 2, WAIT),
    ]
    assert device_of(arbiter, F, 2) == 0
    actions = arbiter.notify_unloaded(1, B, 1)
    assert kinds(actions) == [("complete", B, 1, COMPLETE), ("can_load", F, 2, CAN_LOAD_NOW)]
    assert actions[1].device == 0  # type: ignore[union-attr]


def test_a_granted_victim_is_refused_not_cancelled_and_comes_back() -> None:
    arbiter = make(4 * GIB)
    ask(arbiter, B, 1, 3)
    assert ask(arbiter, F, 2, 2) == [
        ("can_load", B, 1, NOT_PRIORITIZED),
        ("can_load", F, 2, CAN_LOAD_NOW),
    ]
    assert kinds(arbiter.cancel(1, F, 2)) == [
        ("complete", F, 2, ModelLoadRequestStatus.CANCELLED),
        ("can_load", B, 1, CAN_LOAD_NOW),
    ]


def test_opportunistic_loads_only_from_spare_room_and_go_first() -> None:
    arbiter = make(4 * GIB)
    ask(arbiter, F, 1, 3, load=True)
    assert ask(arbiter, F, 2, 2, OPPORTUNISTIC) == [("can_load", F, 2, NOT_PRIORITIZED)]
    assert ask(arbiter, F, 3, 1, OPPORTUNISTIC, load=True) == [("can_load", F, 3, CAN_LOAD_NOW)]
    assert ask(arbiter, G, 4, 1) == [
        ("unload", F, 3, UnloadReason.HIGHER_PRIORITY_REQUEST),
        ("can_load", G, 4, WAIT),
    ]
    assert kinds(arbiter.notify_unloaded(1, F, 3)) == [
        ("complete", F, 3, COMPLETE),
        ("can_load", G, 4, CAN_LOAD_NOW),
    ]
    arbiter.notify_loaded(1, G, 4)
    assert ask(arbiter, F, 5, 1, OPPORTUNISTIC) == [("can_load", F, 5, NOT_PRIORITIZED)]
    assert kinds(arbiter.notify_unloaded(2, G, 4)) == [
        ("complete", G, 4, COMPLETE),
        ("can_load", F, 5, CAN_LOAD_NOW),
    ]


def test_an_opportunistic_request_is_never_told_to_wait() -> None:
    arbiter = make(4 * GIB)
    ask(arbiter, B, 1, 4, load=True)
    ask(arbiter, F, 2, 4)
    assert arbiter.state_of(F, 2) is RequestState.WAITING
    assert ask(arbiter, F, 3, 1, OPPORTUNISTIC) == [("can_load", F, 3, NOT_PRIORITIZED)]
    arbiter.cancel(1, F, 2)
    assert arbiter.state_of(F, 3) is RequestState.NOT_PRIORITIZED


def test_moderate_heat_unloads_opportunistic_then_background_models() -> None:
    arbiter = make(4 * GIB)
    ask(arbiter, B, 1, 1, NORMAL, load=True)
    ask(arbiter, B, 2, 1, BACKGROUND, load=True)
    ask(arbiter, B, 3, 1, OPPORTUNISTIC, load=True)
    assert arbiter.set_thermal(1, 0, ThermalSeverity.LIGHT) == []
    assert kinds(arbiter.set_thermal(2, 0, ThermalSeverity.MODERATE)) == [
        ("unload", B, 3, UnloadReason.THERMAL),
        ("unload", B, 2, UnloadReason.THERMAL),
    ]
    assert ask(arbiter, B, 4, 1, BACKGROUND) == [("can_load", B, 4, NOT_PRIORITIZED)]
    assert ask(arbiter, B, 5, 1, NORMAL) == [("can_load", B, 5, CAN_LOAD_NOW)]
    arbiter.notify_unloaded(3, B, 2)
    arbiter.notify_unloaded(3, B, 3)
    assert arbiter.state_of(B, 4) is RequestState.NOT_PRIORITIZED
    assert kinds(arbiter.set_thermal(4, 0, ThermalSeverity.NONE)) == [
        ("can_load", B, 4, CAN_LOAD_NOW)
    ]


def test_a_hot_device_sends_new_background_models_to_a_cool_one() -> None:
    arbiter = make(4 * GIB, 4 * GIB)
    arbiter.set_thermal(0, 0, ThermalSeverity.MODERATE)
    ask(arbiter, B, 1, 1, BACKGROUND)
    assert device_of(arbiter, B, 1) == 1
    ask(arbiter, B, 2, 1, NORMAL)
    assert device_of(arbiter, B, 2) in (0, 1)
    arbiter.notify_loaded(1, B, 1)
    assert kinds(arbiter.set_thermal(2, 1, ThermalSeverity.MODERATE)) == [
        ("unload", B, 1, UnloadReason.THERMAL)
    ]


def test_severe_heat_holds_back_background_uids_and_restores_them() -> None:
    arbiter = make(4 * GIB)
    held_back = {
        uid: SchedulingConfig(uid=uid, app_priority=1000, min_priority=1000, max_priority=1000)
        for uid in (B, G)
    }
    assert arbiter.set_thermal(1, 0, ThermalSeverity.SEVERE) == [
        RelayConfigs((held_back[B], held_back[G]), replace_all=False)
    ]
    relayed = arbiter.connect_driver()[0]
    assert isinstance(relayed, RelayConfigs)
    by_uid = {c.uid: c for c in relayed.configs}
    assert by_uid[B] == held_back[B]
    assert by_uid[F] == SchedulingConfig(uid=F, app_priority=100)
    assert by_uid[V] == SchedulingConfig(uid=V, app_priority=200)
    assert arbiter.set_importance(2, B, Importance.GONE) == []
    assert arbiter.set_importance(3, G, Importance.VISIBLE) == [
        RelayConfigs((SchedulingConfig(uid=G, app_priority=200),), replace_all=False)
    ]
    assert arbiter.set_thermal(4, 0, ThermalSeverity.CRITICAL) == []
    assert arbiter.set_thermal(5, 0, ThermalSeverity.MODERATE) == [
        RelayConfigs((SchedulingConfig(uid=B, app_priority=1000),), replace_all=False)
    ]


def test_critical_heat_keeps_only_foreground_uids() -> None:
    arbiter = make(8 * GIB)
    ask(arbiter, F, 1, 1, load=True)
    ask(arbiter, S, 2, 1, load=True)
    ask(arbiter, V, 3, 1, load=True)
    ask(arbiter, V, 4, 1)
    assert kinds(arbiter.set_thermal(1, 0, ThermalSeverity.CRITICAL)) == [
        ("relay", (B, G), False),
        ("can_load", V, 4, NOT_PRIORITIZED),
        ("unload", V, 3, UnloadReason.THERMAL),
    ]
    assert ask(arbiter, V, 5, 1) == [("can_load", V, 5, NOT_PRIORITIZED)]
    assert ask(arbiter, F, 6, 1) == [("can_load", F, 6, CAN_LOAD_NOW)]
    assert ask(arbiter, F, 7, 1, BACKGROUND) == [("can_load", F, 7, NOT_PRIORITIZED)]
    assert arbiter.set_thermal(2, 0, ThermalSeverity.SHUTDOWN) == []
    assert arbiter.state_of(S, 2) is RequestState.LOADED


def test_memory_pressure_unloads_opportunistic_then_background_models() -> None:
    arbiter = make(8 * GIB)
    ask(arbiter, B, 1, 1, NORMAL, load=True)
    ask(arbiter, B, 2, 1, BACKGROUND, load=True)
    ask(arbiter, B, 3, 1, OPPORTUNISTIC, load=True)
    assert kinds(arbiter.set_memory_pressure(1, 1)) == [
        ("unload", B, 3, UnloadReason.MEMORY_PRESSURE)
    ]
    assert ask(arbiter, B, 4, 1, OPPORTUNISTIC) == [("can_load", B, 4, NOT_PRIORITIZED)]
    assert kinds(arbiter.set_memory_pressure(2, 2)) == [
        ("unload", B, 2, UnloadReason.MEMORY_PRESSURE)
    ]
    assert arbiter.state_of(B, 1) is RequestState.LOADED
    assert kinds(arbiter.set_memory_pressure(3, 0)) == [("can_load", B, 4, CAN_LOAD_NOW)]


def test_taking_over_from_budget_counts_unplaced_models_on_device_zero() -> None:
    arbiter = Arbiter(budget(None))
    for request_id in range(4):
        arbiter.request(0, B, B, req(request_id))
        arbiter.notify_loaded(0, B, request_id)
    arbiter.request(0, B, B, req(9))
    assert arbiter.state_of(B, 9) is RequestState.NOT_PRIORITIZED
    assert arbiter.set_policy(1, pressure(None)) == []
    assert arbiter.set_capacity(1, [5 * GIB]) == [
        CanLoad(RequestKey(B, 9), req(9), CAN_LOAD_NOW, device=0)
    ]


@pytest.mark.parametrize("severity", list(ThermalSeverity))
def test_every_unload_carries_a_reason(severity: ThermalSeverity) -> None:
    arbiter = make(4 * GIB)
    for request_id, priority in enumerate([NORMAL, BACKGROUND, OPPORTUNISTIC]):
        ask(arbiter, V, request_id, 1, priority, load=True)
    actions = arbiter.set_thermal(1, 0, severity)
    reasons = [a[3] for a in kinds(actions) if a[0] == "unload"]
    assert all(r is UnloadReason.THERMAL for r in reasons)
    expected = 0 if severity < ThermalSeverity.MODERATE else 2
    expected += severity >= ThermalSeverity.CRITICAL
    assert len(reasons) == expected
