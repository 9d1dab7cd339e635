"""What an app implements to hear the service's decisions, and the checks the backends run on it."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Protocol

from npumanager.schemas import (
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    UnloadReason,
)


class StatusListener(Protocol):
    """The token a decision comes with: report loaded and unloaded through it."""

    def notify_model_loaded(self, request: ModelLoadRequest) -> None:
        """The model is fully in driver memory."""

    def notify_model_unloaded(self, request: ModelLoadRequest) -> None:
        """The model is out of driver memory; the request completes."""


class ModelLoadRequestCallback:
    """Override what you need; every method does nothing by default."""

    def on_can_load_model(
        self, request: ModelLoadRequest, status: ModelLoadStatus, listener: StatusListener
    ) -> None:
        """A decision: load now, wait for others to unload, or not now."""

    def on_request_unload_model(
        self, request: ModelLoadRequest, reason: UnloadReason | None = None
    ) -> None:
        """Release the model, then call ``listener.notify_model_unloaded(request)``."""

    def on_model_load_request_complete(
        self, request: ModelLoadRequest, status: ModelLoadRequestStatus
    ) -> None:
        """The request is over: CANCELLED (before loading) or COMPLETE (unloaded)."""


def takes_reason(callback: object) -> bool:
    """True if the callback's `on_request_unload_model` accepts a reason argument."""
    method = getattr(callback, "on_request_unload_model", None)
    if method is None:
        return False
    function = getattr(method, "__func__", None)
    if function is None:
        return _accepts_two(method)
    return _function_accepts_reason(function)


@functools.lru_cache(maxsize=256)
def _function_accepts_reason(function: Any) -> bool:
    """For a plain function (self, request[, reason]): whether the reason fits."""
    return _accepts_two(functools.partial(function, None))


def _accepts_two(method: Any) -> bool:
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return True
    params = list(signature.parameters.values())
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params):
        return True
    return len(params) >= 2


def check_callback(callback: object) -> None:
    """A `TypeError` naming what is missing, unless `callback` has the three methods."""
    missing = [
        name
        for name in (
            "on_can_load_model",
            "on_request_unload_model",
            "on_model_load_request_complete",
        )
        if not callable(getattr(callback, name, None))
    ]
    if missing:
        raise TypeError(
            f"callback must implement {', '.join(missing)} "
            "(subclass npumanager.ModelLoadRequestCallback)"
        )
