"""Who may open one more connection: per-uid caps, and room kept for management."""

from __future__ import annotations

import contextlib
import socket

from npumanager.daemon.peer import PeerCredentials
from npumanager.daemon.server.quotas import UidUsage
from npumanager.daemon.server.ratelog import RateLimitedLog
from npumanager.daemon.server.stats import DaemonStats
from npumanager.daemon.wire import protocol as p
from npumanager.errors import QuotaExceededError


class Admission:
    """Counts a new connection against its uid's cap and the daemon's, or refuses it."""

    def __init__(self, usage: UidUsage, stats: DaemonStats, log: RateLimitedLog) -> None:
        self.usage = usage
        self.stats = stats
        self._log = log
        self.max_connections = 0

    def admit(
        self, sock: socket.socket, peer: PeerCredentials, management: bool, open_: int
    ) -> bool:
        """True if the connection is counted in; else it got an error frame and is closed.

        Management connections pass both caps, so an administrator can always get in.
        """
        refusal = None
        if not management and open_ >= self.max_connections:
            refusal = f"the daemon is at its limit of {self.max_connections} connections"
        else:
            try:
                self.usage.take_connection(peer.uid, exempt=management)
            except QuotaExceededError as exc:
                refusal = str(exc)
        if refusal is None:
            return True
        self.stats.refused += 1
        self._log.info("refusing uid %d pid %d: %s", peer.uid, peer.pid, refusal)
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(p.encode(p.Error(kind=QuotaExceededError.__name__, message=refusal)))
        sock.close()
        return False
