"""Callback delivery: in order per request, never two at once, on the client's executor.

Each request gets a `SerialQueue`. Deliveries are appended in decision order while the
service holds its lock; a queue with no drain running is then scheduled, outside the lock,
on the request's executor, and its drain runs queued callbacks one after another until
the queue is empty. A callback that raises is logged and counted; the next one still runs.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

log = logging.getLogger(__name__)

Task = Callable[[], None]
ExecutorLike = Executor | Callable[[Task], Any]


def run_inline(task: Task) -> None:
    """An executor that runs the callback at once, on the calling thread."""
    task()


def submit_to(executor: ExecutorLike, task: Task) -> None:
    """Hand `task` to a `concurrent.futures.Executor` or to a callable executor."""
    if isinstance(executor, Executor):
        executor.submit(task)
    else:
        executor(task)


def check_executor(executor: object) -> ExecutorLike | None:
    """`executor` if it is usable as one (or None), else a `TypeError` saying what is allowed."""
    if executor is None or isinstance(executor, Executor) or callable(executor):
        return executor
    raise TypeError(
        "executor must be a concurrent.futures.Executor or a callable taking a "
        f"zero-argument callable; got {type(executor).__name__}"
    )


class DeliveryStats:
    """Counts shared by every queue of one service."""

    def __init__(self) -> None:
        self.delivered = 0
        self.failed = 0


class SerialQueue:
    """Runs the callbacks of one request strictly in order on its executor."""

    def __init__(self, executor: ExecutorLike, stats: DeliveryStats) -> None:
        self._executor = executor
        self._stats = stats
        self._lock = threading.Lock()
        self._pending: deque[Task] = deque()
        self._scheduled = False

    def put(self, task: Task) -> bool:
        """Queue one callback; True if the caller must now `schedule()` the queue.

        Call it in the order the callbacks must run (under the service's lock), and
        `schedule()` afterwards, outside any lock the callbacks may need.
        """
        with self._lock:
            self._pending.append(task)
            if self._scheduled:
                return False
            self._scheduled = True
            return True

    def schedule(self) -> None:
        """Hand the drain to the executor."""
        submit_to(self._executor, self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._scheduled = False
                    return
                task = self._pending.popleft()
            try:
                task()
                self._stats.delivered += 1
            except Exception:
                self._stats.failed += 1
                log.exception("a model-load callback raised; other clients are unaffected")
