"""The daemon: one arbiter shared by many processes over a Unix socket.

`npu-manager serve` runs it; `npumanager.connect()` returns an `NpuManager` served by it.
"""

from __future__ import annotations

from npumanager.daemon.client.client import DaemonClient, connect
from npumanager.daemon.peer import default_socket_path

__all__ = ["DaemonClient", "connect", "default_socket_path"]
