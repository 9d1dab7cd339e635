"""Log lines that clients can cause, rate-limited so an attack cannot flood the journal."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from npumanager.schemas.limits import LOG_BURST, LOG_WINDOW_S


class RateLimitedLog:
    """At most `burst` lines of each kind per `window_s`; the rest are counted and summed up.

    The kind is the message format, so "closing uid %d ..." is one kind whatever the uid.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = LOG_BURST,
        window_s: float = LOG_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._burst = burst
        self._window_s = window_s
        self._clock = clock
        self._windows: dict[str, tuple[float, int, int]] = {}
        self.suppressed = 0

    def log(self, level: int, message: str, *args: object) -> None:
        """Log `message % args` at `level` unless its kind used up its window."""
        now = self._clock()
        start, printed, dropped = self._windows.get(message, (now, 0, 0))
        if now - start >= self._window_s:
            if dropped:
                self._logger.log(
                    level, "(%d more like %r in the last %g s)", dropped, message, self._window_s
                )
            start, printed, dropped = now, 0, 0
        if printed < self._burst:
            self._logger.log(level, message, *args)
            printed += 1
        else:
            dropped += 1
            self.suppressed += 1
        self._windows[message] = (start, printed, dropped)

    def info(self, message: str, *args: object) -> None:
        """`log` at INFO."""
        self.log(logging.INFO, message, *args)

    def warning(self, message: str, *args: object) -> None:
        """`log` at WARNING."""
        self.log(logging.WARNING, message, *args)

    def internal_error(self, message: str, *args: object, exc: BaseException) -> None:
        """One line at ERROR (`message`, then the exception's repr), rate-limited like the
        rest; the traceback only at DEBUG, where an administrator asked for it."""
        self.log(logging.ERROR, message + ": %r", *args, exc)
        self._logger.debug(message, *args, exc_info=exc)
