"""The pieces under the arbiter: the sorted index, the policy base and its context's guards."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.arbiter import kinds
from npumanager.core.arbiter.actions import RequestState
from npumanager.core.arbiter.arbiter import Arbiter
from npumanager.core.arbiter.policy import Entry, Policy, build_policy
from npumanager.schemas import ModelLoadRequest, ModelLoadStatus, PolicyRecord, UnloadReason
from npumanager.sortedlist import SortedKeys


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3000)), max_size=3000))
def test_sorted_keys_match_a_sorted_list(operations: list[tuple[bool, int]]) -> None:
    keys: SortedKeys[int] = SortedKeys()
    model: set[int] = set()
    for add, value in operations:
        if add and value not in model:
            keys.add(value)
            model.add(value)
        elif not add and value in model:
            keys.remove(value)
            model.discard(value)
        elif not add:
            with pytest.raises(KeyError):
                keys.remove(value)
    assert list(keys) == sorted(model)
    assert len(keys) == len(model)


def test_sorted_keys_split_long_runs_and_drop_empty_ones() -> None:
    keys: SortedKeys[tuple[int, int]] = SortedKeys()
    for value in range(2000):
        keys.add((value % 7, value))
    assert list(keys) == sorted((v % 7, v) for v in range(2000))
    for value in range(2000):
        keys.remove((value % 7, value))
    assert list(keys) == []
    with pytest.raises(KeyError):
        keys.remove((0, 0))


class Lazy(Policy):
    """A policy that decides nothing, to see the arbiter's fallbacks and guards."""

    name = "lazy"

    def admit(self, entry: Entry) -> None:
        """Leave the request undecided."""


def test_an_undecided_request_is_refused_and_the_base_hooks_do_nothing() -> None:
    arbiter = Arbiter(Lazy())
    actions = arbiter.request(0, 1, 5, ModelLoadRequest(id=1))
    assert kinds(actions) == [("can_load", 1, 1, ModelLoadStatus.NOT_PRIORITIZED)]
    assert arbiter.requests()[0].weight == 0
    assert arbiter.set_thermal(0, 0, 4) == []
    assert arbiter.cancel(0, 1, 1)[0].status == 3  # type: ignore[union-attr]


def test_the_context_refuses_illegal_moves() -> None:
    arbiter = Arbiter(status_quo_then(Lazy()))
    arbiter.request(0, 1, 5, ModelLoadRequest(id=1))
    arbiter.notify_loaded(0, 1, 1)
    policy = arbiter.policy
    entry = next(iter(policy.ctx.entries()))
    assert entry.state is RequestState.LOADED
    with pytest.raises(RuntimeError, match="cannot grant a request that is loaded"):
        policy.ctx.grant(entry)
    with pytest.raises(RuntimeError, match="cannot make a loaded request wait"):
        policy.ctx.wait(entry)
    with pytest.raises(RuntimeError, match="cannot refuse a request that is loaded"):
        policy.ctx.refuse(entry)
    policy.ctx.ask_unload(entry, UnloadReason.THERMAL)
    assert entry.state is RequestState.UNLOADING
    arbiter.request(0, 1, 5, ModelLoadRequest(id=2))
    granted = next(e for e in policy.ctx.entries() if e.state is RequestState.GRANTED)
    with pytest.raises(RuntimeError, match="cannot ask a granted request to unload"):
        policy.ctx.ask_unload(granted, UnloadReason.THERMAL)


def status_quo_then(policy: Policy) -> Policy:
    """`policy` with a grant-everything admit, so requests reach LOADED."""

    def admit(entry: Entry) -> None:
        policy.ctx.grant(entry)

    policy.admit = admit  # type: ignore[method-assign]
    return policy


def test_a_detached_policy_has_no_context_and_factories_must_build_policies() -> None:
    lazy = Lazy()
    with pytest.raises(RuntimeError, match="not attached"):
        _ = lazy.ctx
    arbiter = Arbiter(lazy)
    arbiter.set_policy(0, Lazy())
    assert not lazy.attached
    record = PolicyRecord(name="odd", factory=lambda params: object())
    with pytest.raises(TypeError, match="not a Policy"):
        build_policy(record)
