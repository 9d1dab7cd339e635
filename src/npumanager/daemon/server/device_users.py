"""Who else uses the accelerator: processes holding its device nodes without the manager
(`apps.device_users`), the daemon and its model hosts left out. A scan runs at most every
`SCAN_INTERVAL_S`, when `info` or a metrics scrape asks; where their memory counts against
the device's capacity (`serve --count-device-users`), a thread of its own scans that often
and tells the service what they hold."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
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
        root: Path = Path("/"),
    ) -> None:
        self.nodes = tuple(device_nodes(root) if nodes is None else nodes)
        """The nodes looked for: the machine's accelerator nodes unless named."""
        self._ours = ours
        self._interval_s = interval_s
        self._root = root
        """Where /proc and /dev are: a fake tree in tests, as the health sources take."""
        self._taken_at = -float("inf")
        self._last = DeviceScan((), {}, False)
        self._said_skips = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._counter: threading.Thread | None = None

    def current(self) -> DeviceScan:
        """The last scan, renewed if older than the interval (from any thread)."""
        with self._lock:
            return self._renewed()

    def _renewed(self) -> DeviceScan:
        now = time.monotonic()
        if self.nodes and now - self._taken_at >= self._interval_s:
            self._last = scan(self.nodes, self._root, exclude_pids={os.getpid(), *self._ours()})
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

    def count_against(self, tell: Callable[[int], None]) -> None:
        """Scan every interval on a thread of its own and `tell` the resident bytes of the
        users whenever they change (0 first, if none); until `close`."""
        if self._counter is not None:
            raise RuntimeError("the device's users are counted already")

        def run() -> None:
            told: int | None = None
            while not self._stop.is_set():
                try:
                    held = self.current().resident_bytes()
                    if held != told:
                        tell(held)
                        told = held
                except Exception:
                    log.exception("counting the device's other users failed")
                self._stop.wait(self._interval_s)

        self._counter = threading.Thread(target=run, name="npu-device-users", daemon=True)
        self._counter.start()

    def close(self) -> None:
        """Stop counting (`count_against`)."""
        self._stop.set()
        if self._counter is not None:
            self._counter.join()
