"""The platform's budget policy (and turn taking, its one-model case), kept incrementally.

Each size class has a weight; the weights of requests holding budget (granted, waiting,
loaded, unloading) may not exceed the maximum, and committed ones (granted, loaded,
unloading) never do. `BudgetPolicy` keeps the indices that make each event cost about
the number of models that fit; `NaiveBudgetPolicy` recomputes everything from a scan of
all requests, as the platform does, and serves as the reference in tests and benchmarks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict

from npumanager.core.arbiter.actions import RequestState
from npumanager.core.arbiter.policy import (
    COMMITTED,
    HOLDING,
    PENDING,
    Entry,
    Policy,
    Rank,
    make_room,
    validate_params,
)
from npumanager.schemas import ModelSize, UnloadReason
from npumanager.schemas.limits import DEFAULT_BUDGET_WEIGHTS, DEFAULT_MAX_BUDGET, MAX_BUDGET_VALUE
from npumanager.sortedlist import SortedKeys

Key = tuple[int, int, int, int]
"""(priority, last completion, uid, arrival): a request's place, most important first."""

PositiveInt = Annotated[int, Strict(), Field(gt=0, le=MAX_BUDGET_VALUE)]
_CLASSES = len(ModelSize)
TURN_TAKING_WEIGHTS = (1,) * _CLASSES
TURN_TAKING_MAX_BUDGET = 1


class BudgetParams(BaseModel):
    """Parameters of the `budget` policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights: Annotated[tuple[PositiveInt, ...], Field(min_length=_CLASSES, max_length=_CLASSES)] = (
        Field(
            default=DEFAULT_BUDGET_WEIGHTS,
            description=(
                f"{_CLASSES} positive ints, the weight of each size class, smallest class first "
                f"(default {list(DEFAULT_BUDGET_WEIGHTS)})"
            ),
        )
    )
    max_budget: PositiveInt = Field(
        default=DEFAULT_MAX_BUDGET,
        description=(
            f"a positive int (at most {MAX_BUDGET_VALUE}) that the weights of admitted loads "
            f"may not exceed (default {DEFAULT_MAX_BUDGET})"
        ),
    )


def _check_limits(weights: Sequence[int], max_budget: int) -> tuple[tuple[int, ...], int]:
    raw = {"weights": tuple(weights), "max_budget": max_budget}
    validated = validate_params("budget", BudgetParams, raw)
    assert isinstance(validated, BudgetParams)
    return validated.weights, validated.max_budget


class _BudgetBase(Policy):
    """What both budget implementations share: names, weights and the limit."""

    def __init__(
        self,
        weights: Sequence[int] = DEFAULT_BUDGET_WEIGHTS,
        max_budget: int = DEFAULT_MAX_BUDGET,
        *,
        name: str = "budget",
        params: BaseModel | None = None,
    ) -> None:
        super().__init__()
        self.weights, self.max_budget = _check_limits(weights, max_budget)
        self.name = name
        self.params = params

    def weight(self, entry: Entry) -> int:
        """The weight of the request's size class."""
        return self.weights[entry.request.size]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(weights={self.weights}, max_budget={self.max_budget})"


class BudgetPolicy(_BudgetBase):
    """The budget policy with indices: per-class rank-ordered candidates and the holders.

    Candidates (every live request not unloading) sit in one sorted set per size class,
    keyed by rank; the greedy choice of the ideal set merges the three and drops a class
    at its first request that does not fit, so it visits about as many requests as fit.
    Holders (granted, waiting, loaded, unloading) are few: at most twice the budget.
    """

    def __init__(
        self,
        weights: Sequence[int] = DEFAULT_BUDGET_WEIGHTS,
        max_budget: int = DEFAULT_MAX_BUDGET,
        *,
        name: str = "budget",
        params: BaseModel | None = None,
    ) -> None:
        super().__init__(weights, max_budget, name=name, params=params)
        self._entries: dict[int, Entry] = {}
        self._keys: dict[int, Key] = {}
        self._classes: list[SortedKeys[Key]] = [SortedKeys() for _ in range(_CLASSES)]
        self._held: dict[int, Entry] = {}
        self._held_weight = 0
        self._committed_weight = 0
        self._pending_by_uid: Counter[int] = Counter()
        self._pending_by_priority: Counter[int] = Counter()

    @property
    def committed_weight(self) -> int:
        """Weight of the granted, loaded and unloading requests."""
        return self._committed_weight

    def track(self, entry: Entry) -> None:
        """Index a live request."""
        self._entries[entry.seq] = entry
        self._enter(entry, entry.state)

    def untrack(self, entry: Entry) -> None:
        """Forget an ended request."""
        self._leave(entry, entry.state)
        del self._entries[entry.seq]

    def moved(self, entry: Entry, old_state: RequestState, old_device: int | None) -> None:
        """Move a request between the indices its old and new state belong to."""
        if old_state is not entry.state:
            self._leave(entry, old_state)
            self._enter(entry, entry.state)

    def rank_changed(self, uid: int, old_rank: Rank) -> None:
        """Re-key the uid's candidates, and move its pending count to its new priority."""
        rank = self.ctx.rank(uid)
        classes, keys = self._classes, self._keys
        for entry in self.ctx.entries_of_uid(uid):
            old_key = keys.get(entry.seq)
            if old_key is not None:
                key = (*rank, entry.seq)
                keys[entry.seq] = key
                size_class = classes[entry.request.size]
                size_class.remove(old_key)
                size_class.add(key)
        pending = self._pending_by_uid[uid]
        if pending and old_rank[0] != rank[0]:
            self._pending_by_priority[old_rank[0]] -= pending
            self._pending_by_priority[rank[0]] += pending

    def _enter(self, entry: Entry, state: RequestState) -> None:
        if state is not RequestState.UNLOADING:
            key = (*self.ctx.rank(entry.uid), entry.seq)
            self._keys[entry.seq] = key
            self._classes[entry.request.size].add(key)
        if state in HOLDING:
            self._held[entry.seq] = entry
            self._held_weight += self.weights[entry.request.size]
            if state in COMMITTED:
                self._committed_weight += self.weights[entry.request.size]
        if state in PENDING:  # WAITING is both holding and pending
            self._pending_by_uid[entry.uid] += 1
            self._pending_by_priority[self.ctx.uid_priority(entry.uid)] += 1

    def _leave(self, entry: Entry, state: RequestState) -> None:
        if state is not RequestState.UNLOADING:
            self._classes[entry.request.size].remove(self._keys.pop(entry.seq))
        if state in HOLDING:
            del self._held[entry.seq]
            self._held_weight -= self.weights[entry.request.size]
            if state in COMMITTED:
                self._committed_weight -= self.weights[entry.request.size]
        if state in PENDING:
            self._pending_by_uid[entry.uid] -= 1
            if not self._pending_by_uid[entry.uid]:
                del self._pending_by_uid[entry.uid]
            self._pending_by_priority[self.ctx.uid_priority(entry.uid)] -= 1

    def admit(self, entry: Entry) -> None:
        """Grant if it fits; else free budget from less important uids, or refuse."""
        ctx, weights = self.ctx, self.weights
        weight = weights[entry.request.size]
        if self._held_weight + weight <= self.max_budget:
            ctx.grant(entry)
            return
        needed = self._held_weight + weight - self.max_budget
        priority, last, uid, _ = self._keys[entry.seq]
        held = [(ctx.rank(h.uid), h.seq, h) for h in self._held.values() if h.uid != uid]
        held.sort(key=lambda item: (item[0], item[1]), reverse=True)
        victims = []
        for (other_priority, other_last, _), _, other in held:
            if other_priority < priority:
                break
            if other_priority == priority and last >= other_last:
                continue
            victims.append(other)
            needed -= weights[other.request.size]
            if needed <= 0:
                break
        _resolve(self, entry, victims if needed <= 0 else None)

    def reevaluate(self, cause: UnloadReason | None = None) -> None:
        """Recompute the ideal set and bring the holders in line with it."""
        ctx, weights, keys = self.ctx, self.weights, self._keys
        ideal = self._ideal()
        chosen = {e.seq for e in ideal}
        outside = [
            h
            for h in self._held.values()
            if h.seq not in chosen and h.state is not RequestState.UNLOADING
        ]
        outside.sort(key=lambda h: keys[h.seq])
        reason = cause or UnloadReason.HIGHER_PRIORITY_REQUEST
        for other in outside:
            if other.state is RequestState.LOADED:
                ctx.ask_unload(other, reason)
            else:
                ctx.cancel(other)
        for entry in ideal:
            if entry.state is RequestState.LOADED or entry.state is RequestState.GRANTED:
                continue
            if self._committed_weight + weights[entry.request.size] <= self.max_budget:
                ctx.grant(entry)
            else:
                ctx.wait(entry)

    def _ideal(self) -> list[Entry]:
        remaining, weights = self.max_budget, self.weights
        iterators = [iter(size_class) for size_class in self._classes]
        heads: dict[int, Key] = {}
        for size, iterator in enumerate(iterators):
            first = next(iterator, None)
            if first is not None:
                heads[size] = first
        chosen = []
        while heads and remaining > 0:
            size = min(heads, key=heads.__getitem__)
            if weights[size] > remaining:
                del heads[size]
                continue
            chosen.append(self._entries[heads[size][3]])
            remaining -= weights[size]
            following = next(iterators[size], None)
            if following is None:
                del heads[size]
            else:
                heads[size] = following
        return chosen

    def work_completed(self, uid: int) -> None:
        """Turn taking: if an equal-priority uid is waiting, the completer unloads."""
        priority = self.ctx.uid_priority(uid)
        if self._pending_by_priority[priority] - self._pending_by_uid[uid] <= 0:
            return
        loaded = sorted(
            (h for h in self._held.values() if h.uid == uid and h.state is RequestState.LOADED),
            key=lambda h: h.seq,
        )
        for entry in loaded:
            self.ctx.ask_unload(entry, UnloadReason.TURN_TAKING)


def _resolve(policy: Policy, entry: Entry, victims: list[Entry] | None) -> None:
    ctx = policy.ctx
    if victims is None:
        ctx.refuse(entry)
        return
    if make_room(ctx, victims, ctx.cancel):
        ctx.wait(entry)
    else:
        ctx.grant(entry)


class NaiveBudgetPolicy(_BudgetBase):
    """The budget policy recomputed from a scan of every request on every event.

    The reference for `BudgetPolicy`: same decisions, same action order, no indices.
    """

    def _rank_key(self, entry: Entry) -> tuple[Rank, int]:
        return (self.ctx.rank(entry.uid), entry.seq)

    def admit(self, entry: Entry) -> None:
        """Grant if it fits; else walk the uids from least important, or refuse."""
        ctx = self.ctx
        others = [e for e in ctx.entries() if e is not entry]
        held = sum(self.weight(e) for e in others if e.state in HOLDING)
        if held + self.weight(entry) <= self.max_budget:
            ctx.grant(entry)
            return
        needed = held + self.weight(entry) - self.max_budget
        priority, last, _ = ctx.rank(entry.uid)
        uids = sorted({e.uid for e in others}, key=ctx.rank, reverse=True)
        victims: list[Entry] = []
        for uid in uids:
            if uid == entry.uid:
                continue
            other_priority, other_last, _ = ctx.rank(uid)
            if other_priority < priority:
                break
            if other_priority == priority and last >= other_last:
                continue
            for other in reversed(list(ctx.entries_of_uid(uid))):
                if other.state in HOLDING:
                    victims.append(other)
                    needed -= self.weight(other)
                    if needed <= 0:
                        break
            if needed <= 0:
                break
        _resolve(self, entry, victims if needed <= 0 else None)

    def reevaluate(self, cause: UnloadReason | None = None) -> None:
        """Sort every candidate, choose greedily, then unload, cancel and grant."""
        ctx = self.ctx
        candidates = sorted(
            (e for e in ctx.entries() if e.state is not RequestState.UNLOADING),
            key=self._rank_key,
        )
        remaining = self.max_budget
        ideal = []
        for entry in candidates:
            if self.weight(entry) <= remaining:
                ideal.append(entry)
                remaining -= self.weight(entry)
        chosen = {e.seq for e in ideal}
        reason = cause or UnloadReason.HIGHER_PRIORITY_REQUEST
        for other in candidates:
            if other.seq in chosen or other.state not in HOLDING:
                continue
            if other.state is RequestState.LOADED:
                ctx.ask_unload(other, reason)
            else:
                ctx.cancel(other)
        for entry in ideal:
            if entry.state in (RequestState.LOADED, RequestState.GRANTED):
                continue
            committed = sum(self.weight(e) for e in ctx.entries() if e.state in COMMITTED)
            if committed + self.weight(entry) <= self.max_budget:
                ctx.grant(entry)
            else:
                ctx.wait(entry)

    def work_completed(self, uid: int) -> None:
        """Turn taking, found by scanning every request."""
        ctx = self.ctx
        priority = ctx.uid_priority(uid)
        if not any(
            e.uid != uid and ctx.uid_priority(e.uid) == priority and e.state in PENDING
            for e in ctx.entries()
        ):
            return
        for entry in list(ctx.entries_of_uid(uid)):
            if entry.state is RequestState.LOADED:
                ctx.ask_unload(entry, UnloadReason.TURN_TAKING)


def budget(params: BudgetParams | Mapping[str, Any] | None) -> BudgetPolicy:
    """The `budget` policy from its parameters (validated here if they are not yet)."""
    validated = validate_params("budget", BudgetParams, params)
    assert isinstance(validated, BudgetParams)
    return BudgetPolicy(validated.weights, validated.max_budget, name="budget", params=validated)


def turn_taking(params: Mapping[str, Any] | None) -> BudgetPolicy:
    """The `turn_taking` policy: one model at a time, whatever its size; no parameters."""
    validate_params("turn_taking", None, params)
    return BudgetPolicy(TURN_TAKING_WEIGHTS, TURN_TAKING_MAX_BUDGET, name="turn_taking")
