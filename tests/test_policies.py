"""The platform's policies: registration, parameters, budget rules, tie-break, turn taking."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.arbiter import kinds
from npumanager import PluginKind, load_plugins
from npumanager.core.arbiter.actions import CanLoad, RequestState
from npumanager.core.arbiter.arbiter import Arbiter
from npumanager.core.arbiter.policy import Policy, build_policy, validate_params
from npumanager.errors import PolicyParamsError
from npumanager.plugins.policies.budget import (
    BudgetParams,
    BudgetPolicy,
    NaiveBudgetPolicy,
    budget,
    turn_taking,
)
from npumanager.plugins.policies.pressure import PressureParams, PressurePolicy
from npumanager.plugins.policies.status_quo import StatusQuoPolicy
from npumanager.schemas import (
    EndReason,
    Importance,
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    ModelSize,
    UnloadReason,
)
from npumanager.schemas.limits import DEFAULT_BUDGET_WEIGHTS, DEFAULT_MAX_BUDGET

CAN_LOAD_NOW = ModelLoadStatus.CAN_LOAD_NOW
WAIT = ModelLoadStatus.WAIT_FOR_UNLOAD
NOT_PRIORITIZED = ModelLoadStatus.NOT_PRIORITIZED
CANCELLED = ModelLoadRequestStatus.CANCELLED
COMPLETE = ModelLoadRequestStatus.COMPLETE
A, B, C = 10_001, 10_002, 10_003


def req(request_id: int, size: ModelSize = ModelSize.LESS_THAN_1GB) -> ModelLoadRequest:
    return ModelLoadRequest(id=request_id, size=size)


BIG = ModelSize.GREATER_THAN_2G
MID = ModelSize.BETWEEN_1GB_AND_2GB


# ---------------------------------------------------------------- registration


def test_builtin_policies_register_through_the_entry_point() -> None:
    registry = load_plugins()
    names = {r.name for r in registry.registrations(PluginKind.POLICY)}
    assert {"status_quo", "turn_taking", "budget", "pressure"} <= names
    assert registry.get(PluginKind.POLICY, "budget").source.name == "builtin-policies"
    assert registry.policy("budget").params_model is BudgetParams
    assert registry.policy("pressure").params_model is PressureParams
    assert registry.policy("turn_taking").params_model is None
    assert registry.policy("status_quo").params_model is None
    built = {name: build_policy(registry.policy(name)) for name in sorted(names)}
    assert isinstance(built["status_quo"], StatusQuoPolicy)
    assert isinstance(built["pressure"], PressurePolicy)
    assert isinstance(built["budget"], BudgetPolicy)
    assert (built["budget"].weights, built["budget"].max_budget) == (  # type: ignore[attr-defined]
        DEFAULT_BUDGET_WEIGHTS,
        DEFAULT_MAX_BUDGET,
    )
    tt = built["turn_taking"]
    assert isinstance(tt, BudgetPolicy)
    assert (tt.weights, tt.max_budget, tt.params) == ((1, 1, 1), 1, None)
    assert {name: p.name for name, p in built.items()} == {n: n for n in built}


def test_naive_budget_is_importable_but_not_registered() -> None:
    registry = load_plugins()
    assert all(
        not isinstance(build_policy(r.record), NaiveBudgetPolicy)  # type: ignore[arg-type]
        for r in registry.registrations(PluginKind.POLICY)
        if r.source.builtin
    )
    assert isinstance(NaiveBudgetPolicy(), Policy)


# ------------------------------------------------------------------ parameters


@pytest.mark.parametrize(
    ("params", "weights", "max_budget"),
    [
        (None, (1, 2, 4), 4),
        ({}, (1, 2, 4), 4),
        ({"weights": [2, 3, 5]}, (2, 3, 5), 4),
        ({"weights": (1, 1, 1), "max_budget": 1}, (1, 1, 1), 1),
        ({"max_budget": 12}, (1, 2, 4), 12),
        (BudgetParams(max_budget=7), (1, 2, 4), 7),
    ],
)
def test_budget_params_accepted(params: Any, weights: tuple[int, ...], max_budget: int) -> None:
    policy = build_policy(load_plugins().policy("budget"), params)
    assert isinstance(policy, BudgetPolicy)
    assert (policy.weights, policy.max_budget) == (weights, max_budget)
    assert policy.params == BudgetParams(weights=weights, max_budget=max_budget)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"weights": [1, 2]}, r"weights: .*at least 3 items.*\(got \[1, 2\]\)"),
        ({"weights": [1, 2, 4, 8]}, r"weights: .*at most 3 items"),
        ({"weights": [0, 2, 4]}, r"weights: .*greater than 0 \(got 0\)"),
        ({"weights": [1, -2, 4]}, r"weights: .*greater than 0 \(got -2\)"),
        ({"weights": [1, 2.5, 4]}, r"weights: .*integer"),
        ({"weights": [1, "2", 4]}, r"weights: .*integer"),
        ({"weights": [True, 2, 4]}, r"weights: .*integer"),
        ({"weights": 4}, r"weights: .*tuple"),
        ({"max_budget": 0}, r"max_budget: .*greater than 0"),
        ({"max_budget": -4}, r"max_budget: .*greater than 0"),
        ({"max_budget": "4"}, r"max_budget: .*integer"),
        ({"max_budget": 4.0}, r"max_budget: .*integer"),
        ({"budget": 4}, r"unknown key 'budget'"),
    ],
)
def test_budget_params_rejected_naming_the_key_and_what_is_allowed(
    params: dict[str, Any], message: str
) -> None:
    with pytest.raises(PolicyParamsError, match=message) as caught:
        build_policy(load_plugins().policy("budget"), params)
    text = str(caught.value)
    assert text.startswith("policy 'budget': ")
    assert "Allowed: weights: 3 positive ints" in text
    assert "max_budget: a positive int" in text


@pytest.mark.parametrize("name", ["turn_taking", "status_quo"])
def test_parameterless_policies_refuse_any_params(name: str) -> None:
    record = load_plugins().policy(name)
    with pytest.raises(PolicyParamsError, match=f"policy '{name}' takes no parameters; got x"):
        build_policy(record, {"x": 1})
    with pytest.raises(PolicyParamsError, match="takes no parameters"):
        record.factory({"max_budget": 1})
    assert build_policy(record, {}).name == name
    assert build_policy(record, None).name == name


def test_constructors_validate_their_limits_too() -> None:
    with pytest.raises(PolicyParamsError, match="max_budget"):
        BudgetPolicy((1, 2, 4), 0)
    with pytest.raises(PolicyParamsError, match="weights"):
        NaiveBudgetPolicy((1, 2), 4)
    with pytest.raises(PolicyParamsError, match="weights"):
        budget({"weights": [1, 0, 1]})
    assert validate_params("budget", BudgetParams, {"max_budget": 3}) == BudgetParams(max_budget=3)


def test_pressure_params() -> None:
    record = load_plugins().policy("pressure")
    default = build_policy(record)
    assert isinstance(default, PressurePolicy)
    assert default.params == PressureParams()
    custom = build_policy(record, {"capacity_bytes": [8, 16], "foreground_priority": 200})
    assert custom.params == PressureParams(capacity_bytes=(8, 16), foreground_priority=200)
    for bad, message in [
        ({"capacity_bytes": []}, "capacity_bytes"),
        ({"capacity_bytes": [0]}, "capacity_bytes"),
        ({"capacity_bytes": [1] * 17}, "capacity_bytes"),
        ({"nominal_bytes": [1, 2]}, "nominal_bytes"),
        ({"foreground_priority": 1001}, "foreground_priority"),
        ({"background_priority": -1}, "background_priority"),
        ({"thermal": 1}, "unknown key 'thermal'"),
    ]:
        with pytest.raises(PolicyParamsError, match=message):
            build_policy(record, bad)


# -------------------------------------------------------------- budget rules


def ranked(policy: Policy, **importance: int) -> Arbiter:
    arbiter = Arbiter(policy)
    for name, value in importance.items():
        arbiter.set_importance(0, {"a": A, "b": B, "c": C}[name], value)
    return arbiter


def test_requests_that_fit_are_granted_together() -> None:
    arbiter = ranked(budget(None))
    assert [kinds(arbiter.request(0, 1, A, req(i)))[0][3] for i in range(4)] == [CAN_LOAD_NOW] * 4
    assert kinds(arbiter.request(0, 2, A, req(9))) == [("can_load", 2, 9, NOT_PRIORITIZED)]


def test_turn_taking_allows_one_model_whatever_its_size() -> None:
    arbiter = ranked(turn_taking(None))
    assert kinds(arbiter.request(0, 1, A, req(1)))[0][3] == CAN_LOAD_NOW
    assert kinds(arbiter.request(0, 2, B, req(2)))[0][3] == NOT_PRIORITIZED
    assert [i.weight for i in arbiter.requests()] == [1, 1]


def test_not_prioritized_when_only_more_important_uids_hold_the_budget() -> None:
    arbiter = ranked(budget(None), a=Importance.FOREGROUND, b=Importance.CACHED)
    arbiter.request(0, 1, A, req(1, BIG))
    arbiter.notify_loaded(0, 1, 1)
    assert kinds(arbiter.request(0, 2, B, req(2))) == [("can_load", 2, 2, NOT_PRIORITIZED)]
    assert kinds(arbiter.request(0, 2, B, req(3, MID))) == [("can_load", 2, 3, NOT_PRIORITIZED)]
    assert kinds(arbiter.request(0, 3, A, req(4))) == [("can_load", 3, 4, NOT_PRIORITIZED)]
    assert kinds(arbiter.cancel(1, 3, 4)) == [("complete", 3, 4, CANCELLED)]
    assert kinds(arbiter.notify_unloaded(2, 1, 1)) == [
        ("complete", 1, 1, COMPLETE),
        ("can_load", 2, 2, CAN_LOAD_NOW),
        ("can_load", 2, 3, CAN_LOAD_NOW),
    ]


def test_eviction_walks_least_important_uids_first_and_stops_at_the_callers_rank() -> None:
    arbiter = ranked(
        budget({"max_budget": 3, "weights": [1, 1, 1]}),
        a=Importance.GONE,
        b=Importance.CACHED,
        c=Importance.SERVICE,
    )
    for client, uid in ((1, A), (2, B), (3, C)):
        arbiter.request(0, client, uid, req(client))
        arbiter.notify_loaded(0, client, client)
    arbiter.set_importance(0, 20_000, Importance.CACHED)
    assert kinds(arbiter.request(1, 4, 20_000, req(4))) == [
        ("unload", 1, 1, UnloadReason.HIGHER_PRIORITY_REQUEST),
        ("can_load", 4, 4, WAIT),
    ]
    assert kinds(arbiter.request(1, 5, 20_000, req(5))) == [("can_load", 5, 5, NOT_PRIORITIZED)]


def test_pending_requests_are_cancelled_and_the_caller_loads_at_once() -> None:
    arbiter = ranked(budget(None), a=Importance.CACHED, b=Importance.FOREGROUND)
    arbiter.request(0, 1, A, req(1, MID))
    arbiter.request(0, 1, A, req(2, MID))
    assert kinds(arbiter.request(0, 2, B, req(3, MID))) == [
        ("complete", 1, 2, CANCELLED),
        ("can_load", 2, 3, CAN_LOAD_NOW),
    ]
    arbiter.notify_loaded(0, 1, 1)
    assert kinds(arbiter.request(0, 2, B, req(4, BIG))) == [("can_load", 2, 4, NOT_PRIORITIZED)]
    assert kinds(arbiter.request(0, 2, B, req(5, MID))) == [
        ("unload", 1, 1, UnloadReason.HIGHER_PRIORITY_REQUEST),
        ("can_load", 2, 5, WAIT),
    ]


def test_reevaluation_cancels_waiting_requests_outside_the_ideal_set() -> None:
    arbiter = ranked(budget(None), a=Importance.GONE, b=Importance.CACHED, c=Importance.GONE)
    arbiter.request(0, 1, A, req(1, BIG))
    arbiter.notify_loaded(0, 1, 1)
    assert kinds(arbiter.request(0, 2, B, req(2, BIG)))[-1] == ("can_load", 2, 2, WAIT)
    assert kinds(arbiter.request(0, 3, C, req(3, BIG))) == [("can_load", 3, 3, NOT_PRIORITIZED)]
    assert kinds(arbiter.set_importance(1, C, Importance.FOREGROUND)) == [
        ("relay", (C,), False),
        ("complete", 2, 2, CANCELLED),
        ("can_load", 3, 3, WAIT),
    ]
    assert arbiter.state_of(1, 1) is RequestState.UNLOADING
    assert kinds(arbiter.notify_unloaded(2, 1, 1)) == [
        ("complete", 1, 1, COMPLETE),
        ("can_load", 3, 3, CAN_LOAD_NOW),
    ]


def test_ideal_set_skips_what_does_not_fit_and_takes_smaller_later_requests() -> None:
    arbiter = ranked(budget(None), a=Importance.FOREGROUND, b=Importance.SERVICE, c=400)
    for request_id, size in ((1, MID), (2, ModelSize.LESS_THAN_1GB), (6, ModelSize.LESS_THAN_1GB)):
        arbiter.request(0, 1, A, req(request_id, size))
        arbiter.notify_loaded(0, 1, request_id)
    arbiter.request(0, 2, B, req(3, BIG))
    arbiter.request(0, 3, C, req(5))
    assert [i.state for i in arbiter.requests()][3:] == [RequestState.NOT_PRIORITIZED] * 2
    assert kinds(arbiter.notify_unloaded(1, 1, 1)) == [
        ("complete", 1, 1, COMPLETE),
        ("can_load", 3, 5, CAN_LOAD_NOW),
    ]
    assert arbiter.state_of(2, 3) is RequestState.NOT_PRIORITIZED


def test_unloading_models_free_room_for_every_request_that_counted_on_them() -> None:
    arbiter = ranked(budget(None), a=Importance.GONE, b=Importance.SERVICE, c=Importance.CACHED)
    arbiter.request(0, 1, A, req(1, BIG))
    arbiter.notify_loaded(0, 1, 1)
    assert kinds(arbiter.request(0, 3, C, req(3, MID)))[-1] == ("can_load", 3, 3, WAIT)
    assert kinds(arbiter.request(0, 2, B, req(2, MID))) == [("can_load", 2, 2, WAIT)]
    assert kinds(arbiter.notify_unloaded(1, 1, 1)) == [
        ("complete", 1, 1, COMPLETE),
        ("can_load", 2, 2, CAN_LOAD_NOW),
        ("can_load", 3, 3, CAN_LOAD_NOW),
    ]


def test_a_refused_request_chosen_while_others_unload_is_told_to_wait() -> None:
    arbiter = ranked(budget(None), a=Importance.GONE, b=Importance.CACHED, c=Importance.GONE)
    arbiter.request(0, 1, A, req(1, BIG))
    arbiter.notify_loaded(0, 1, 1)
    arbiter.request(0, 2, B, req(2, BIG))
    assert kinds(arbiter.request(0, 3, C, req(3, MID))) == [("can_load", 3, 3, NOT_PRIORITIZED)]
    assert kinds(arbiter.cancel(1, 2, 2)) == [
        ("complete", 2, 2, CANCELLED),
        ("can_load", 3, 3, WAIT),
    ]
    assert kinds(arbiter.set_importance(2, 40_000, 500)) == [("relay", (40_000,), False)]
    assert kinds(arbiter.notify_unloaded(3, 1, 1)) == [
        ("complete", 1, 1, COMPLETE),
        ("can_load", 3, 3, CAN_LOAD_NOW),
    ]


# ------------------------------------------------------------------- tie-break


def test_equal_uids_the_least_recently_completed_goes_first_then_the_lower_uid() -> None:
    arbiter = ranked(turn_taking(None))
    arbiter.request(0, 9, 9_999, req(9))
    arbiter.notify_loaded(0, 9, 9)
    for client, uid in ((1, C), (2, B), (3, A)):
        assert kinds(arbiter.request(0, client, uid, req(client)))[0][3] == NOT_PRIORITIZED
    arbiter.work_ended(10, A, EndReason.COMPLETED)
    arbiter.work_ended(20, C, EndReason.COMPLETED)
    order, holder = [], 9
    for step in range(3):
        actions = arbiter.notify_unloaded(30 + step, holder, holder)
        holder = next(a.key.client for a in actions if isinstance(a, CanLoad))
        arbiter.notify_loaded(30 + step, holder, holder)
        order.append(holder)
    assert order == [2, 3, 1]
    assert kinds(arbiter.request(40, 4, 9_998, req(4))) == [
        ("unload", 1, 1, UnloadReason.HIGHER_PRIORITY_REQUEST),
        ("can_load", 4, 4, WAIT),
    ]


def test_equal_priority_caller_evicts_only_a_uid_that_completed_more_recently() -> None:
    arbiter = ranked(turn_taking(None))
    arbiter.request(0, 1, A, req(1))
    arbiter.notify_loaded(0, 1, 1)
    assert kinds(arbiter.request(1, 2, B, req(2))) == [("can_load", 2, 2, NOT_PRIORITIZED)]
    arbiter.cancel(1, 2, 2)
    arbiter.work_ended(5, B, EndReason.COMPLETED)
    arbiter.work_ended(5, A, EndReason.COMPLETED)
    assert kinds(arbiter.request(6, 2, B, req(3))) == [("can_load", 2, 3, NOT_PRIORITIZED)]
    arbiter.cancel(6, 2, 3)
    arbiter.work_ended(7, A, EndReason.COMPLETED)
    assert kinds(arbiter.request(8, 2, B, req(4))) == [
        ("unload", 1, 1, UnloadReason.HIGHER_PRIORITY_REQUEST),
        ("can_load", 2, 4, WAIT),
    ]


# ------------------------------------------------------------------ turn taking


def test_work_completion_hands_the_turn_to_an_equal_uid_waiting() -> None:
    arbiter = ranked(turn_taking(None))
    arbiter.request(0, 1, A, req(1))
    arbiter.notify_loaded(0, 1, 1)
    arbiter.request(0, 2, B, req(2))
    assert arbiter.work_ended(5, A, EndReason.FAILED) == []
    assert kinds(arbiter.work_ended(10, A, EndReason.COMPLETED)) == [
        ("unload", 1, 1, UnloadReason.TURN_TAKING)
    ]
    assert arbiter.work_ended(11, A, EndReason.COMPLETED) == []
    assert kinds(arbiter.notify_unloaded(12, 1, 1)) == [
        ("complete", 1, 1, COMPLETE),
        ("can_load", 2, 2, CAN_LOAD_NOW),
    ]
    arbiter.notify_loaded(13, 2, 2)
    arbiter.request(14, 1, A, req(1))
    assert arbiter.state_of(1, 1) is RequestState.NOT_PRIORITIZED
    assert kinds(arbiter.work_ended(20, B, EndReason.COMPLETED)) == [
        ("unload", 2, 2, UnloadReason.TURN_TAKING)
    ]


def test_a_waiting_request_of_an_equal_uid_takes_the_turn_too() -> None:
    """WAITING both holds budget and waits: turn taking must count it (it once did not)."""
    for policy in (BudgetPolicy((2, 3, 5), 6), NaiveBudgetPolicy((2, 3, 5), 6)):
        arbiter = ranked(policy, b=Importance.FOREGROUND, c=Importance.FOREGROUND)
        arbiter.request(0, 1, A, req(1))
        arbiter.notify_loaded(0, 1, 1)
        arbiter.request(0, 2, B, req(2))
        arbiter.notify_loaded(0, 2, 2)
        arbiter.request(0, 3, C, req(3, MID))
        assert arbiter.state_of(3, 3) is RequestState.WAITING
        assert kinds(arbiter.work_ended(1, B, EndReason.COMPLETED)) == [
            ("unload", 2, 2, UnloadReason.TURN_TAKING)
        ]


def test_no_turn_taking_without_an_equal_uid_that_waits() -> None:
    arbiter = ranked(
        budget({"max_budget": 1, "weights": [1, 1, 1]}), a=Importance.SERVICE, b=Importance.CACHED
    )
    arbiter.request(0, 1, A, req(1))
    arbiter.notify_loaded(0, 1, 1)
    arbiter.request(0, 1, A, req(2))
    assert arbiter.state_of(1, 2) is RequestState.NOT_PRIORITIZED
    assert arbiter.work_ended(1, A, EndReason.COMPLETED) == []
    arbiter.request(0, 2, B, req(3))
    assert arbiter.work_ended(2, A, EndReason.COMPLETED) == []
    arbiter.work_ended(3, B, EndReason.COMPLETED)
    assert kinds(arbiter.set_importance(3, B, Importance.SERVICE)) == [("relay", (B,), False)]
    assert kinds(arbiter.work_ended(4, A, EndReason.COMPLETED)) == [
        ("unload", 1, 1, UnloadReason.TURN_TAKING)
    ]


def test_turn_taking_unloads_every_loaded_model_of_the_completer() -> None:
    arbiter = ranked(budget({"max_budget": 2, "weights": [1, 1, 1]}))
    for request_id in (1, 2):
        arbiter.request(0, 1, A, req(request_id))
        arbiter.notify_loaded(0, 1, request_id)
    arbiter.request(0, 2, B, req(3))
    assert kinds(arbiter.work_ended(1, A, EndReason.COMPLETED)) == [
        ("unload", 1, 1, UnloadReason.TURN_TAKING),
        ("unload", 1, 2, UnloadReason.TURN_TAKING),
    ]
