"""The loader: reads and opens clients' models off the loop, one at a time, boundedly.

A load holds the descriptors its frame brought until it runs, and opening a model can take
seconds, so what waits is bounded: a connection has at most `MAX_LOADS_PER_CONNECTION`
loads queued or running (more is `QuotaExceededError` at once, its descriptors closed);
with the per-uid connection cap that bounds a uid's share of the queue. An app whose load
was refused (not a model, over its grant) waits a pause before its next one runs, on any
of its connections, doubling with each refusal in a row (`REFUSAL_PAUSE_S`), while other
apps' loads go first: a flood of bad models gets the loader's time a few times a second,
however many connections it comes on. A connection that goes takes its queued loads with
it at once (their descriptors closed). The thread is a daemon thread: a load in progress
never holds up the daemon's exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from npumanager.errors import QuotaExceededError
from npumanager.schemas.limits import MAX_LOADS_PER_CONNECTION

log = logging.getLogger(__name__)

REFUSAL_PAUSE_S = (0.001, 0.1)
"""The pause before an app's next load after a refused one: the first, and the most it
doubles to with refusals in a row (a load that opens ends it)."""


def close_all(fds: list[int]) -> None:
    """Close the descriptors a load brought (once: the list is emptied)."""
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())


class _Load(NamedTuple):
    owner: object
    group: object
    """Whose refusals pause this load (the owner's app)."""
    run: Callable[[], bool]
    """Read and open the model: True if it opened, False if it was refused."""
    drop: Callable[[], None]
    """Give back what the load holds (its descriptors), when it will never run."""


class Loader:
    """One daemon thread running loads in order; per owner at most `per_owner` at a time."""

    def __init__(
        self,
        per_owner: int = MAX_LOADS_PER_CONNECTION,
        refusal_pause_s: tuple[float, float] = REFUSAL_PAUSE_S,
    ) -> None:
        self.per_owner = per_owner
        self.refusal_pause_s = refusal_pause_s
        self._queue: deque[_Load] = deque()
        self._counts: dict[int, int] = {}
        self._paused: dict[object, tuple[float, float]] = {}
        """Each group whose last load was refused: its pause and when it ends (monotonic)."""
        self._running: _Load | None = None
        self._closed = False
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._serve, name="npu-loader", daemon=True)
        self._thread.start()

    def submit(
        self,
        owner: object,
        run: Callable[[], bool],
        drop: Callable[[], None],
        group: object = None,
    ) -> None:
        """Queue `run` for `owner` (a connection) of `group` (its app, a hashable key; by
        default the owner itself): `QuotaExceededError` (and `drop` called) when the owner
        has its limit queued or running, or the loader is closed."""
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
                key = id(owner) if group is None else group
                self._queue.append(_Load(owner, key, run, drop))
                self._ready.notify()
                return
        drop()
        raise QuotaExceededError(refusal)

    def in_flight(self, owner: object) -> int:
        """The owner's loads queued or running."""
        with self._ready:
            return self._counts.get(id(owner), 0)

    def pause_of(self, group: object) -> float:
        """The pause a group's next load waits after its last one was refused (0: none);
        `group` as given to `submit`, or the owner if none was."""
        with self._ready:
            return self._paused.get(group, self._paused.get(id(group), (0.0, 0.0)))[0]

    def counts(self) -> dict[str, int]:
        """How many loads wait and how many run (0 or 1)."""
        with self._ready:
            return {"queued": len(self._queue), "running": int(self._running is not None)}

    def forget(self, owner: object) -> int:
        """Drop the owner's queued loads (it went): how many."""
        with self._ready:
            self._paused.pop(id(owner), None)  # a pause of its own; its app's outlives it
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

    def _next(self) -> _Load | None:
        """The first queued load whose group is not paused, taken from the queue (lock
        held); None if every one waits out a pause (or none is queued)."""
        now = time.monotonic()
        for load in self._queue:
            paused = self._paused.get(load.group)
            if paused is None or paused[1] <= now:
                self._queue.remove(load)
                return load
        return None

    def _wait_s(self) -> float | None:
        """How long the loader may sleep: until the first pause ends (lock held)."""
        ends = [self._paused[load.group][1] for load in self._queue]
        return max(0.0, min(ends) - time.monotonic()) if ends else None

    def _serve(self) -> None:
        while True:
            with self._ready:
                load = None if self._closed else self._next()
                while not self._closed and load is None:
                    self._ready.wait(self._wait_s())
                    load = None if self._closed else self._next()
                if load is None:
                    return
                self._running = load
            opened = False
            try:
                opened = load.run()
            except Exception as exc:
                log.error("a model load raised %s: %s", type(exc).__name__, exc)
            finally:
                with self._ready:
                    self._running = None
                    self._release(load)
                    self._after(load.group, opened)

    def _after(self, key: object, opened: bool) -> None:
        """Start, double or end a group's pause after its load (lock held)."""
        if opened:
            self._paused.pop(key, None)
            return
        first, most = self.refusal_pause_s
        pause = min(most, max(first, 2 * self._paused.get(key, (0.0, 0.0))[0]))
        self._paused[key] = (pause, time.monotonic() + pause)
