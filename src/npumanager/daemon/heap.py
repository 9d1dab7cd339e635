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
