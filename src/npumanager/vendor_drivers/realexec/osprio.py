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


def lower_thread_priority(steps: int, idle: bool = False) -> bool:
    """Raise this thread's nice value by `steps` (at most to `MAX_NICE`) and, with `idle`,
    put it under `SCHED_IDLE`; True if done. Off Linux, where `setpriority` would reach the
    whole process, it does nothing.

    A `SCHED_IDLE` thread gives way at once to any other thread that wakes: under the
    kernel's EEVDF scheduler a thread merely niced keeps its core until its slice is used,
    which a foreground thread waking beside it waits out (measured here: the two-process
    example's foreground p99 halved)."""
    if steps <= 0 or not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICE, now + steps))
        if idle:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread
    except OSError as exc:
        log.info("background worker keeps its priority (%s)", exc)
        return False
    return True
