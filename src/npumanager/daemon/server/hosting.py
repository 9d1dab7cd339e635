"""Which model host each app's models run in (`daemon.host`), and what a host's death
does.

An app (its cgroup, else its uid: `apps.registry`) has one host, whatever number of
connections it opens: its first load starts it, every connection of the app shares it,
and it ends with the app's last connection. A real uid may have at most
`max_hosts_per_uid` hosts and the daemon `max_hosts` (`serve --max-hosts-per-uid`,
`--max-hosts`): a load that would start one more is refused with `QuotaExceededError`.
A host's death unloads every model in it (their work ends CANCELLED_SYSTEM), remembered as
lost on each connection that had one, so each client is told why; the daemon and every
other app carry on, and the app's next load starts a new host.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from npumanager.apps.registry import fallback_id
from npumanager.core.client.dispatch import Task
from npumanager.core.service.service import Service
from npumanager.daemon.host.client import HostSettings, ModelHost
from npumanager.daemon.server.audit import HostAudit
from npumanager.daemon.server.connection import Connection
from npumanager.errors import DaemonUnavailableError, QuotaExceededError
from npumanager.schemas import UnloadReason
from npumanager.schemas.limits import DEFAULT_MAX_HOSTS, DEFAULT_MAX_HOSTS_PER_UID

ENDED_KEPT = 1024
"""How many apps' last host ends `Hosting.ended` keeps."""
AppKey = tuple[int, str]
"""An app's host is keyed by the real uid and the app id."""


class Hosting:
    """Starts an app's host on its first load, shares it among the app's connections, and
    tends to the hosts' deaths."""

    def __init__(
        self,
        settings: HostSettings,
        service: Service,
        post: Callable[[Task], None],
        *,
        max_hosts_per_uid: int = DEFAULT_MAX_HOSTS_PER_UID,
        max_hosts: int = DEFAULT_MAX_HOSTS,
    ):
        self.settings = settings
        self._backend = service.backend
        self._post = post
        self.max_hosts_per_uid = max_hosts_per_uid
        self.max_hosts = max_hosts
        self._lock = threading.Lock()
        self._hosts: dict[AppKey, ModelHost] = {}
        """Each app's live host."""
        self._users: weakref.WeakKeyDictionary[ModelHost, weakref.WeakSet[Connection]] = (
            weakref.WeakKeyDictionary()
        )
        self.started = 0
        self.died = 0
        self.audit = HostAudit()
        """Holds every host's CPU time, as the kernel counts it, to its grants."""
        self.ended: OrderedDict[str, str] = OrderedDict()
        """Why each app's last host ended by itself, by app id (the latest `ENDED_KEPT`)."""

    @staticmethod
    def key(connection: Connection) -> AppKey:
        """The app a connection's models are hosted for."""
        uid = connection.peer.uid
        return uid, connection.app.app_id if connection.app is not None else fallback_id(uid)

    def host_for(self, connection: Connection) -> ModelHost:
        """The connection's app's live host, started now if it has none (on the loader: a
        start takes a second or so)."""
        key = self.key(connection)
        with self._lock:
            host = connection.host
            if isinstance(host, ModelHost) and host.usable:
                return host
            shared = self._hosts.get(key)
            if shared is not None and shared.usable:
                return self._share(shared, connection)
            self._check_caps(key[0])
        started = ModelHost(
            self.settings,
            connection.peer.uid,
            connection.peer.gid,
            on_death=lambda why: self._post(lambda: self._died(started, why)),
        )
        with self._lock:
            if connection.closed:
                started.kill()
                raise DaemonUnavailableError("the connection closed while its host started")
            self._hosts[key] = started
            self._users[started] = weakref.WeakSet()
            self.started += 1
            self._share(started, connection)
        self.audit.watch(started)
        return started

    def live(self) -> list[ModelHost]:
        """Every live host."""
        with self._lock:
            return [host for host in self._hosts.values() if host.usable]

    def _share(self, host: ModelHost, connection: Connection) -> ModelHost:
        """`connection` uses `host` from now on (lock held)."""
        host.join()
        connection.host = host
        self._users[host].add(connection)
        return host

    def _check_caps(self, uid: int) -> None:
        """`QuotaExceededError` if one more host is past the uid's cap or the daemon's."""
        live = [owner for (owner, _), host in self._hosts.items() if host.usable]
        if len(live) >= self.max_hosts:
            raise QuotaExceededError(
                f"the daemon runs {len(live)} model hosts, its cap (serve --max-hosts); "
                "an app's host starts when another app's ends"
            )
        mine = [
            host for (owner, _), host in self._hosts.items() if owner == uid and host.dead is None
        ]
        if len(mine) >= self.max_hosts_per_uid:
            raise QuotaExceededError(
                f"uid {uid} has {len(mine)} model hosts, one per app, its cap "
                "(serve --max-hosts-per-uid); close another app's models first"
            )

    def describe(self) -> dict[str, Any]:
        """For `info`: the hosts' driver, how many run, started and died, their caps and
        memory limit, how their runs' inputs went, and the audit."""
        cgroups = self.settings.cgroups
        return {
            "driver": self.settings.driver,
            "running": len(self.live()),
            "started": self.started,
            "died": self.died,
            "max_hosts_per_uid": self.max_hosts_per_uid,
            "max_hosts": self.max_hosts,
            "memory_limit": "RLIMIT_DATA" if cgroups is None else cgroups.kind,
            "runs_in_place": self.settings.counts.in_place,
            "runs_copied": self.settings.counts.copied,
            "audit": self.audit.describe(),
        }

    def _died(self, host: ModelHost, why: str) -> None:
        """On the loop: a host died by itself; its models go, and are remembered as lost."""
        self.died += 1
        with self._lock:
            for key, live in list(self._hosts.items()):
                if live is host:
                    del self._hosts[key]
            users = list(self._users.pop(host, ()))
        reason = UnloadReason.OVER_GRANT if host.condemned else UnloadReason.MODEL_HOST_ENDED
        for connection in users:
            if connection.closed:
                continue
            if connection.host is host:
                connection.host = None
            if connection.app is not None:
                self.ended[connection.app.app_id] = why
                self.ended.move_to_end(connection.app.app_id)
                while len(self.ended) > ENDED_KEPT:
                    self.ended.popitem(last=False)
            for model in list(connection.hosted):
                connection.lost[model.handle] = why
                self._backend.unload_real_model(model, reason)
            connection.hosted.clear()

    def stop(self) -> None:
        """End the audit's thread (the daemon is stopping)."""
        self.audit.stop()
