"""What `info` shows of a daemon: the service's snapshot with the daemon's own socket,
counters and limits, its apps, the device's other users, and every client."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from npumanager.apps.registry import AppRegistry
from npumanager.core.service.service import Service
from npumanager.daemon.server.device_users import DeviceUsers
from npumanager.daemon.server.importance import AppImportance
from npumanager.daemon.server.inference import InferenceCalls
from npumanager.daemon.server.quotas import DaemonLimits
from npumanager.daemon.server.stats import DaemonStats
from npumanager.daemon.server.transport import Transport
from npumanager.schemas.limits import PROTOCOL_VERSION


class Described(Protocol):
    """The parts of a `server.Daemon` that `info` shows."""

    service: Service
    socket_path: Path
    max_connections: int
    limits: DaemonLimits
    stats: DaemonStats
    apps: AppRegistry
    importance: AppImportance
    device_users: DeviceUsers
    inference: InferenceCalls
    transport: Transport


def describe_daemon(
    daemon: Described, suppressed_log_lines: int, info_snapshots: int
) -> dict[str, Any]:
    """The service's snapshot with the daemon's own: socket, counters, limits, clients."""
    document = daemon.service.snapshot()
    hosting = daemon.inference.hosting
    document["daemon"] = {
        "pid": os.getpid(),
        "socket": str(daemon.socket_path),
        "protocol_version": PROTOCOL_VERSION,
        "connections": len(daemon.transport.connections),
        "max_connections": daemon.max_connections,
        "buffered_bytes": daemon.transport.buffered,
        "limits": vars(daemon.limits),
        "suppressed_log_lines": suppressed_log_lines,
        "info_snapshots": info_snapshots,
        "model_loads": daemon.inference.load_counts(),
        "model_hosts": None if hosting is None else hosting.describe(),
        **daemon.stats.as_dict(),
    }
    ended = {} if hosting is None else hosting.ended
    document["apps"] = [
        {**daemon.importance.describe(app), "host_ended": ended.get(app.app_id)}
        for app in daemon.apps.apps()
        if app.pids
    ]
    document["device_users"] = daemon.device_users.describe()
    document["clients"] = [
        {
            "client": c.manager.client,
            "uid": c.peer.uid,
            "app_id": c.app.app_id if c.app is not None else None,
            "hal_uid": c.manager.uid,
            "pid": c.peer.pid,
            "requests": daemon.service.backend.holdings(c.manager)[0],
            "models": daemon.service.backend.holdings(c.manager)[1],
            "shared_bytes": c.segment.size if c.segment is not None else 0,
            "inferences": len(c.inferences),
            "loads": daemon.inference.loads_of(c),
            "host_pid": getattr(c.host, "pid", None),
        }
        for c in daemon.transport.connections.values()
        if c.manager is not None
    ]
    return document
