"""Holding back an app whose calls the daemon keeps refusing.

A call the daemon refuses (a bad argument, a request or model it does not know, a quota
reached, a load its driver cannot do) costs the daemon's loop as much as one it serves,
and no well-behaved app makes them by the hundred. Each app (its uid and app id, as its
share of the loop) may have `REFUSED_CALLS_BURST` calls refused in a burst and
`REFUSED_CALLS_PER_S` a second after it; past that the daemon reads none of the app's
connections until the allowance has room for one more refusal (50 ms at 20 a second).
Its replies still leave; its frames wait in its sockets. Management connections are exempt,
as they are from the per-uid quotas.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from npumanager.daemon.server.shares import ShareKey
from npumanager.schemas.limits import REFUSED_CALLS_BURST, REFUSED_CALLS_PER_S

_MOST_TRACKED = 4096
"""Apps tracked at once; past it, those whose allowance is whole again are forgotten."""


class RefusalAllowance:
    """Each app's allowance of refused calls (a token bucket), and which apps are held."""

    def __init__(
        self,
        burst: int = REFUSED_CALLS_BURST,
        per_s: float = REFUSED_CALLS_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.per_s = per_s
        self._clock = clock
        self._left: dict[ShareKey, tuple[float, float]] = {}
        """Refusals the app has left, and when that was reckoned."""
        self._held: dict[ShareKey, float] = {}
        """Apps held back, and until when."""

    def refused(self, key: ShareKey) -> bool:
        """One of the app's calls was refused; True if that holds the app back."""
        now = self._clock()
        left = self._allowance(key, now) - 1
        self._left[key] = (left, now)
        if left >= 1:
            return False
        self._held[key] = now + (1 - left) / self.per_s
        if len(self._left) > _MOST_TRACKED:
            self._forget_whole(now)
        return True

    def held(self, key: ShareKey) -> bool:
        """Whether the app is held back now."""
        until = self._held.get(key)
        if until is None:
            return False
        if self._clock() < until:
            return True
        del self._held[key]
        return False

    def next_release(self) -> float | None:
        """When the first held app may be read again (the clock's time), if any is held."""
        return min(self._held.values()) if self._held else None

    def _allowance(self, key: ShareKey, now: float) -> float:
        left, at = self._left.get(key, (float(self.burst), now))
        return min(float(self.burst), left + (now - at) * self.per_s)

    def _forget_whole(self, now: float) -> None:
        for key in [k for k in self._left if self._allowance(k, now) >= self.burst]:
            del self._left[key]
