"""The apps a daemon serves: each connection's app, found from its process's cgroup when it
says hello, and the HAL uid each app is known by to the arbiter, the policies and the
device scheduler.

An app recognised by its cgroup (`identity.app_of_cgroup`) gets a HAL uid of its own from
`HAL_UID_FIRST` up, one per (real uid, app id), kept while the daemon runs; a process in
no app's cgroup (a login shell, a process where ``/proc`` is hidden from the daemon) is the
fallback app ``uid:<uid>``, whose HAL uid is its real uid, as before apps were told apart.
Real uids from `HAL_UID_FIRST` up are refused at hello, so a HAL uid never names a real uid
that also appears. The real uid still decides permissions, socket access and management.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from npumanager.apps.identity import (
    AppIdentity,
    app_of_cgroup,
    cgroup_of_pidfd,
    peer_pidfd,
)
from npumanager.schemas.limits import INT32_MAX

log = logging.getLogger(__name__)

HAL_UID_FIRST = 0x7000_0000
"""The first HAL uid given to an app (1879048192): systemd leaves 1879048192..2147483647
unused (its container and dynamic ranges end below), and the HAL carries uids up to
2**31 - 1."""
MAX_APPS_PER_UID = 256
"""How many distinct app ids of one real uid get HAL uids of their own; later ones share the
uid's fallback app (a process may name its own cgroups, so the table must be bounded)."""


@dataclass
class App:
    """One app: who it is, the HAL uid it is known by, and its processes now connected."""

    app_id: str
    kind: str
    """How it was recognised (`identity.AppKind`), or ``uid`` for the fallback."""
    uid: int
    hal_uid: int
    cgroup: str | None = None
    slice: str | None = None
    pids: Counter[int] = field(default_factory=Counter)
    """Connections now open, by process."""


def fallback_id(uid: int) -> str:
    """The app id of a uid's processes that no app's cgroup names."""
    return f"uid:{uid}"


class AppRegistry:
    """Which app each connection is, and the HAL uids given so far."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._lock = threading.Lock()
        self._apps: dict[tuple[int, str], App] = {}
        self._next = HAL_UID_FIRST
        self._per_uid: Counter[int] = Counter()
        self._warned: set[str] = set()
        self._by_hal: dict[int, str] = {}

    def identify(self, sock: socket.socket, uid: int, pid: int) -> App:
        """The app of the process on the other end of `sock` (the kernel's uid and pid),
        counted as connected until `left`."""
        path = self._cgroup_of_peer(sock, uid, pid)
        identity = app_of_cgroup(path) if path is not None else None
        app = self.app_for(uid, identity)
        with self._lock:
            app.pids[pid] += 1
        return app

    def app_for(self, uid: int, identity: AppIdentity | None) -> App:
        """The app of `identity` for `uid` (the uid's fallback app for None), made now if new."""
        if identity is None:
            return self._fallback(uid)
        key = (uid, identity.app_id)
        with self._lock:
            app = self._apps.get(key)
            if app is None:
                if self._per_uid[uid] >= MAX_APPS_PER_UID or self._next > INT32_MAX:
                    app = None
                else:
                    app = App(identity.app_id, identity.kind, uid, self._next)
                    self._by_hal[app.hal_uid] = app.app_id
                    self._next += 1
                    self._per_uid[uid] += 1
                    self._apps[key] = app
            if app is not None:
                app.cgroup, app.slice = identity.cgroup, identity.slice
                return app
        self._warn_once(
            f"apps of {uid}",
            f"uid {uid} has more than {MAX_APPS_PER_UID} apps; app {identity.app_id!r} and "
            f"later ones count as {fallback_id(uid)}",
        )
        return self._fallback(uid)

    def _fallback(self, uid: int) -> App:
        key = (uid, fallback_id(uid))
        with self._lock:
            app = self._apps.get(key)
            if app is None:
                app = self._apps[key] = App(fallback_id(uid), "uid", uid, uid)
                self._by_hal[uid] = app.app_id
            return app

    def left(self, app: App, pid: int) -> None:
        """A connection of `app` from process `pid` closed."""
        with self._lock:
            app.pids[pid] -= 1
            if app.pids[pid] <= 0:
                del app.pids[pid]

    def apps(self) -> list[App]:
        """Every app known, connected or not, by HAL uid."""
        with self._lock:
            return sorted(self._apps.values(), key=lambda app: app.hal_uid)

    def app_id_of(self, hal_uid: int) -> str | None:
        """The app id a HAL uid was given to (None for one that is not an app's)."""
        with self._lock:
            return self._by_hal.get(hal_uid)

    def uids_of(self, uid: int) -> frozenset[int]:
        """A real uid and the HAL uids of its apps: what it may see of the daemon's state."""
        with self._lock:
            return frozenset(
                {uid, *(app.hal_uid for (owner, _), app in self._apps.items() if owner == uid)}
            )

    def find(self, app_id: str) -> list[App]:
        """The apps of that id (one per real uid that ran it)."""
        with self._lock:
            return [app for app in self._apps.values() if app.app_id == app_id]

    def _cgroup_of_peer(self, sock: socket.socket, uid: int, pid: int) -> str | None:
        """The peer's cgroup v2 path through a pidfd (so a reused pid cannot answer for
        it), or None: gone, hidden (``hidepid``), or no cgroup v2."""
        try:
            pidfd = peer_pidfd(sock)
            if pidfd is None:  # before Linux 6.5: by the pid the kernel gave, checked below
                pidfd = os.pidfd_open(pid)
        except OSError:
            return None  # the client is gone already
        try:
            path = cgroup_of_pidfd(pidfd, pid, self._proc)
        except (OSError, ValueError):
            path = None
        finally:
            with contextlib.suppress(OSError):
                os.close(pidfd)
        if path is None:
            self._warn_once(
                "cgroup",
                f"the cgroup of uid {uid}'s process {pid} could not be read (gone, or /proc "
                "hidden from the daemon): such connections count as their uid's app (said once)",
            )
        return path

    def _warn_once(self, key: str, text: str) -> None:
        with self._lock:
            if key in self._warned or len(self._warned) > 1024:
                return
            self._warned.add(key)
        log.warning("%s", text)
