"""The counters the daemon reports in `info`."""

from __future__ import annotations

import time
from typing import Any, Protocol


class DaemonStats:
    """Counters the daemon reports in `info`."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._tallied: set[Tallied] = set()
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
        self.refusal_holds = 0
        """Times an app was held back for the calls the daemon refused it
        (`daemon.server.refusals`)."""
        self.inferences_inline = 0
        """Inferences run by the thread that received them: the loop's (the standby leading
        meanwhile) or a lane's."""
        self.inferences_to_workers = 0
        """Inferences handed to the driver's worker threads."""
        self.inferences_on_lane = 0
        """Inferences asked for on a connection's lane (`daemon.lane`), wherever they ran."""
        self.inferences_direct = 0
        """Runs granted to a model host that its client's lane sent it directly
        (`daemon.server.direct`): the tensors never passed through the daemon."""
        self.direct_runs = 0
        """Runs the hosts say their clients' lanes asked for (a lease covers several; the
        hosts' word, for `info` only)."""
        self.lanes_opened = 0
        self.loads_dropped = 0
        """Model loads never run: their client went while they waited (`daemon.loader`)."""
        self.lane_frames_repeated = 0
        """Lane requests byte for byte the lane's last one, taken as it was (`daemon.lane`)."""

    def tallied(self, source: Tallied) -> None:
        """Add `source`'s tally to the counters whenever they are read, until `retire`."""
        self._tallied.add(source)

    def retire(self, source: Tallied) -> None:
        """Keep `source`'s last tally in the counters for good; it is read no more."""
        if source in self._tallied:
            self._tallied.discard(source)
            for name, value in source.tally().items():
                setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> dict[str, Any]:
        """Every counter (with the tallies of their live sources), and the uptime in seconds."""
        counters = {k: v for k, v in vars(self).items() if k != "started" and k[0] != "_"}
        for source in list(self._tallied):
            for name, value in source.tally().items():
                counters[name] += value
        return {"uptime_s": round(time.monotonic() - self.started, 3), **counters}


class Tallied(Protocol):
    """Something that counts for the daemon elsewhere (a lane served in its host)."""

    def tally(self) -> dict[str, int]:
        """Its counts so far, by counter name."""
        ...
