"""The arbiter's interface: acceptance flows, errors, grace period, swaps, priorities."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from helpers.arbiter import BG, BG_CLIENT, FG, FG_CLIENT, big, kinds, ranked, small
from npumanager.core.arbiter.actions import (
    RelayConfigs,
    RequestKey,
    RequestState,
    Revoke,
)
from npumanager.core.arbiter.arbiter import Arbiter, RequestInfo
from npumanager.core.arbiter.policy import Policy
from npumanager.errors import (
    DuplicateRequestError,
    IllegalArgumentError,
    NpuManagerError,
    RequestStateError,
    UnknownRequestError,
)
from npumanager.plugins.policies.budget import budget, turn_taking
from npumanager.plugins.policies.status_quo import status_quo
from npumanager.schemas import (
    EndReason,
    Importance,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    SchedulingConfig,
    ThermalSeverity,
    UnloadReason,
)
from npumanager.schemas.limits import (
    DEFAULT_UNLOAD_GRACE_MS,
    PINNED_PRIORITY,
    ROOT_UID,
    SYSTEM_UID,
    UNKNOWN_UID_PRIORITY,
)

CAN_LOAD_NOW = ModelLoadStatus.CAN_LOAD_NOW
WAIT = ModelLoadStatus.WAIT_FOR_UNLOAD
NOT_PRIORITIZED = ModelLoadStatus.NOT_PRIORITIZED
CANCELLED = ModelLoadRequestStatus.CANCELLED
COMPLETE = ModelLoadRequestStatus.COMPLETE

ORDERING: dict[str, Callable[[], Policy]] = {
    "turn_taking": lambda: turn_taking(None),
    "budget": lambda: budget(None),
}


def key(client: int, request_id: int) -> RequestKey:
    return RequestKey(client, request_id)


# ---------------------------------------------------------------- acceptance


@pytest.mark.parametrize("name", sorted(ORDERING))
def test_foreground_request_makes_background_model_unload(name: str) -> None:
    arbiter = ranked(ORDERING[name]())
    assert kinds(arbiter.request(1, BG_CLIENT, BG, big(1))) == [
        ("can_load", BG_CLIENT, 1, CAN_LOAD_NOW)
    ]
    assert arbiter.notify_loaded(2, BG_CLIENT, 1) == []
    assert kinds(arbiter.request(3, FG_CLIENT, FG, big(7))) == [
        ("unload", BG_CLIENT, 1, UnloadReason.HIGHER_PRIORITY_REQUEST),
        ("can_load", FG_CLIENT, 7, WAIT),
    ]
    assert arbiter.state_of(BG_CLIENT, 1) is RequestState.UNLOADING
    assert arbiter.state_of(FG_CLIENT, 7) is RequestState.WAITING
    assert kinds(arbiter.notify_unloaded(4, BG_CLIENT, 1)) == [
        ("complete", BG_CLIENT, 1, COMPLETE),
        ("can_load", FG_CLIENT, 7, CAN_LOAD_NOW),
    ]
    assert arbiter.notify_loaded(5, FG_CLIENT, 7) == []
    assert [(i.key, i.state) for i in arbiter.requests()] == [
        (key(FG_CLIENT, 7), RequestState.LOADED)
    ]


@pytest.mark.parametrize("name", sorted(ORDERING))
def test_granted_request_that_never_loads_still_holds_its_budget(name: str) -> None:
    arbiter = ranked(ORDERING[name]())
    arbiter.request(1, FG_CLIENT, FG, big(1))
    assert arbiter.state_of(FG_CLIENT, 1) is RequestState.GRANTED
    assert kinds(arbiter.request(10_000, BG_CLIENT, BG, small(2))) == [
        ("can_load", BG_CLIENT, 2, NOT_PRIORITIZED)
    ]
    assert arbiter.tick(10**9) == []
    assert arbiter.state_of(FG_CLIENT, 1) is RequestState.GRANTED


@pytest.mark.parametrize("name", sorted(ORDERING))
def test_killed_client_frees_its_share(name: str) -> None:
    arbiter = ranked(ORDERING[name]())
    arbiter.request(1, FG_CLIENT, FG, big(1))
    arbiter.notify_loaded(1, FG_CLIENT, 1)
    arbiter.request(2, BG_CLIENT, BG, big(2))
    assert arbiter.state_of(BG_CLIENT, 2) is RequestState.NOT_PRIORITIZED
    assert kinds(arbiter.client_died(3, FG_CLIENT)) == [
        ("revoke", FG_CLIENT, 1, UnloadReason.CLIENT_UNRESPONSIVE),
        ("complete", FG_CLIENT, 1, COMPLETE),
        ("can_load", BG_CLIENT, 2, CAN_LOAD_NOW),
    ]


def test_status_quo_grants_at_once_and_cancel_gives_cancelled() -> None:
    arbiter = ranked(status_quo(None))
    for request_id in range(5):
        actions = arbiter.request(request_id, BG_CLIENT, BG, big(request_id))
        assert kinds(actions) == [("can_load", BG_CLIENT, request_id, CAN_LOAD_NOW)]
        assert actions[0].device is None  # type: ignore[union-attr]
    arbiter.notify_loaded(5, BG_CLIENT, 0)
    assert kinds(arbiter.request(6, FG_CLIENT, FG, big(9))) == [
        ("can_load", FG_CLIENT, 9, CAN_LOAD_NOW)
    ]
    assert kinds(arbiter.cancel(7, BG_CLIENT, 3)) == [("complete", BG_CLIENT, 3, CANCELLED)]
    assert kinds(arbiter.set_thermal(8, 1, ThermalSeverity.CRITICAL)) == []
    assert kinds(arbiter.set_memory_pressure(8, 2)) == []
    assert kinds(arbiter.set_capacity(8, [10, 20])) == []
    assert (arbiter.thermal(0), arbiter.thermal(1)) == (ThermalSeverity.NONE, 4)
    assert (arbiter.memory_pressure, arbiter.capacities) == (2, (10, 20))
    assert kinds(arbiter.work_ended(9, BG, EndReason.COMPLETED)) == []
    assert len(arbiter.requests()) == 5


# ---------------------------------------------------------------- the lifecycle


def test_cancel_ends_a_request_in_any_state_and_frees_its_share() -> None:
    arbiter = ranked(budget(None))
    arbiter.request(1, BG_CLIENT, BG, big(1))
    arbiter.notify_loaded(1, BG_CLIENT, 1)
    arbiter.request(2, FG_CLIENT, FG, big(2))
    assert kinds(arbiter.cancel(3, FG_CLIENT, 2)) == [("complete", FG_CLIENT, 2, CANCELLED)]
    assert arbiter.state_of(BG_CLIENT, 1) is RequestState.UNLOADING
    assert kinds(arbiter.cancel(4, BG_CLIENT, 1)) == [("complete", BG_CLIENT, 1, CANCELLED)]
    assert arbiter.requests() == []
    assert arbiter.next_deadline_ms() is None


def test_client_death_ends_each_request_by_its_state() -> None:
    arbiter = ranked(budget({"max_budget": 6}))
    for request_id in (1, 2, 3):
        arbiter.request(0, BG_CLIENT, BG, small(request_id))
    arbiter.notify_loaded(0, BG_CLIENT, 2)
    arbiter.notify_loaded(0, BG_CLIENT, 3)
    arbiter.request(0, FG_CLIENT, FG, big(6))
    arbiter.request(0, BG_CLIENT, BG, big(4))
    states = {i.key.request_id: i.state for i in arbiter.requests() if i.key.client == BG_CLIENT}
    assert states == {
        1: RequestState.GRANTED,
        2: RequestState.LOADED,
        3: RequestState.UNLOADING,
        4: RequestState.NOT_PRIORITIZED,
    }
    assert kinds(arbiter.client_died(1, BG_CLIENT)) == [
        ("complete", BG_CLIENT, 1, CANCELLED),
        ("revoke", BG_CLIENT, 2, UnloadReason.CLIENT_UNRESPONSIVE),
        ("complete", BG_CLIENT, 2, COMPLETE),
        ("revoke", BG_CLIENT, 3, UnloadReason.CLIENT_UNRESPONSIVE),
        ("complete", BG_CLIENT, 3, COMPLETE),
        ("complete", BG_CLIENT, 4, CANCELLED),
        ("can_load", FG_CLIENT, 6, CAN_LOAD_NOW),
    ]
    assert arbiter.client_died(2, BG_CLIENT) == []
    assert arbiter.client_died(2, 99) == []
    assert arbiter.next_deadline_ms() is None


def test_requests_snapshot_and_queries() -> None:
    arbiter = ranked(budget(None))
    arbiter.request(0, BG_CLIENT, BG, small(1), weight_bytes=123)
    arbiter.request(0, FG_CLIENT, BG, big(1))
    infos = arbiter.requests()
    assert infos == [
        RequestInfo(key(BG_CLIENT, 1), BG, small(1), RequestState.GRANTED, 1, 123, None),
        RequestInfo(key(FG_CLIENT, 1), BG, big(1), RequestState.NOT_PRIORITIZED, 4, None, None),
    ]
    with pytest.raises(AttributeError):
        infos[0].state = RequestState.LOADED  # type: ignore[misc]
    assert arbiter.policy.name == "budget"
    assert arbiter.policy.params is not None
    assert arbiter.unload_grace_ms == DEFAULT_UNLOAD_GRACE_MS


def test_two_clients_may_use_the_same_request_id() -> None:
    arbiter = Arbiter(status_quo(None))
    arbiter.request(0, 1, BG, small(7))
    arbiter.request(0, 2, BG, small(7))
    arbiter.cancel(0, 1, 7)
    assert arbiter.state_of(2, 7) is RequestState.GRANTED
    assert kinds(arbiter.request(0, 1, BG, small(7))) == [("can_load", 1, 7, CAN_LOAD_NOW)]


# ------------------------------------------------------------------- bad input


def _snapshot(arbiter: Arbiter) -> tuple[Any, ...]:
    return (
        arbiter.requests(),
        arbiter.next_deadline_ms(),
        [arbiter.uid_priority(uid) for uid in (BG, FG, 5)],
        arbiter.connect_driver(),
        arbiter.policy,
    )


def _busy() -> Arbiter:
    arbiter = ranked(budget(None))
    arbiter.request(0, BG_CLIENT, BG, big(1))
    arbiter.notify_loaded(0, BG_CLIENT, 1)
    arbiter.request(1, FG_CLIENT, FG, big(2))
    arbiter.request(1, BG_CLIENT, BG, small(3))
    return arbiter


BAD_INPUTS: list[tuple[str, Callable[[Arbiter], object], type[Exception], str]] = [
    (
        "duplicate",
        lambda a: a.request(5, BG_CLIENT, BG, small(1)),
        DuplicateRequestError,
        "request id 1 is already live for this client",
    ),
    ("cancel unknown", lambda a: a.cancel(5, BG_CLIENT, 9), UnknownRequestError, "id 9"),
    (
        "cancel someone else's",
        lambda a: a.cancel(5, BG_CLIENT, 2),
        UnknownRequestError,
        "client 1 has no live request with id 2",
    ),
    ("loaded unknown", lambda a: a.notify_loaded(5, 3, 1), UnknownRequestError, "client 3"),
    (
        "loaded while waiting",
        lambda a: a.notify_loaded(5, FG_CLIENT, 2),
        RequestStateError,
        "is waiting; only a granted request can be loaded",
    ),
    (
        "loaded while not prioritized",
        lambda a: a.notify_loaded(5, BG_CLIENT, 3),
        RequestStateError,
        "not_prioritized",
    ),
    (
        "loaded twice",
        lambda a: a.notify_loaded(5, BG_CLIENT, 1),
        RequestStateError,
        "is unloading",
    ),
    (
        "unloaded while waiting",
        lambda a: a.notify_unloaded(5, FG_CLIENT, 2),
        RequestStateError,
        "only a granted, loaded or unloading request can be unloaded",
    ),
    (
        "unloaded while not prioritized",
        lambda a: a.notify_unloaded(5, BG_CLIENT, 3),
        RequestStateError,
        "not_prioritized",
    ),
    ("unloaded unknown", lambda a: a.notify_unloaded(5, 9, 9), UnknownRequestError, "id 9"),
    (
        "negative uid",
        lambda a: a.request(5, 7, -1, small(1)),
        IllegalArgumentError,
        "uid must be within",
    ),
    (
        "uid not an int",
        lambda a: a.set_importance(5, "10001", 100),
        IllegalArgumentError,
        "uid must be an int",
    ),
    (
        "request not a request",
        lambda a: a.request(5, 7, BG, {"id": 1}),
        IllegalArgumentError,
        "ModelLoadRequest",
    ),
    (
        "zero weight bytes",
        lambda a: a.request(5, 7, BG, small(1), weight_bytes=0),
        IllegalArgumentError,
        "weight_bytes",
    ),
    (
        "importance not an int",
        lambda a: a.set_importance(5, BG, 1.5),
        IllegalArgumentError,
        "importance must be an int",
    ),
    (
        "importance a bool",
        lambda a: a.set_importance(5, BG, True),
        IllegalArgumentError,
        "importance",
    ),
    (
        "end reason",
        lambda a: a.work_ended(5, BG, 9),
        IllegalArgumentError,
        "reason must be one of",
    ),
    (
        "thermal device",
        lambda a: a.set_thermal(5, 99, ThermalSeverity.SEVERE),
        IllegalArgumentError,
        "device",
    ),
    (
        "thermal severity",
        lambda a: a.set_thermal(5, 0, 17),
        IllegalArgumentError,
        "severity must be one of",
    ),
    ("memory level", lambda a: a.set_memory_pressure(5, 3), IllegalArgumentError, "0..2"),
    ("no capacities", lambda a: a.set_capacity(5, []), IllegalArgumentError, "1..16 devices"),
    ("negative capacity", lambda a: a.set_capacity(5, [1, -1]), IllegalArgumentError, "device 1"),
    ("capacity not a list", lambda a: a.set_capacity(5, 5), IllegalArgumentError, "sequence"),
    ("policy not a policy", lambda a: a.set_policy(5, "budget"), IllegalArgumentError, "Policy"),
    (
        "policy already in use",
        lambda a: a.set_policy(5, Arbiter(budget(None)).policy),
        IllegalArgumentError,
        "already in use",
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
def test_bad_input_raises_and_changes_nothing(
    call: Callable[[Arbiter], object], error: type[Exception], message: str
) -> None:
    arbiter = _busy()
    before = _snapshot(arbiter)
    with pytest.raises(error, match=message) as caught:
        call(arbiter)
    assert isinstance(caught.value, NpuManagerError)
    assert _snapshot(arbiter) == before
    assert kinds(arbiter.notify_unloaded(6, BG_CLIENT, 1))[-1] == (
        "can_load",
        FG_CLIENT,
        2,
        CAN_LOAD_NOW,
    )


def test_an_attached_policy_cannot_start_a_second_arbiter() -> None:
    policy = budget(None)
    Arbiter(policy)
    with pytest.raises(IllegalArgumentError, match="already in use"):
        Arbiter(policy)
    with pytest.raises(IllegalArgumentError, match="unload_grace_ms"):
        Arbiter(budget(None), unload_grace_ms=-1)


# --------------------------------------------------------------- grace period


def test_unload_ignored_past_the_grace_period_is_revoked() -> None:
    arbiter = ranked(budget(None), unload_grace_ms=500)
    arbiter.request(0, BG_CLIENT, BG, big(1))
    arbiter.notify_loaded(0, BG_CLIENT, 1)
    assert arbiter.next_deadline_ms() is None
    arbiter.request(100, FG_CLIENT, FG, big(2))
    assert arbiter.next_deadline_ms() == 600
    assert arbiter.tick(599) == []
    assert kinds(arbiter.tick(600)) == [
        ("revoke", BG_CLIENT, 1, UnloadReason.CLIENT_UNRESPONSIVE),
        ("complete", BG_CLIENT, 1, COMPLETE),
        ("can_load", FG_CLIENT, 2, CAN_LOAD_NOW),
    ]
    assert arbiter.next_deadline_ms() is None
    assert arbiter.tick(10_000) == []
    with pytest.raises(UnknownRequestError):
        arbiter.notify_unloaded(700, BG_CLIENT, 1)


def test_unload_within_the_grace_period_clears_the_deadline() -> None:
    arbiter = ranked(budget(None), unload_grace_ms=500)
    arbiter.request(0, BG_CLIENT, BG, big(1))
    arbiter.notify_loaded(0, BG_CLIENT, 1)
    arbiter.request(100, FG_CLIENT, FG, big(2))
    arbiter.notify_unloaded(200, BG_CLIENT, 1)
    assert arbiter.next_deadline_ms() is None
    assert arbiter.tick(10_000) == []
    arbiter.request(300, BG_CLIENT, BG, big(1))
    assert arbiter.tick(10_000) == []


def test_deadlines_expire_in_order_and_reused_ids_do_not_inherit_them() -> None:
    arbiter = ranked(budget({"max_budget": 2, "weights": [1, 1, 1]}), unload_grace_ms=100)
    for request_id in (1, 2):
        arbiter.request(0, BG_CLIENT, BG, small(request_id))
        arbiter.notify_loaded(0, BG_CLIENT, request_id)
    arbiter.request(10, FG_CLIENT, FG, small(8))
    arbiter.request(50, FG_CLIENT, FG, small(9))
    assert arbiter.next_deadline_ms() == 110
    arbiter.notify_unloaded(60, BG_CLIENT, 2)
    arbiter.request(60, BG_CLIENT, BG, small(2))
    assert arbiter.state_of(BG_CLIENT, 2) is RequestState.NOT_PRIORITIZED
    assert arbiter.next_deadline_ms() == 150
    assert [a.key.request_id for a in arbiter.tick(200) if isinstance(a, Revoke)] == [1]
    assert arbiter.next_deadline_ms() is None


# ------------------------------------------------------------------ policy swap


def test_swap_to_budget_unloads_with_policy_change_and_cancels_the_unchosen() -> None:
    arbiter = ranked(status_quo(None))
    for request_id in (1, 2):
        arbiter.request(0, BG_CLIENT, BG, big(request_id))
        arbiter.notify_loaded(0, BG_CLIENT, request_id)
    arbiter.request(0, BG_CLIENT, BG, small(3))
    arbiter.request(0, FG_CLIENT, FG, small(4))
    arbiter.notify_loaded(0, FG_CLIENT, 4)
    assert kinds(arbiter.set_policy(1, budget(None))) == [
        ("unload", BG_CLIENT, 1, UnloadReason.POLICY_CHANGE),
        ("unload", BG_CLIENT, 2, UnloadReason.POLICY_CHANGE),
    ]
    assert arbiter.policy.name == "budget"
    assert arbiter.state_of(BG_CLIENT, 3) is RequestState.GRANTED
    assert kinds(arbiter.set_policy(2, turn_taking(None))) == [
        ("complete", BG_CLIENT, 3, CANCELLED),
    ]
    arbiter.notify_unloaded(3, BG_CLIENT, 1)
    arbiter.notify_unloaded(3, BG_CLIENT, 2)
    assert [(i.key, i.state) for i in arbiter.requests()] == [
        (key(FG_CLIENT, 4), RequestState.LOADED)
    ]


def test_swap_to_status_quo_grants_the_waiting_and_the_refused() -> None:
    arbiter = ranked(turn_taking(None))
    arbiter.request(0, BG_CLIENT, BG, big(1))
    arbiter.notify_loaded(0, BG_CLIENT, 1)
    arbiter.request(0, FG_CLIENT, FG, big(2))
    arbiter.request(0, BG_CLIENT, BG, small(3))
    assert kinds(arbiter.set_policy(1, status_quo(None))) == [
        ("can_load", FG_CLIENT, 2, CAN_LOAD_NOW),
        ("can_load", BG_CLIENT, 3, CAN_LOAD_NOW),
    ]
    assert arbiter.state_of(BG_CLIENT, 1) is RequestState.UNLOADING
    assert arbiter.set_policy(2, arbiter.policy) == []
    assert arbiter.tick(10**6)[0] == Revoke(
        key(BG_CLIENT, 1), big(1), UnloadReason.CLIENT_UNRESPONSIVE
    )


def test_swap_keeps_what_still_fits() -> None:
    arbiter = ranked(budget(None))
    arbiter.request(0, FG_CLIENT, FG, small(1))
    arbiter.notify_loaded(0, FG_CLIENT, 1)
    arbiter.request(0, BG_CLIENT, BG, small(2))
    assert arbiter.set_policy(1, budget({"max_budget": 8})) == []
    assert arbiter.policy.params is not None
    assert arbiter.policy.params.max_budget == 8  # type: ignore[attr-defined]


# ------------------------------------------------------- priorities and configs


def test_priorities_follow_importance_with_pinned_and_unknown_uids() -> None:
    arbiter = Arbiter(status_quo(None))
    assert arbiter.uid_priority(BG) == UNKNOWN_UID_PRIORITY
    assert arbiter.uid_priority(ROOT_UID) == arbiter.uid_priority(SYSTEM_UID) == PINNED_PRIORITY
    assert arbiter.set_importance(0, SYSTEM_UID, Importance.GONE) == []
    assert arbiter.set_importance(0, ROOT_UID, 900) == []
    assert arbiter.uid_priority(SYSTEM_UID) == PINNED_PRIORITY
    arbiter.set_importance(0, BG, Importance.PERCEPTIBLE)
    assert arbiter.uid_priority(BG) == 230
    for outside in (-20, 5000):
        with pytest.raises(IllegalArgumentError, match="importance must be within 0..1000"):
            arbiter.set_importance(0, BG, outside)
        assert arbiter.uid_priority(BG) == 230


def test_importance_change_relays_the_uid_config_once() -> None:
    arbiter = Arbiter(status_quo(None))
    first = arbiter.set_importance(0, BG, Importance.CACHED)
    assert first == [RelayConfigs((SchedulingConfig(uid=BG, app_priority=400),), replace_all=False)]
    assert arbiter.set_importance(1, BG, Importance.CACHED) == []
    assert arbiter.set_importance(2, BG, 399) == [
        RelayConfigs((SchedulingConfig(uid=BG, app_priority=399),), replace_all=False)
    ]
    assert arbiter.set_importance(3, BG, 1000) == [
        RelayConfigs((SchedulingConfig(uid=BG, app_priority=1000),), replace_all=False)
    ]
    assert arbiter.set_importance(4, BG, 1000) == []
    first_seen_at_default = arbiter.set_importance(5, FG, UNKNOWN_UID_PRIORITY)
    assert first_seen_at_default == [
        RelayConfigs((SchedulingConfig(uid=FG, app_priority=1000),), replace_all=False)
    ]


def test_connect_driver_sends_every_known_uid_and_the_attribution_permission() -> None:
    arbiter = Arbiter(status_quo(None), attribution_uids=frozenset({SYSTEM_UID, 20_000}))
    arbiter.set_importance(0, FG, Importance.FOREGROUND)
    arbiter.request(0, 1, 30_000, small(1))
    assert arbiter.connect_driver() == [
        RelayConfigs(
            (
                SchedulingConfig(uid=ROOT_UID, app_priority=PINNED_PRIORITY),
                SchedulingConfig(
                    uid=SYSTEM_UID, app_priority=PINNED_PRIORITY, can_attribute_other_uid=True
                ),
                SchedulingConfig(uid=FG, app_priority=100),
                SchedulingConfig(
                    uid=20_000, app_priority=UNKNOWN_UID_PRIORITY, can_attribute_other_uid=True
                ),
            ),
            replace_all=True,
        )
    ]
    assert arbiter.scheduling_config(30_000) == SchedulingConfig(
        uid=30_000, app_priority=UNKNOWN_UID_PRIORITY
    )


def test_importance_change_reevaluates_after_relaying() -> None:
    arbiter = ranked(budget(None))
    arbiter.request(0, FG_CLIENT, FG, big(1))
    arbiter.notify_loaded(0, FG_CLIENT, 1)
    arbiter.request(0, BG_CLIENT, BG, big(2))
    assert kinds(arbiter.set_importance(1, FG, Importance.GONE)) == [
        ("relay", (FG,), False),
        ("unload", FG_CLIENT, 1, UnloadReason.HIGHER_PRIORITY_REQUEST),
        ("can_load", BG_CLIENT, 2, WAIT),
    ]
    assert kinds(arbiter.set_importance(2, FG, Importance.GONE)) == []
    assert kinds(arbiter.notify_unloaded(3, FG_CLIENT, 1)) == [
        ("complete", FG_CLIENT, 1, COMPLETE),
        ("can_load", BG_CLIENT, 2, CAN_LOAD_NOW),
    ]


def test_work_completion_orders_equal_uids_and_other_end_reasons_do_not() -> None:
    arbiter = Arbiter(turn_taking(None))
    arbiter.request(0, 1, 10_001, small(1))
    arbiter.request(0, 2, 10_002, small(1))
    arbiter.request(0, 3, 10_003, small(1))
    for reason in EndReason:
        if reason is not EndReason.COMPLETED:
            assert arbiter.work_ended(50, 10_002, reason) == []
    arbiter.work_ended(60, 10_002, EndReason.COMPLETED)
    assert arbiter.rank(10_002) == (UNKNOWN_UID_PRIORITY, 60, 10_002)
    assert arbiter.rank(10_003) == (UNKNOWN_UID_PRIORITY, 0, 10_003)
    assert kinds(arbiter.cancel(70, 1, 1)) == [
        ("complete", 1, 1, CANCELLED),
        ("can_load", 3, 1, CAN_LOAD_NOW),
    ]
