"""The model-load events of the service's steps: a request, and each decision carried out."""

from __future__ import annotations

from npumanager.core.arbiter.actions import CanLoad, Complete, RequestKey, RequestUnload, Revoke
from npumanager.schemas import ModelLoadRequest
from npumanager.telemetry.events import (
    NO_VALUE,
    ModelLoadRequested,
    ModelLoadState,
    ModelLoadStateChanged,
)


def requested(
    uid: int, key: RequestKey, request: ModelLoadRequest, weight_bytes: int | None, now_us: int
) -> ModelLoadRequested:
    """A client's request, as it arrived."""
    return ModelLoadRequested(
        uid=uid,
        client=key.client,
        request_id=key.request_id,
        size=int(request.size),
        priority=int(request.priority),
        weight_bytes=NO_VALUE if weight_bytes is None else weight_bytes,
        time_us=now_us,
    )


def state_changed(
    uid: int,
    key: RequestKey,
    request: ModelLoadRequest,
    state: ModelLoadState,
    device: int | None,
    now_us: int,
    unload_reason: int = NO_VALUE,
) -> ModelLoadStateChanged:
    """A request's step to `state`."""
    return ModelLoadStateChanged(
        uid=uid,
        client=key.client,
        request_id=key.request_id,
        size=int(request.size),
        priority=int(request.priority),
        state=int(state),
        unload_reason=unload_reason,
        device=NO_VALUE if device is None else device,
        time_us=now_us,
    )


RequestAction = CanLoad | RequestUnload | Revoke | Complete
"""The decisions about one request."""


def from_action(
    uid: int, action: RequestAction, device: int | None, now_us: int
) -> ModelLoadStateChanged:
    """The step a decision about a request makes."""
    if isinstance(action, CanLoad | Complete):
        state, reason = ModelLoadState(action.status), NO_VALUE
    elif isinstance(action, RequestUnload):
        state, reason = ModelLoadState.UNLOAD_REQUESTED, int(action.reason)
    else:
        state, reason = ModelLoadState.REVOKED, int(action.reason)
    return state_changed(uid, action.key, action.request, state, device, now_us, reason)
