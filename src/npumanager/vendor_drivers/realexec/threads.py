"""How many threads one run of a model may use: the driver's setting, or what the app asked."""

from __future__ import annotations

import os


def run_threads(asked: int | None, configured: int, background: bool) -> int:
    """The threads of a model's runs: the driver's `configured` count unless the app
    `asked` (0: one per CPU, as the runtimes do by default), never more than the CPUs; one
    for a model opened in a background band, whose runs go to a lowered thread that a
    runtime's own pool threads would not follow."""
    if asked is None:
        return configured
    if background:
        return 1
    cpus = len(os.sched_getaffinity(0)) or 1
    return cpus if asked == 0 else min(asked, cpus)
