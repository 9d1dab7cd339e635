"""Each uid's share of the loop's time while other uids want it.

Slicing each connection's turn bounds how long one client holds the loop at a time, but a
uid that always has frames waiting (or connects again and again) still gets a slice of
every turn, and the loop's time it takes is time another client's frame waits and, on a
small machine, a core the other client's own process does not get. So the loop's time is
charged to the uid it served: every uid has a bucket of `BURST_S`, refilled at `SHARE` of
wall time. A uid whose bucket is empty while another uid, not itself held back, has been
served within `ACTIVE_WINDOW_S` is not read until its bucket holds half its burst again:
its frames and new connections wait in the kernel, its own process waits for their
answers, and the loop costs the others at most `SHARE` of a core for it, unless the loop
would otherwise be idle: once it has waited `server.IDLE_RELEASE_S` with no one to serve,
every held uid goes. A uid
alone is never held back, and management uids never are (they still count as wanting the
loop). Within a turn, the uids with the most loop time in hand are served first: a client
that asks little is not queued behind one that asks much.
"""

from __future__ import annotations

from dataclasses import dataclass

SHARE = 0.1
"""What one uid may use of the loop's time while another wants it."""
BURST_S = 0.004
"""The most loop time a uid may bank, and so take at once after a quiet spell."""
ACTIVE_WINDOW_S = 0.1
"""Another uid served within this long wants the loop too."""
KEPT_BUCKETS = 1024
"""Past this many uids' buckets, those of uids not served for a while are dropped."""


@dataclass
class _Bucket:
    tokens: float
    at: float
    served_at: float
    held_until: float = 0.0


class LoopShare:
    """The loop's time by uid: `charge` what serving a uid took, `held_until` says when a
    held-back uid may be read again."""

    def __init__(self, share: float = SHARE, burst_s: float = BURST_S) -> None:
        self.share = share
        self.burst_s = burst_s
        self._buckets: dict[int, _Bucket] = {}
        self._last: tuple[int, float] | None = None
        """The uid served last and when; with `_other` enough to know if another wants."""
        self._other: tuple[int, float] | None = None
        """The last uid served before a different one was."""

    def charge(self, uid: int, seconds: float, now: float, exempt: bool = False) -> float:
        """Charge `seconds` of the loop to `uid` at `now`; the time until which it is held
        back (0.0: it is not)."""
        if self._last is not None and self._last[0] != uid:
            self._other = self._last
        self._last = (uid, now)
        if exempt:
            return 0.0
        bucket = self._buckets.get(uid)
        if bucket is None:
            if len(self._buckets) >= KEPT_BUCKETS:
                self.forget_idle(now)
            bucket = self._buckets[uid] = _Bucket(self.burst_s, now, now)
        bucket.tokens = min(self.burst_s, bucket.tokens + (now - bucket.at) * self.share)
        bucket.tokens -= seconds
        bucket.at = bucket.served_at = now
        if bucket.tokens >= 0 or not self._others_want(uid, now):
            bucket.tokens = max(bucket.tokens, -self.burst_s)
            return 0.0
        bucket.held_until = now + (self.burst_s / 2 - bucket.tokens) / self.share
        return bucket.held_until

    def balance(self, uid: int, now: float) -> float:
        """The loop time `uid` has in hand now: the less, the later it is served in a turn."""
        bucket = self._buckets.get(uid)
        if bucket is None:
            return self.burst_s
        return min(self.burst_s, bucket.tokens + (now - bucket.at) * self.share)

    def held_until(self, uid: int, now: float) -> float:
        """When `uid` may be served again: 0.0 if it may now."""
        bucket = self._buckets.get(uid)
        if bucket is None or bucket.held_until <= now:
            return 0.0
        return bucket.held_until

    def let_go(self, uid: int) -> None:
        """Serve `uid` again now, its debt forgiven: the loop had nothing else to do."""
        bucket = self._buckets.get(uid)
        if bucket is not None:
            bucket.held_until = 0.0
            bucket.tokens = max(bucket.tokens, 0.0)

    def forget_idle(self, now: float) -> None:
        """Drop the buckets of uids not served for a while (they would be full again)."""
        idle = now - self.burst_s / self.share - ACTIVE_WINDOW_S
        for uid in [u for u, b in self._buckets.items() if b.served_at < idle]:
            del self._buckets[uid]

    def _others_want(self, uid: int, now: float) -> bool:
        """Another uid, itself not held back, was served within `ACTIVE_WINDOW_S`."""
        other = self._other
        if other is None or other[0] == uid or now - other[1] > ACTIVE_WINDOW_S:
            return False
        return not self.held_until(other[0], now)
