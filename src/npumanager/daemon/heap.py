"""Handing freed memory back to the system, so a daemon's size follows its clients'."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return trim


def give_back_memory() -> bool:
    """Ask the C library to return free heap pages (glibc's `malloc_trim`); False if it cannot.

    Client buffers of up to a megabyte come from the heap, which keeps freed pages for
    reuse; after an attack is dropped, the daemon's resident size should fall back at once.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class TrimSchedule:
    """When to hand freed client buffers back: `quiet_s` after the last of them was freed,
    and while they keep being freed (a client churning connections), at most every
    `most_s`. A trim walks the whole heap on the loop (a millisecond or more under a
    flood), so it waits for the churn to stop rather than run at every pause of it."""

    def __init__(self, after_bytes: int, quiet_s: float, most_s: float) -> None:
        self.after_bytes = after_bytes
        self.quiet_s = quiet_s
        self.most_s = most_s
        self.due: float | None = None
        """When the next trim is to run (monotonic), if one is owed."""
        self._first: float | None = None
        self._seen = 0

    def freed(self, total: int, now: float) -> None:
        """The bytes freed since the last trim, as of `now`: moves the trim after them."""
        if total < self.after_bytes or total == self._seen:
            return
        self._seen = total
        if self._first is None:
            self._first = now
        self.due = min(now + self.quiet_s, self._first + self.most_s)

    def take(self, now: float) -> bool:
        """True (and the schedule reset) when a trim is due at `now`."""
        if self.due is None or now < self.due:
            return False
        self.due = self._first = None
        self._seen = 0
        return True
