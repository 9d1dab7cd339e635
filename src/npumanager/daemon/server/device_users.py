"""Who else uses the accelerator: processes holding its device nodes without the manager
(`apps.device_users`), found at most every `SCAN_INTERVAL_S` when `info` asks, the daemon
and its model hosts left out."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from npumanager.apps.device_users import DeviceScan, device_nodes, scan

log = logging.getLogger(__name__)

SCAN_INTERVAL_S = 2.0
"""A scan reads /proc of every process: `info` gets one at most this often."""


class DeviceUsers:
    """The last scan of the device's other users, renewed when stale."""

    def __init__(
        self,
        nodes: Sequence[str] | None,
        ours: Callable[[], Iterable[int]],
        interval_s: float = SCAN_INTERVAL_S,
    ) -> None:
        self.nodes = tuple(device_nodes() if nodes is None else nodes)
        """The nodes looked for: the machine's accelerator nodes unless named."""
        self._ours = ours
        self._interval_s = interval_s
        self._taken_at = -float("inf")
        self._last = DeviceScan((), {}, False)
        self._said_skips = False

    def current(self) -> DeviceScan:
        """The last scan, renewed if older than the interval."""
        now = time.monotonic()
        if self.nodes and now - self._taken_at >= self._interval_s:
            self._last = scan(self.nodes, exclude_pids={os.getpid(), *self._ours()})
            self._taken_at = now
            if self._last.skipped.get("denied") and not self._said_skips:
                self._said_skips = True
                log.warning(
                    "%d processes' descriptors could not be read (/proc hidden from the "
                    "daemon): device users among them are not shown (said once)",
                    self._last.skipped["denied"],
                )
        return self._last

    def describe(self) -> list[dict[str, Any]]:
        """For `info` and `npu-manager apps`: each user with its app id and its usage."""
        return [
            {
                "pid": user.pid,
                "uid": user.uid,
                "app_id": user.app_id,
                "comm": user.comm,
                "node": user.node,
                "driver": user.driver,
                "client_id": user.client_id,
                "engines_busy_ns": dict(user.engines),
                "resident_bytes": user.resident_bytes(),
                "cgroup": user.cgroup,
            }
            for user in self.current().users
        ]
