"""What one uid may hold through the daemon, and what each uid holds now.

A hostile or broken client must not take what other clients need: connections (and so
descriptors), live requests and loaded models are counted per uid against caps, with
management uids exempt so an administrator can always get in and look.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

from npumanager.errors import QuotaExceededError
from npumanager.schemas.limits import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_BUFFERED_BYTES,
    DEFAULT_MAX_CONNECTIONS_PER_UID,
    DEFAULT_MAX_INFERENCES_PER_CONNECTION,
    DEFAULT_MAX_MODEL_FILE_BYTES,
    DEFAULT_MAX_MODELS_PER_UID,
    DEFAULT_MAX_REQUESTS_PER_UID,
    DEFAULT_MAX_SHARED_BYTES,
)

Resource = Literal["connections", "requests", "models"]

_OPTION: dict[Resource, str] = {
    "connections": "--max-connections-per-uid",
    "requests": "--max-requests-per-uid",
    "models": "--max-models-per-uid",
}


@dataclass(frozen=True)
class DaemonLimits:
    """The daemon's caps; `serve` options set each (see `npu-manager serve --help`)."""

    max_connections_per_uid: int = DEFAULT_MAX_CONNECTIONS_PER_UID
    max_requests_per_uid: int = DEFAULT_MAX_REQUESTS_PER_UID
    max_models_per_uid: int = DEFAULT_MAX_MODELS_PER_UID
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_shared_bytes: int = DEFAULT_MAX_SHARED_BYTES
    max_inferences_per_connection: int = DEFAULT_MAX_INFERENCES_PER_CONNECTION
    max_model_file_bytes: int = DEFAULT_MAX_MODEL_FILE_BYTES

    def cap(self, resource: Resource) -> int:
        """The per-uid cap of one resource."""
        if resource == "connections":
            return self.max_connections_per_uid
        if resource == "requests":
            return self.max_requests_per_uid
        return self.max_models_per_uid


class UidUsage:
    """Per-uid counts of connections, live requests and loaded models, against the caps."""

    def __init__(self, limits: DaemonLimits) -> None:
        self.limits = limits
        self._held: dict[Resource, Counter[int]] = {
            "connections": Counter(),
            "requests": Counter(),
            "models": Counter(),
        }

    def held(self, resource: Resource, uid: int) -> int:
        """How much of `resource` the uid holds now."""
        return self._held[resource][uid]

    def check(self, resource: Resource, uid: int, *, exempt: bool = False) -> None:
        """`QuotaExceededError` if the uid may not take one more of `resource`."""
        held = self._held[resource][uid]
        if not exempt and held >= self.limits.cap(resource):
            raise QuotaExceededError(
                f"uid {uid} holds {held} {resource} through the daemon, its limit "
                f"(set by serve {_OPTION[resource]}); release some first"
            )

    def take(self, resource: Resource, uid: int, *, exempt: bool = False) -> None:
        """Count one more, or `QuotaExceededError` (nothing counted) when the uid is at its cap."""
        self.check(resource, uid, exempt=exempt)
        self._held[resource][uid] += 1

    def give_back(self, resource: Resource, uid: int, count: int = 1) -> None:
        """Count `count` fewer (a uid whose count reaches zero is forgotten)."""
        held = self._held[resource]
        left = held[uid] - count
        if left > 0:
            held[uid] = left
        else:
            held.pop(uid, None)
