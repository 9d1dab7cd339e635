"""The loader: reads and opens clients' models off the loop, one at a time, boundedly.

A load holds the descriptors its frame brought until it runs, and opening a model can take
seconds, so what waits is bounded: a connection has at most `MAX_LOADS_PER_CONNECTION`
loads queued or running (more is `QuotaExceededError` at once, its descriptors closed);
with the per-uid connection cap that bounds a uid's share of the queue. A connection that
goes takes its queued loads with it at once (their descriptors closed). The thread is a
daemon thread: a load in progress never holds up the daemon's exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from npumanager.errors import QuotaExceededError
from npumanager.schemas.limits import MAX_LOADS_PER_CONNECTION

log = logging.getLogger(__name__)


def close_all(fds: list[int]) -> None:
    """Close the descriptors a load brought (once: the list is emptied)."""
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())


class _Load(NamedTuple):
    owner: object
    run: Callable[[], None]
    drop: Callable[[], None]
    """Give back what the load holds (its descriptors), when it will never run."""


class Loader:
    """One daemon thread running loads in order; per owner at most `per_owner` at a time."""

    def __init__(self, per_owner: int = MAX_LOADS_PER_CONNECTION) -> None:
        self.per_owner = per_owner
        self._queue: deque[_Load] = deque()
        self._counts: dict[int, int] = {}
        self._running: _Load | None = None
        self._closed = False
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._serve, name="npu-loader", daemon=True)
        self._thread.start()

    def submit(self, owner: object, run: Callable[[], None], drop: Callable[[], None]) -> None:
        """Queue `run` for `owner` (a connection); `QuotaExceededError` (and `drop` called)
        when the owner has its limit queued or running, or the loader is closed."""
        with self._ready:
            held = self._counts.get(id(owner), 0)
            if self._closed or held >= self.per_owner:
                refusal = (
                    "the daemon is stopping"
                    if self._closed
                    else f"this connection has {held} model loads in flight, its limit; "
                    "wait for one to end"
                )
            else:
                self._counts[id(owner)] = held + 1
                self._queue.append(_Load(owner, run, drop))
                self._ready.notify()
                return
        drop()
        raise QuotaExceededError(refusal)

    def in_flight(self, owner: object) -> int:
        """The owner's loads queued or running."""
        with self._ready:
            return self._counts.get(id(owner), 0)

    def counts(self) -> dict[str, int]:
        """How many loads wait and how many run (0 or 1)."""
        with self._ready:
            return {"queued": len(self._queue), "running": int(self._running is not None)}

    def forget(self, owner: object) -> int:
        """Drop the owner's queued loads (it went): how many."""
        with self._ready:
            mine = [load for load in self._queue if load.owner is owner]
            for load in mine:
                self._queue.remove(load)
                self._release(load)
        for load in mine:
            load.drop()
        return len(mine)

    def close(self) -> tuple[int, bool]:
        """Stop: queued loads are dropped; the one running is left to end with the process.
        Returns how many were dropped and whether one was running."""
        with self._ready:
            self._closed = True
            dropped = list(self._queue)
            self._queue.clear()
            running = self._running is not None
            self._ready.notify()
        for load in dropped:
            load.drop()
        return len(dropped), running

    def _release(self, load: _Load) -> None:
        key = id(load.owner)
        left = self._counts[key] - 1
        if left:
            self._counts[key] = left
        else:
            del self._counts[key]

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                load = self._running = self._queue.popleft()
            try:
                load.run()
            except Exception as exc:
                log.error("a model load raised %s: %s", type(exc).__name__, exc)
            finally:
                with self._ready:
                    self._running = None
                    self._release(load)
