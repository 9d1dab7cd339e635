"""The arbiter tests' cast: a cached app (BG) and a foreground one (FG), their clients,
a small and a big model request, an arbiter that ranks them, and a compact view of its
actions."""

from __future__ import annotations

from typing import Any

from npumanager.core.arbiter.actions import Action, CanLoad, Complete, RequestUnload, Revoke
from npumanager.core.arbiter.arbiter import Arbiter
from npumanager.core.arbiter.policy import Policy
from npumanager.schemas import Importance, ModelLoadRequest, ModelSize

BG, FG = 10_001, 10_002
BG_CLIENT, FG_CLIENT = 1, 2


def big(request_id: int) -> ModelLoadRequest:
    return ModelLoadRequest(id=request_id, size=ModelSize.GREATER_THAN_2G)


def small(request_id: int) -> ModelLoadRequest:
    return ModelLoadRequest(id=request_id, size=ModelSize.LESS_THAN_1GB)


def ranked(policy: Policy, **kwargs: Any) -> Arbiter:
    """An arbiter where BG is a cached app and FG the foreground one."""
    arbiter = Arbiter(policy, **kwargs)
    arbiter.set_importance(0, BG, Importance.CACHED)
    arbiter.set_importance(0, FG, Importance.FOREGROUND)
    return arbiter


def kinds(actions: list[Action]) -> list[tuple[Any, ...]]:
    """A compact view: (type, client, request id, status or reason)."""
    view: list[tuple[Any, ...]] = []
    for a in actions:
        if isinstance(a, CanLoad):
            view.append(("can_load", a.key.client, a.key.request_id, a.status))
        elif isinstance(a, RequestUnload):
            view.append(("unload", a.key.client, a.key.request_id, a.reason))
        elif isinstance(a, Revoke):
            view.append(("revoke", a.key.client, a.key.request_id, a.reason))
        elif isinstance(a, Complete):
            view.append(("complete", a.key.client, a.key.request_id, a.status))
        else:
            view.append(("relay", tuple(c.uid for c in a.configs), a.replace_all))
    return view
