"""Which model host each connection's models run in (`daemon.host`), and what a host's
death does: the connection's models in it are unloaded (their work ends CANCELLED_SYSTEM)
and remembered as lost, so the client is told why; the daemon and every other connection
carry on, and the connection's next load starts a new host.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from npumanager.core.client.dispatch import Task
from npumanager.core.service.service import Service
from npumanager.daemon.host.client import HostSettings, ModelHost
from npumanager.daemon.server.audit import HostAudit
from npumanager.daemon.server.connection import Connection
from npumanager.errors import DaemonUnavailableError
from npumanager.schemas import UnloadReason

ENDED_KEPT = 1024
"""How many apps' last host ends `Hosting.ended` keeps."""


class Hosting:
    """Starts a connection's host on its first load, and tends to the hosts' deaths."""

    def __init__(self, settings: HostSettings, service: Service, post: Callable[[Task], None]):
        self.settings = settings
        self._backend = service.backend
        self._post = post
        self._lock = threading.Lock()
        self.started = 0
        self.died = 0
        self.audit = HostAudit()
        """Holds every host's CPU time, as the kernel counts it, to its grants."""
        self.ended: OrderedDict[str, str] = OrderedDict()
        """Why each app's last host ended by itself, by app id (the latest `ENDED_KEPT`)."""

    def host_for(self, connection: Connection) -> ModelHost:
        """The connection's live host, started now if it has none (on the loader: a start
        takes a second or so)."""
        with self._lock:
            host = connection.host
            if isinstance(host, ModelHost) and host.dead is None:
                return host
        ref = weakref.ref(connection)
        started = ModelHost(
            self.settings,
            connection.peer.uid,
            connection.peer.gid,
            on_death=lambda why: self._post(lambda: self._died(ref, started, why)),
        )
        with self._lock:
            if connection.closed:
                started.kill()
                raise DaemonUnavailableError("the connection closed while its host started")
            connection.host = started
            self.started += 1
        self.audit.watch(started)
        return started

    def describe(self) -> dict[str, Any]:
        """For `info`: the hosts' driver, how many started and died, their memory limit,
        and how their runs' inputs went (by place in the client's segment, or copied)."""
        cgroups = self.settings.cgroups
        return {
            "driver": self.settings.driver,
            "started": self.started,
            "died": self.died,
            "memory_limit": "RLIMIT_DATA" if cgroups is None else cgroups.kind,
            "runs_in_place": self.settings.counts.in_place,
            "runs_copied": self.settings.counts.copied,
            "audit": self.audit.describe(),
        }

    def _died(self, ref: weakref.ref[Connection], host: ModelHost, why: str) -> None:
        """On the loop: a host died by itself; its models go, and are remembered as lost."""
        self.died += 1
        connection = ref()
        if connection is None or connection.closed:
            return
        with self._lock:
            if connection.host is host:
                connection.host = None
        if connection.app is not None:
            self.ended[connection.app.app_id] = why
            self.ended.move_to_end(connection.app.app_id)
            while len(self.ended) > ENDED_KEPT:
                self.ended.popitem(last=False)
        reason = UnloadReason.OVER_GRANT if host.condemned else UnloadReason.MODEL_HOST_ENDED
        for model in list(connection.hosted):
            connection.lost[model.handle] = why
            self._backend.unload_real_model(model, reason)
        connection.hosted.clear()

    def stop(self) -> None:
        """End the audit's thread (the daemon is stopping)."""
        self.audit.stop()
