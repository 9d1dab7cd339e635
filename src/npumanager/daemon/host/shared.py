"""Memory a model host can map too: a tensor that lies in it goes to the host by place.

A client's shared segment is a memfd the daemon maps (`daemon.server.segment`). Its
mapping is registered here with a descriptor of the same file, so that a hosted run whose
inputs are arrays over it sends the host the file once and then only offsets: the host
reads the inputs where the client wrote them, with no copy on the way.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_ids = itertools.count(1)
_lock = threading.Lock()
_files: weakref.WeakKeyDictionary[mmap.mmap, SharedFile] = weakref.WeakKeyDictionary()
_OWNER_DEPTH = 4
"""How far up an array's `base` chain its mapping may be (a reshaped `frombuffer` is 3)."""


@dataclass(frozen=True)
class SharedFile:
    """A registered mapping: its id, a descriptor of its file, its address and size."""

    id: int
    fd: int
    address: int
    size: int


def share(memory: mmap.mmap, fd: int) -> SharedFile:
    """Register `memory`, a mapping of the file `fd` (duplicated: the caller keeps its
    own); the duplicate is closed when the mapping is collected."""
    own = os.dup(fd)
    address = np.frombuffer(memory, dtype=np.uint8).__array_interface__["data"][0]
    shared = SharedFile(next(_ids), own, address, len(memory))
    with _lock:
        _files[memory] = shared
    weakref.finalize(memory, os.close, own)
    return shared


def locate(arrays: Sequence[np.ndarray]) -> tuple[SharedFile, list[int]] | None:
    """The one registered mapping every array lies in and each array's offset in it, or
    None when one of them lies elsewhere, or is not contiguous."""
    found: SharedFile | None = None
    offsets = []
    for array in arrays:
        if not array.flags.c_contiguous:
            return None
        shared = _mapping_of(array)
        if shared is None or (found is not None and shared is not found):
            return None
        offset = array.__array_interface__["data"][0] - shared.address
        if offset < 0 or offset + array.nbytes > shared.size:
            return None
        found = shared
        offsets.append(offset)
    return None if found is None else (found, offsets)


def _mapping_of(array: np.ndarray) -> SharedFile | None:
    owner: object = array
    for _ in range(_OWNER_DEPTH):
        owner = owner.obj if isinstance(owner, memoryview) else getattr(owner, "base", None)
        if owner is None:
            return None
        if isinstance(owner, mmap.mmap):
            with _lock:
                return _files.get(owner)
    return None
