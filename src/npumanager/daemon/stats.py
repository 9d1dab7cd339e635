"""The counters the daemon reports in `info`."""

from __future__ import annotations

import time
from typing import Any


class DaemonStats:
    """Counters the daemon reports in `info`."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.accepted = 0
        self.refused = 0
        self.frames_in = 0
        self.frames_out = 0
        self.protocol_errors = 0
        self.call_errors = 0
        self.internal_errors = 0
        self.dropped_slow = 0
        self.backpressure_pauses = 0
        self.dropped_over_budget = 0
        self.closed_idle = 0
        self.deaths = 0
        self.accept_pauses = 0
        self.inferences_inline = 0
        """Inferences run by the loop's thread, the standby leading meanwhile."""
        self.inferences_to_workers = 0

    def as_dict(self) -> dict[str, Any]:
        """Every counter, and the uptime in seconds."""
        counters = {k: v for k, v in vars(self).items() if k != "started"}
        return {"uptime_s": round(time.monotonic() - self.started, 3), **counters}
