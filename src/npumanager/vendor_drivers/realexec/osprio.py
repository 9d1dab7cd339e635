"""Lowering the OS priority of the calling thread, for a real device's background workers.

On Linux a thread has its own `nice` value (`setpriority` on its thread id), so background
inferences computed on their worker's thread yield a core to foreground ones. An
unprivileged thread can lower its priority but not raise it again, so a driver gives
background work threads of its own rather than switching a thread back and forth.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from npumanager.schemas.limits import MAX_NICE

log = logging.getLogger(__name__)


def lower_thread_priority(steps: int) -> bool:
    """Raise this thread's nice value by `steps` (at most to `MAX_NICE`); True if done.
    Off Linux, where `setpriority` would reach the whole process, it does nothing."""
    if steps <= 0 or not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICE, now + steps))
    except OSError as exc:
        log.info("background worker keeps its priority (%s)", exc)
        return False
    return True
