"""What the arbiter decides: the actions the service carries out.

The arbiter never calls out. Each of its inputs returns a list of these, in the order
the service must perform them; the service delivers callbacks, relays configs to the
driver and revokes models. That is what lets one decision logic run in virtual time
(tests, the demo, hypothesis) and in real time (the daemon).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from npumanager.schemas import (
    ModelLoadRequest,
    ModelLoadRequestStatus,
    ModelLoadStatus,
    SchedulingConfig,
    UnloadReason,
)


class RequestState(StrEnum):
    """Where one model-load request stands."""

    NEW = "new"
    """Just received; no decision delivered yet."""
    GRANTED = "granted"
    """Told CAN_LOAD_NOW; holds its share until it reports loaded, unloaded or is cancelled."""
    WAITING = "waiting"
    """Told WAIT_FOR_UNLOAD: chosen, but others must unload first; holds its share."""
    LOADED = "loaded"
    """Reported loaded."""
    UNLOADING = "unloading"
    """Asked to unload; still holds its share until it reports unloaded or is revoked."""
    NOT_PRIORITIZED = "not_prioritized"
    """Told NOT_PRIORITIZED; holds nothing, may still be chosen later."""


@dataclass(frozen=True, order=True)
class RequestKey:
    """A request is known by its client and its id: two clients may reuse an id."""

    client: int
    request_id: int


@dataclass(frozen=True)
class CanLoad:
    """Deliver `on_can_load_model(request, status, listener)`.

    `device` is the device the model should go on when the policy placed it, else None.
    """

    key: RequestKey
    request: ModelLoadRequest
    status: ModelLoadStatus
    device: int | None = None


@dataclass(frozen=True)
class RequestUnload:
    """Deliver `on_request_unload_model(request, reason)`; the grace period starts."""

    key: RequestKey
    request: ModelLoadRequest
    reason: UnloadReason


@dataclass(frozen=True)
class Complete:
    """Deliver `on_model_load_request_complete(request, status)`; the request is gone."""

    key: RequestKey
    request: ModelLoadRequest
    status: ModelLoadRequestStatus


@dataclass(frozen=True)
class Revoke:
    """Take the request's models off the device now (its work ends CANCELLED_SYSTEM).

    Issued when a client ignored an unload request past the grace period, or died; a
    `Complete` for the same key follows in the same list.
    """

    key: RequestKey
    request: ModelLoadRequest
    reason: UnloadReason


@dataclass(frozen=True)
class RelayConfigs:
    """Send scheduling configs to the driver: the whole set, or an update of some uids."""

    configs: tuple[SchedulingConfig, ...]
    replace_all: bool


RequestAction = CanLoad | RequestUnload | Complete | Revoke
"""An action about one request (everything but a config relay)."""
Action = RequestAction | RelayConfigs
