"""A progress bar on a text stream, shown only once a run has lasted a while in wall time.

Short runs print nothing; a long one draws `label [#####     ]  42%, about 12 s left` in
place (carriage returns), the estimate from the pace so far, at most every
`PROGRESS_REDRAW_S`, and clears the line when it is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from npumanager.schemas.limits import PROGRESS_AFTER_S, PROGRESS_REDRAW_S

BAR_WIDTH = 30


class ProgressBar:
    """Counts virtual milliseconds of one or more runs against their total."""

    def __init__(
        self,
        total: int,
        stream: TextIO,
        *,
        after_s: float = PROGRESS_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = max(1, total)
        self.stream = stream
        self.after_s = after_s
        self.clock = clock
        self.label = ""
        self.shown = False
        self._started = clock()
        self._drawn_at = -PROGRESS_REDRAW_S
        self._base = 0
        self._width = 0

    def stage(self, label: str, base: int) -> Callable[[int], None]:
        """The callback of one run, whose milliseconds count from `base` of the total."""
        self.label = label
        self._base = base
        return self.update

    def update(self, done: int) -> None:
        """The current run has reached millisecond `done`."""
        now = self.clock()
        if now - self._started < self.after_s or now - self._drawn_at < PROGRESS_REDRAW_S:
            return
        self._drawn_at = now
        fraction = min(1.0, (self._base + done + 1) / self.total)
        filled = round(fraction * BAR_WIDTH)
        left = (now - self._started) * (1 - fraction) / fraction
        line = (
            f"{self.label} [{'#' * filled}{' ' * (BAR_WIDTH - filled)}] {fraction:4.0%}"
            f", about {_duration(left)} left"
        )
        self._width = max(self._width, len(line))
        self.stream.write("\r" + line.ljust(self._width))
        self.stream.flush()
        self.shown = True

    def finish(self) -> None:
        """Clear the bar if it was drawn."""
        if self.shown:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self.shown = False


def _duration(seconds: float) -> str:
    """`12 s`, `3 min 5 s`: an estimate to the second."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    return f"{whole // 60} min {whole % 60} s"
