"""Leader and follower threads for the daemon's loop: the thread leading the loop runs a
foreground inference that can start at once itself, and a standby thread leads meanwhile.

Handing an inference to a worker thread costs a thread wake-up on its way in; handing the
loop to the standby costs one too, but while the inference runs, not before it. At most
one inference runs this way at a time: a leader with no standby queues work for the
workers as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from npumanager.daemon.server.ratelog import RateLimitedLog

log = logging.getLogger("npumanager.daemon")
_INTERNAL = RateLimitedLog(log)

Job = Callable[[], None]


class Leadership:
    """Which thread leads the loop, the standby, and the job a leader left to run."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._leading = False
        self._standby = 0
        self._done = False
        self._job: Job | None = None
        self._error: BaseException | None = None
        self.loop_thread: int | None = None
        """The thread leading the loop now (None while it changes hands)."""

    def can_defer(self) -> bool:
        """On the leader: a standby waits and no job is deferred yet this turn."""
        return self._standby > 0 and self._job is None and not self._done

    def defer(self, job: Job) -> None:
        """On the leader: run `job` once this turn of the loop is over, the loop led by the
        standby meanwhile (`can_defer` said it may)."""
        assert self._job is None
        self._job = job

    def run(self, turn: Callable[[], bool], shutdown: Callable[[], None]) -> None:
        """Lead the loop on this thread and one standby, until `turn` says to stop (False)
        or raises; then `shutdown` runs on the thread leading, and this returns once it has
        (raising what `turn` raised, on whichever thread)."""
        standby = threading.Thread(
            target=self._follow, args=(turn, shutdown, False), name="npu-loop", daemon=True
        )
        with self._cv:
            self._leading = True
        standby.start()
        self._follow(turn, shutdown, True)
        standby.join(timeout=5)
        if self._error is not None:
            raise self._error

    def _follow(self, turn: Callable[[], bool], shutdown: Callable[[], None], lead: bool) -> None:
        while True:
            if not lead:
                with self._cv:
                    self._standby += 1
                    while self._leading and not self._done:
                        self._cv.wait()
                    self._standby -= 1
                    if self._done:
                        return
                    self._leading = True
            lead = False
            self.loop_thread = threading.get_ident()
            stop = False
            try:
                while self._job is None and not stop:
                    stop = not turn()
            except BaseException as exc:
                self._error, stop = exc, True
            if stop:  # a job deferred this turn is dropped: closing the service ends it
                self._job = None
                self._finish(shutdown)
                return
            job = self._take_job()
            with self._cv:
                self.loop_thread = None
                self._leading = False
                self._cv.notify()
            try:
                job()
            except Exception as exc:
                _INTERNAL.internal_error("an inference run by the loop's thread raised", exc=exc)

    def _take_job(self) -> Job:
        job, self._job = self._job, None
        assert job is not None
        return job

    def _finish(self, shutdown: Callable[[], None]) -> None:
        try:
            shutdown()
        finally:
            with self._cv:
                self._done = True
                self._cv.notify_all()
