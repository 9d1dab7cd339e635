"""One lock discipline: arbiter queries change nothing, and every arbiter call holds the lock."""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from helpers.arbiter import BG, BG_CLIENT, FG, FG_CLIENT, ranked, small
from npumanager import Importance, ModelLoadRequestCallback, ModelLoadStatus, Service
from npumanager.core.arbiter.arbiter import Arbiter
from npumanager.errors import UnknownRequestError
from npumanager.plugins.policies.budget import budget
from npumanager.schemas import ModelLoadRequest, ModelSize

QUERIES: dict[str, Callable[[Arbiter], object]] = {
    "next_deadline_ms": lambda a: a.next_deadline_ms(),
    "requests": lambda a: a.requests(),
    "state_of": lambda a: a.state_of(BG_CLIENT, 1),
    "declared_bytes": lambda a: a.declared_bytes(BG_CLIENT, 1),
    "uid_priority": lambda a: a.uid_priority(BG),
    "rank": lambda a: a.rank(BG),
    "scheduling_configs": lambda a: a.scheduling_configs(),
    "scheduling_config": lambda a: a.scheduling_config(12_345),
    "thermal": lambda a: a.thermal(0),
    "policy": lambda a: a.policy,
    "memory_pressure": lambda a: a.memory_pressure,
    "capacities": lambda a: a.capacities,
}


def state(arbiter: Arbiter) -> dict[str, Any]:
    """Everything the arbiter and its policy hold, containers copied one level deep."""

    def held(value: object) -> object:
        return copy.copy(value) if isinstance(value, list | dict | set | tuple) else value

    parts = {"": arbiter, "policy.": arbiter.policy}
    for name, value in vars(arbiter).items():
        if type(value).__module__.startswith("npumanager.core.") and hasattr(value, "__dict__"):
            parts[f"{name}."] = value
    return {
        f"{prefix}{name}": held(value)
        for prefix, part in parts.items()
        for name, value in vars(part).items()
    }


def with_stale_deadlines() -> Arbiter:
    """An arbiter whose deadline heap holds entries of requests that are no longer unloading."""
    arbiter = ranked(budget({"max_budget": 2, "weights": [1, 1, 1]}), unload_grace_ms=100)
    for request_id in (1, 2):
        arbiter.request(0, BG_CLIENT, BG, small(request_id))
        arbiter.notify_loaded(0, BG_CLIENT, request_id)
    arbiter.request(10, FG_CLIENT, FG, small(8))
    arbiter.request(20, FG_CLIENT, FG, small(9))
    arbiter.notify_unloaded(30, BG_CLIENT, 1)
    arbiter.notify_unloaded(40, BG_CLIENT, 2)
    return arbiter


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_an_arbiter_query_leaves_the_arbiter_unchanged(name: str) -> None:
    arbiter = with_stale_deadlines()
    arbiter.request(50, BG_CLIENT, BG, small(1), weight_bytes=7)
    before = state(arbiter)
    QUERIES[name](arbiter)
    assert state(arbiter) == before


def test_the_next_deadline_is_the_earliest_live_one_after_every_input() -> None:
    arbiter = with_stale_deadlines()
    assert arbiter.next_deadline_ms() is None
    assert arbiter.tick(1_000) == []


# Every arbiter call of a service holds the service lock ------------------------------------


@pytest.fixture
def lock_violations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Arbiter calls made without the owning service's lock held, by method name.

    An arbiter takes part once `arbiter.owner_lock` is set; calls before that (the service's
    constructor) are not checked.
    """
    violations: list[str] = []
    for name, member in vars(Arbiter).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            getter = member.fget
            assert getter is not None
            monkeypatch.setattr(Arbiter, name, property(_checked(name, getter, violations)))
        elif callable(member):
            monkeypatch.setattr(Arbiter, name, _checked(name, member, violations))
    yield violations


def _checked(name: str, method: Callable[..., Any], violations: list[str]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Arbiter, *args: Any, **kwargs: Any) -> Any:
        lock = self.__dict__.get("owner_lock")
        if lock is not None and not lock._is_owned():
            violations.append(f"{name} on {threading.current_thread().name}")
        return method(self, *args, **kwargs)

    return call


class Stubborn(ModelLoadRequestCallback):
    """Loads when granted and never unloads when asked: its deadline expires."""

    def __init__(self) -> None:
        self.granted = threading.Event()

    def on_can_load_model(self, request: ModelLoadRequest, status: Any, listener: Any) -> None:
        if status == ModelLoadStatus.CAN_LOAD_NOW:
            listener.notify_model_loaded(request)
            self.granted.set()


def test_every_arbiter_call_of_a_real_time_service_holds_the_service_lock(
    lock_violations: list[str],
) -> None:
    with Service("vnpu", "turn_taking", clock="real", unload_grace_ms=5) as svc:
        svc.arbiter.owner_lock = svc._state.locked()  # type: ignore[attr-defined]
        svc.set_uid_importance(BG, Importance.CACHED)
        svc.set_uid_importance(FG, Importance.FOREGROUND)
        background = svc.manager(BG, uses_feature=True)
        foreground = svc.manager(FG, uses_feature=True)
        big = ModelSize.GREATER_THAN_2G

        def churn(offset: int) -> None:
            for n in range(20):
                request = ModelLoadRequest.Builder(offset + n).set_size(big).build()
                holder = Stubborn()
                background.request_can_load_model(request, holder)
                if holder.granted.wait(2):
                    svc.state_of(background, request)
                asker = ModelLoadRequest.Builder(offset + n).set_size(big).build()
                foreground.request_can_load_model(asker, ModelLoadRequestCallback())
                with contextlib.suppress(UnknownRequestError):
                    foreground.cancel_model_load(asker)

        threads = [threading.Thread(target=churn, args=(k * 100,)) for k in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        threading.Event().wait(0.2)
    assert lock_violations == []
