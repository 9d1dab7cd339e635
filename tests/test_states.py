"""The state table: what each state allows, and the arbiter's guards and verbs following it."""

from __future__ import annotations

import pytest

from helpers.arbiter import BG, BG_CLIENT, FG, FG_CLIENT, big, ranked, small
from npumanager.core.arbiter.actions import RequestState
from npumanager.core.arbiter.arbiter import Arbiter
from npumanager.core.arbiter.states import (
    COMMITTED,
    ENDED,
    HOLDING,
    PENDING,
    TRANSITIONS,
    Step,
    allows,
    described,
    states_allowing,
)
from npumanager.errors import RequestStateError
from npumanager.plugins.policies.budget import budget

S = RequestState


def test_every_state_has_a_row_and_any_live_request_may_be_cancelled() -> None:
    assert set(TRANSITIONS) == set(RequestState)
    assert states_allowing(Step.CANCEL) == set(RequestState)
    for row in TRANSITIONS.values():
        assert all(target is ENDED or target in RequestState for target in row.values())


def test_the_state_classes_come_from_the_table() -> None:
    assert {S.GRANTED, S.LOADED, S.UNLOADING} == COMMITTED
    assert {S.GRANTED, S.WAITING, S.LOADED, S.UNLOADING} == HOLDING
    assert {S.WAITING, S.NOT_PRIORITIZED} == PENDING
    assert described(states_allowing(Step.UNLOADED)) == "granted, loaded or unloading"
    assert described(states_allowing(Step.LOADED)) == "granted"


def requests_in_every_state() -> tuple[Arbiter, dict[RequestState, int]]:
    """An arbiter holding a BG request in each state a client can see (by request id)."""
    arbiter = ranked(budget({"max_budget": 3, "weights": [1, 1, 1]}), unload_grace_ms=100)
    arbiter.request(0, BG_CLIENT, BG, small(1))
    arbiter.request(0, BG_CLIENT, BG, small(2))
    arbiter.notify_loaded(0, BG_CLIENT, 2)
    arbiter.request(0, BG_CLIENT, BG, small(3))
    arbiter.notify_loaded(0, BG_CLIENT, 3)
    arbiter.request(1, FG_CLIENT, FG, big(7))
    arbiter.request(1, BG_CLIENT, BG, small(4))
    ids = {}
    for request_id in (1, 2, 3, 4):
        ids[arbiter.state_of(BG_CLIENT, request_id)] = request_id
    return arbiter, ids


@pytest.mark.parametrize("step", [Step.LOADED, Step.UNLOADED])
def test_a_client_report_is_accepted_exactly_where_the_table_allows_it(step: Step) -> None:
    _, ids = requests_in_every_state()
    assert set(ids) == {S.GRANTED, S.LOADED, S.UNLOADING, S.NOT_PRIORITIZED}
    for state, request_id in ids.items():
        arbiter, _ = requests_in_every_state()
        report = arbiter.notify_loaded if step is Step.LOADED else arbiter.notify_unloaded
        if allows(state, step):
            report(2, BG_CLIENT, request_id)
        else:
            with pytest.raises(RequestStateError, match=f"is {state.value}; only a"):
                report(2, BG_CLIENT, request_id)
