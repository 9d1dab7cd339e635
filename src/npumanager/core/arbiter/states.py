"""How a model-load request moves: one table of the steps allowed in each state.

`TRANSITIONS[state][step]` is where a request in `state` goes on `step` (`ENDED` when the
request is over); a step missing from a state's row is not allowed there. The arbiter's
input guards, the policy verbs (`core.ledger`) and the policies' state classes
(`HOLDING`, `COMMITTED`, `PENDING`) all come from it, in the manner of h11's `_state.py`.
A verb that would leave a request where it already is changes nothing (granting the same
device again, refusing a refused request, asking an unloading one again); a waiting
request told to wait again only moves its reservation.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from npumanager.core.arbiter.actions import RequestState


class Step(StrEnum):
    """What can happen to a request: a policy's verb, a client's report, or the clock."""

    GRANT = "grant"
    """Policy: CAN_LOAD_NOW."""
    WAIT = "wait"
    """Policy: WAIT_FOR_UNLOAD, a reservation while others unload."""
    REFUSE = "refuse"
    """Policy: NOT_PRIORITIZED."""
    ASK_UNLOAD = "ask_unload"
    """Policy: `on_request_unload_model`; the grace period starts."""
    CANCEL = "cancel"
    """Client or policy: the request ends CANCELLED."""
    LOADED = "loaded"
    """Client: the model is in driver memory."""
    UNLOADED = "unloaded"
    """Client: the model is out of memory; the request ends COMPLETE."""
    REVOKE = "revoke"
    """Clock or death: the models are taken away and the request ends COMPLETE."""


ENDED: Final = None
"""Where a step that ends the request leads."""

_S = RequestState
TRANSITIONS: Final[Mapping[RequestState, Mapping[Step, RequestState | None]]] = {
    _S.NEW: {
        Step.GRANT: _S.GRANTED,
        Step.WAIT: _S.WAITING,
        Step.REFUSE: _S.NOT_PRIORITIZED,
        Step.CANCEL: ENDED,
    },
    _S.GRANTED: {
        Step.REFUSE: _S.NOT_PRIORITIZED,
        Step.LOADED: _S.LOADED,
        Step.UNLOADED: ENDED,
        Step.CANCEL: ENDED,
    },
    _S.WAITING: {
        Step.GRANT: _S.GRANTED,
        Step.REFUSE: _S.NOT_PRIORITIZED,
        Step.CANCEL: ENDED,
    },
    _S.LOADED: {
        Step.ASK_UNLOAD: _S.UNLOADING,
        Step.UNLOADED: ENDED,
        Step.REVOKE: ENDED,
        Step.CANCEL: ENDED,
    },
    _S.UNLOADING: {Step.UNLOADED: ENDED, Step.REVOKE: ENDED, Step.CANCEL: ENDED},
    _S.NOT_PRIORITIZED: {Step.GRANT: _S.GRANTED, Step.WAIT: _S.WAITING, Step.CANCEL: ENDED},
}


def allows(state: RequestState, step: Step) -> bool:
    """True if a request in `state` may take `step`."""
    return step in TRANSITIONS[state]


def states_allowing(step: Step) -> frozenset[RequestState]:
    """Every state from which `step` is allowed."""
    return frozenset(state for state, row in TRANSITIONS.items() if step in row)


def described(states: frozenset[RequestState]) -> str:
    """The states in table order, for a message: 'granted, loaded or unloading'."""
    names = [state.value for state in TRANSITIONS if state in states]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


COMMITTED: Final = states_allowing(Step.UNLOADED)
"""States whose model may be in device memory now: the client may report it unloaded."""
HOLDING: Final = COMMITTED | {RequestState.WAITING}
"""States whose weight counts against a budget: granted or chosen, until the request ends."""
PENDING: Final = states_allowing(Step.GRANT) - {RequestState.NEW}
"""States of a request that was answered, wants to load and may not yet."""
