"""The arbiter's book of live requests, moved only along `core.states.TRANSITIONS`.

`Ledger` keeps the live requests (by key, uid and client), the unload deadlines and the
actions recorded for the input being handled; every change of a request's state goes
through `step` or `end`, which follow the table and tell the policy.
"""

from __future__ import annotations

import heapq

from npumanager.core.arbiter.actions import (
    Action,
    CanLoad,
    Complete,
    RequestKey,
    RequestState,
    RequestUnload,
    Revoke,
)
from npumanager.core.arbiter.policy import Entry, Policy
from npumanager.core.arbiter.states import ENDED, TRANSITIONS, Step, allows
from npumanager.schemas import ModelLoadRequestStatus, ModelLoadStatus, UnloadReason


class Ledger:
    """The live requests, their unload deadlines, and the actions of the current input."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.entries: dict[RequestKey, Entry] = {}
        self.by_uid: dict[int, dict[RequestKey, Entry]] = {}
        self.by_client: dict[int, dict[RequestKey, Entry]] = {}
        self.deadlines: list[tuple[int, int, RequestKey]] = []
        self.out: list[Action] = []

    def add(self, entry: Entry) -> None:
        """A new request (state NEW), tracked by the policy."""
        key = entry.key
        self.entries[key] = entry
        self.by_uid.setdefault(entry.uid, {})[key] = entry
        self.by_client.setdefault(key.client, {})[key] = entry
        self.policy.track(entry)

    def take(self) -> list[Action]:
        """The actions recorded since the last call; the earliest deadline left is live."""
        deadlines = self.deadlines
        while deadlines and not self.deadline_live(deadlines[0]):
            heapq.heappop(deadlines)
        out, self.out = self.out, []
        return out

    def deadline_live(self, deadline: tuple[int, int, RequestKey]) -> bool:
        """True while the request the deadline was set for is still unloading."""
        _, seq, key = deadline
        entry = self.entries.get(key)
        return entry is not None and entry.seq == seq and entry.state is RequestState.UNLOADING

    # Steps --------------------------------------------------------------------------------

    def step(self, entry: Entry, step: Step, device: int | None) -> None:
        """Move a live request along the table (the caller has checked `allows`)."""
        target = TRANSITIONS[entry.state][step]
        assert target is not ENDED, f"{step} ends a request; use end()"
        old_state, old_device = entry.state, entry.device
        entry.state = target
        entry.device = device
        if target is not RequestState.UNLOADING:
            entry.unload_deadline_ms = None
        self.policy.moved(entry, old_state, old_device)

    def move_reservation(self, entry: Entry, device: int | None) -> None:
        """A waiting request keeps waiting, for another device."""
        old = entry.device
        entry.device = device
        self.policy.moved(entry, entry.state, old)

    def end(self, entry: Entry, step: Step) -> None:
        """End a live request by a step that ends it: CANCELLED for a cancel, else COMPLETE."""
        assert TRANSITIONS[entry.state].get(step, entry.state) is ENDED, step
        if step is Step.REVOKE:
            self.out.append(Revoke(entry.key, entry.request, UnloadReason.CLIENT_UNRESPONSIVE))
        key = entry.key
        del self.entries[key]
        for index, group in ((self.by_uid, entry.uid), (self.by_client, key.client)):
            held = index[group]
            del held[key]
            if not held:
                del index[group]
        status = (
            ModelLoadRequestStatus.CANCELLED
            if step is Step.CANCEL
            else ModelLoadRequestStatus.COMPLETE
        )
        self.out.append(Complete(key, entry.request, status))
        self.policy.untrack(entry)

    # The policy's verbs -------------------------------------------------------------------

    def grant(self, entry: Entry, device: int | None) -> None:
        """Tell the request CAN_LOAD_NOW (on `device`)."""
        if entry.state is RequestState.GRANTED and entry.device == device:
            return
        self._check_verb(entry, Step.GRANT, "cannot grant a request that is {}")
        self.out.append(CanLoad(entry.key, entry.request, ModelLoadStatus.CAN_LOAD_NOW, device))
        self.step(entry, Step.GRANT, device)

    def wait(self, entry: Entry, device: int | None) -> None:
        """Tell the request WAIT_FOR_UNLOAD; a waiting one only moves its reservation."""
        if entry.state is RequestState.WAITING:
            if entry.device != device:
                self.move_reservation(entry, device)
            return
        self._check_verb(entry, Step.WAIT, "cannot make a {} request wait")
        self.out.append(CanLoad(entry.key, entry.request, ModelLoadStatus.WAIT_FOR_UNLOAD, device))
        self.step(entry, Step.WAIT, device)

    def refuse(self, entry: Entry) -> None:
        """Tell the request NOT_PRIORITIZED."""
        if entry.state is RequestState.NOT_PRIORITIZED:
            return
        self._check_verb(entry, Step.REFUSE, "cannot refuse a request that is {}")
        self.out.append(CanLoad(entry.key, entry.request, ModelLoadStatus.NOT_PRIORITIZED))
        self.step(entry, Step.REFUSE, None)

    def ask_unload(self, entry: Entry, reason: UnloadReason, deadline_ms: int) -> None:
        """Ask a loaded request to unload by `deadline_ms`, when it is revoked if still there."""
        if entry.state is RequestState.UNLOADING:
            return
        self._check_verb(entry, Step.ASK_UNLOAD, "cannot ask a {} request to unload")
        self.out.append(RequestUnload(entry.key, entry.request, reason))
        entry.unload_deadline_ms = deadline_ms
        heapq.heappush(self.deadlines, (deadline_ms, entry.seq, entry.key))
        self.step(entry, Step.ASK_UNLOAD, entry.device)

    @staticmethod
    def _check_verb(entry: Entry, step: Step, problem: str) -> None:
        if not allows(entry.state, step):
            raise RuntimeError(f"policy bug: {problem.format(entry.state.value)}")

    def expire(self, now_ms: int) -> bool:
        """Revoke the requests whose unload deadline passed by `now_ms`; True if any was."""
        expired = False
        deadlines = self.deadlines
        while deadlines and deadlines[0][0] <= now_ms:
            deadline = heapq.heappop(deadlines)
            if self.deadline_live(deadline):
                self.end(self.entries[deadline[2]], Step.REVOKE)
                expired = True
        return expired
