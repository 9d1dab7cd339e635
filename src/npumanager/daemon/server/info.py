"""The `info` reply: the service's state as one client may see it, bounded in size and cost.

The service's snapshot is taken at most every `INFO_SNAPSHOT_TTL_S`, and sooner when the
asker may know of a change the snapshot does not hold: every change counts a version, and
each connection carries the version it last saw, moved on by every frame the daemon sends
it but an `info` reply (its own calls' replies, the decisions and events of its requests).
So an `info` reply never shows less than the asker was told; changes it was not told of
show within the TTL; and one client's calls do not make another client's `info` flood
take a new snapshot per call. Each view of a snapshot (management or one uid; a page) is
encoded once, so a client that floods `info` costs the daemon little. Lists are paged;
counts are whole.
A client without the management permission sees its own uid's entries and counts for the
rest: other users' uids and pids are not its business.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from npumanager.schemas.limits import INFO_SNAPSHOT_TTL_S, MAX_FRAME_BYTES

Snapshot = Callable[[], dict[str, Any]]

_VIEW_CACHE_ENTRIES = 256
"""Views of one snapshot kept encoded; more distinct views than this start the cache over."""


class InfoCache:
    """Builds `info` results from a snapshot renewed when stale or when state changed."""

    def __init__(self, snapshot: Snapshot, ttl_s: float = INFO_SNAPSHOT_TTL_S) -> None:
        self._snapshot = snapshot
        self._ttl_s = ttl_s
        self._taken_at = -float("inf")
        self._document: dict[str, Any] = {}
        self._views: dict[tuple[frozenset[int] | None, int, int], bytes] = {}
        self.renewals = 0
        self.version = 0
        """How many changes there have been; a connection holds the last it saw."""
        self._holds = -1
        """The version the snapshot holds every change up to."""

    def changed(self) -> None:
        """State changed (or is about to, on this thread): a new version."""
        self.version += 1

    def result_json(
        self, uids: frozenset[int] | None, offset: int, limit: int, seen: int | None = None
    ) -> bytes:
        """The encoded result for a viewer (the uids it may see: its real uid and its apps'
        HAL uids; None for management) and a page, holding at least version `seen` (the
        last the viewer saw; None: every change)."""
        now = time.monotonic()
        wanted = self.version if seen is None else seen
        if now - self._taken_at > self._ttl_s or wanted > self._holds:
            self._holds = self.version
            self._document = self._snapshot()
            self._taken_at = now
            self._views.clear()
            self.renewals += 1
        key = (uids, offset, limit)
        cached = self._views.get(key)
        if cached is None:
            if len(self._views) >= _VIEW_CACHE_ENTRIES:
                self._views.clear()
            cached = self._views[key] = encode_view(self._document, uids, offset, limit)
        return cached


def encode_view(
    document: dict[str, Any], uids: frozenset[int] | None, offset: int, limit: int
) -> bytes:
    """`view` as JSON, with the page shrunk until the reply fits one frame."""
    while True:
        body = json.dumps(view(document, uids, offset, limit), separators=(",", ":")).encode()
        if len(body) < MAX_FRAME_BYTES - 256 or limit == 0:
            return body
        limit //= 2


def view(
    document: dict[str, Any], uids: frozenset[int] | None, offset: int, limit: int
) -> dict[str, Any]:
    """What a viewer sees of a full document: its lists paged, others' entries hidden."""

    def mine(entry: dict[str, Any]) -> bool:
        return uids is None or entry.get("uid") in uids

    def page(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [e for e in entries if mine(e)][offset : offset + limit]

    requests: dict[str, list[dict[str, Any]]] = document["requests"]
    shown = dict(document)
    shown["requests"] = {state: page(entries) for state, entries in requests.items()}
    shown["request_counts"] = {state: len(entries) for state, entries in requests.items()}
    shown["priorities"] = page(document["priorities"])
    shown["priorities_total"] = len(document["priorities"])
    shown["clients"] = page(document["clients"])
    shown["apps"] = page(document.get("apps", []))
    shown["device_users"] = page(document.get("device_users", []))
    shown["clients_total"] = len(document["clients"])
    shown["page"] = {"offset": offset, "limit": limit, "scope": "all" if uids is None else "own"}
    return shown
