"""What one uid may hold through the daemon, and what each uid holds now.

A hostile or broken client must not take what other clients need: connections (and so
descriptors), live requests and loaded models are counted per uid against caps, with
management uids exempt so an administrator can always get in and look. Requests and
models are the service's records, counted where they are kept: the daemon asks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from npumanager.core.client.manager import NpuManager
from npumanager.errors import QuotaExceededError
from npumanager.schemas.limits import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_BUFFERED_BYTES,
    DEFAULT_MAX_CONNECTIONS_PER_UID,
    DEFAULT_MAX_HOSTS,
    DEFAULT_MAX_HOSTS_PER_UID,
    DEFAULT_MAX_INFERENCES_PER_CONNECTION,
    DEFAULT_MAX_MODEL_FILE_BYTES,
    DEFAULT_MAX_MODELS_PER_APP,
    DEFAULT_MAX_MODELS_PER_UID,
    DEFAULT_MAX_REQUESTS_PER_APP,
    DEFAULT_MAX_REQUESTS_PER_UID,
    DEFAULT_MAX_SHARED_BYTES,
)

Resource = Literal["connections", "requests", "models"]

_OPTION: dict[Resource, str] = {
    "connections": "--max-connections-per-uid",
    "requests": "--max-requests-per-uid",
    "models": "--max-models-per-uid",
}
_APP_OPTION: dict[Resource, str] = {
    "requests": "--max-requests-per-app",
    "models": "--max-models-per-app",
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
    max_requests_per_app: int = DEFAULT_MAX_REQUESTS_PER_APP
    max_models_per_app: int = DEFAULT_MAX_MODELS_PER_APP
    max_hosts_per_uid: int = DEFAULT_MAX_HOSTS_PER_UID
    max_hosts: int = DEFAULT_MAX_HOSTS

    def app_cap(self, resource: Resource) -> int:
        """The per-app cap of requests or models (connections are capped per uid only)."""
        return self.max_requests_per_app if resource == "requests" else self.max_models_per_app

    def cap(self, resource: Resource) -> int:
        """The per-uid cap of one resource."""
        if resource == "connections":
            return self.max_connections_per_uid
        if resource == "requests":
            return self.max_requests_per_uid
        return self.max_models_per_uid


Holdings = Callable[[NpuManager], tuple[int, int]]
"""How many live requests and loaded models a manager holds (the service's own count)."""


class UidUsage:
    """Per-uid connections, and the live requests and loaded models of each uid's
    connections (counted by the service, which holds the one record of each), against the
    caps."""

    def __init__(
        self, limits: DaemonLimits, holdings: Holdings | None = None, *, per_app: bool = False
    ) -> None:
        self.limits = limits
        self._holdings = holdings or (lambda _: (0, 0))
        self._connections: Counter[int] = Counter()
        self._managers: dict[int, set[NpuManager]] = {}
        """The managers of each uid's connections that said hello."""
        self.apps: UidUsage = self if per_app else UidUsage(limits, holdings, per_app=True)
        """The same count by app, keyed by HAL uid: apps found by their cgroups join it."""

    def join(self, uid: int, manager: NpuManager) -> None:
        """A connection of the uid said hello: what its manager holds counts for the uid."""
        self._managers.setdefault(uid, set()).add(manager)

    def leave(self, uid: int, manager: NpuManager) -> None:
        """A connection of the uid closed."""
        managers = self._managers.get(uid)
        if managers is not None:
            managers.discard(manager)
            if not managers:
                del self._managers[uid]

    def held(self, resource: Resource, uid: int) -> int:
        """How much of ``resource`` the uid holds now."""
        if resource == "connections":
            return self._connections[uid]
        index = 0 if resource == "requests" else 1
        return sum(self._holdings(m)[index] for m in self._managers.get(uid, ()))

    def check(
        self, resource: Resource, uid: int, *, exempt: bool = False, including: int = 0
    ) -> None:
        """`QuotaExceededError` if the uid may not take one more of ``resource`` (or, with
        ``including``, keep that many it took already)."""
        held = self.held(resource, uid)
        if not exempt and held - including >= self.limits.cap(resource):
            raise QuotaExceededError(
                f"uid {uid} holds {held - including} {resource} through the daemon, its "
                f"limit (set by serve {_OPTION[resource]}); release some first"
            )

    def check_app(
        self, resource: Resource, hal_uid: int, app_id: str, *, including: int = 0
    ) -> None:
        """`QuotaExceededError` if the app (by its HAL uid) may not take one more requests
        or models (or keep ``including`` it took already)."""
        if resource == "connections":
            return
        held = self.held(resource, hal_uid)
        if held - including >= self.limits.app_cap(resource):
            raise QuotaExceededError(
                f"app {app_id} holds {held - including} {resource} through the daemon, its "
                f"limit (set by serve {_APP_OPTION[resource]}); release some first"
            )

    def take_connection(self, uid: int, *, exempt: bool = False) -> None:
        """Count one more connection, or `QuotaExceededError` (nothing counted) at the cap."""
        self.check("connections", uid, exempt=exempt)
        self._connections[uid] += 1

    def give_back_connection(self, uid: int) -> None:
        """Count one connection fewer (a uid whose count reaches zero is forgotten)."""
        left = self._connections[uid] - 1
        if left > 0:
            self._connections[uid] = left
        else:
            self._connections.pop(uid, None)
