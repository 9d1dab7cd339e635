"""The incremental budget policy against the naive one: same inputs, same actions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npumanager.core.arbiter.arbiter import Arbiter
from npumanager.core.arbiter.policy import Policy
from npumanager.errors import NpuManagerError
from npumanager.plugins.policies.budget import BudgetPolicy, NaiveBudgetPolicy
from npumanager.schemas import (
    EndReason,
    Importance,
    ModelLoadRequest,
    ModelPriority,
    ModelSize,
)

CLIENT_UIDS = {1: 10001, 2: 10002, 3: 10003, 4: 10003, 5: 10004, 6: 1000}
"""Clients and their uids; two clients share a uid, one is the system uid."""

LIMITS = st.sampled_from([((1, 2, 4), 4), ((1, 1, 1), 1), ((1, 2, 3), 5), ((2, 3, 5), 6)])

clients = st.sampled_from(sorted(CLIENT_UIDS))
request_ids = st.integers(0, 3)
uids = st.sampled_from(sorted(set(CLIENT_UIDS.values())))
importances = st.sampled_from([*Importance, 0, 1000])

KINDS = st.sampled_from(
    ["request"] * 4
    + ["loaded"] * 3
    + ["unloaded"] * 2
    + ["cancel", "importance", "died", "work", "work", "tick", "swap"]
)


def _draw_op(data: st.DataObject, arbiter: Arbiter) -> tuple[Any, ...]:
    kind = data.draw(KINDS)
    live = [info.key for info in arbiter.requests()]
    if kind in ("loaded", "unloaded", "cancel") and live and data.draw(st.integers(0, 9)):
        key = data.draw(st.sampled_from(live))
        return (kind, key.client, key.request_id)
    if kind in ("loaded", "unloaded", "cancel"):
        return (kind, data.draw(clients), data.draw(request_ids))
    if kind == "request":
        return (
            kind,
            data.draw(clients),
            data.draw(request_ids),
            data.draw(st.sampled_from(ModelSize)),
            data.draw(st.sampled_from(ModelPriority)),
        )
    if kind == "importance":
        return (kind, data.draw(uids), data.draw(importances))
    if kind == "died":
        return (kind, data.draw(clients))
    if kind == "work":
        reason = data.draw(st.sampled_from([EndReason.COMPLETED, *EndReason]))
        return (kind, data.draw(uids), reason)
    if kind == "swap":
        return (kind, data.draw(LIMITS))
    return (kind,)


def _apply(arbiter: Arbiter, now: int, op: tuple[Any, ...], make: Callable[..., Policy]) -> Any:
    kind = op[0]
    try:
        if kind == "request":
            _, client, rid, size, priority = op
            request = ModelLoadRequest(id=rid, size=size, priority=priority)
            return arbiter.request(now, client, CLIENT_UIDS[client], request)
        if kind == "cancel":
            return arbiter.cancel(now, op[1], op[2])
        if kind == "loaded":
            return arbiter.notify_loaded(now, op[1], op[2])
        if kind == "unloaded":
            return arbiter.notify_unloaded(now, op[1], op[2])
        if kind == "importance":
            return arbiter.set_importance(now, op[1], op[2])
        if kind == "died":
            return arbiter.client_died(now, op[1])
        if kind == "work":
            return arbiter.work_ended(now, op[1], op[2])
        if kind == "tick":
            return arbiter.tick(now)
        weights, max_budget = op[1]
        return arbiter.set_policy(now, make(weights, max_budget))
    except NpuManagerError as exc:
        return type(exc)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(limits=LIMITS, data=st.data())
def test_incremental_budget_matches_the_naive_one(
    limits: tuple[tuple[int, ...], int], data: st.DataObject
) -> None:
    weights, max_budget = limits
    fast = Arbiter(BudgetPolicy(weights, max_budget), unload_grace_ms=2000)
    naive = Arbiter(NaiveBudgetPolicy(weights, max_budget), unload_grace_ms=2000)
    now = 0
    for step in range(data.draw(st.integers(0, 80))):
        now += data.draw(st.integers(0, 3000))
        op = _draw_op(data, fast)
        got = _apply(fast, now, op, BudgetPolicy)
        want = _apply(naive, now, op, NaiveBudgetPolicy)
        assert got == want, f"step {step}: {op}"
    assert fast.requests() == naive.requests()
    assert fast.next_deadline_ms() == naive.next_deadline_ms()


def test_many_not_prioritized_requests_agree() -> None:
    """A crowded arbiter (many uids, most requests refused) decides like the naive one."""
    fast = Arbiter(BudgetPolicy())
    naive = Arbiter(NaiveBudgetPolicy())
    now = 0
    for arbiter in (fast, naive):
        arbiter.set_importance(now, 5000, Importance.FOREGROUND)
        arbiter.request(now, 0, 5000, ModelLoadRequest(id=0, size=ModelSize.BETWEEN_1GB_AND_2GB))
        arbiter.notify_loaded(now, 0, 0)
    for i in range(1, 400):
        now += 1
        uid = 6000 + i % 37
        request = ModelLoadRequest(id=i, size=ModelSize(i % 3))
        assert fast.request(now, i, uid, request) == naive.request(now, i, uid, request)
        if i % 5 == 0:
            got = fast.set_importance(now, uid, (i * 7) % 1001)
            assert got == naive.set_importance(now, uid, (i * 7) % 1001)
        if i % 7 == 0:
            assert fast.work_ended(now, uid, EndReason.COMPLETED) == naive.work_ended(
                now, uid, EndReason.COMPLETED
            )
        if i % 11 == 0:
            assert fast.cancel(now, i - 3, i - 3) == naive.cancel(now, i - 3, i - 3)
    assert fast.requests() == naive.requests()
