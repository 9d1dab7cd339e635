"""What the daemon and a model host say to each other: JSON headers on a SOCK_SEQPACKET
socketpair, descriptors beside them (SCM_RIGHTS), tensors in memfds.

The daemon trusts nothing a host says: a header is at most `MAX_HEADER_BYTES` of JSON, at
most `MAX_FDS` descriptors come with it, and every tensor a host names is checked against
the memfd it came in (`read_tensors`) before an array is made over it.
"""

from __future__ import annotations

import array
import json
import mmap
import os
import socket
from collections.abc import Sequence
from typing import Any

import numpy as np

from npumanager.daemon.wire import tensors
from npumanager.errors import IllegalArgumentError

MAX_HEADER_BYTES = 64 << 10
MAX_FDS = 8
_FD_SIZE = array.array("i").itemsize


def send(sock: socket.socket, header: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """One message: its header, and descriptors beside it."""
    body = json.dumps(header, separators=(",", ":")).encode()
    if len(body) > MAX_HEADER_BYTES:
        raise IllegalArgumentError(f"a host message of {len(body)} bytes is over the limit")
    if fds:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        sock.sendmsg([body], rights)
    else:
        sock.sendall(body)


def receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The next message and its descriptors (the caller owns them); None at the end.
    `IllegalArgumentError` for one that is not a JSON object within the limits (its
    descriptors closed)."""
    body, ancillary, flags, _ = sock.recvmsg(
        MAX_HEADER_BYTES + 1, socket.CMSG_SPACE(MAX_FDS * _FD_SIZE)
    )
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % _FD_SIZE
            fds.extend(array.array("i", data[:usable]))
    if not body and not fds:
        return None
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(body) > MAX_HEADER_BYTES:
            raise IllegalArgumentError("a host message is over the limit")
        header = json.loads(body)
        if not isinstance(header, dict):
            raise IllegalArgumentError("a host message is not a JSON object")
    except (ValueError, IllegalArgumentError) as exc:
        for fd in fds:
            os.close(fd)
        raise IllegalArgumentError(f"an unreadable host message: {exc}") from None
    return header, fds


def write_tensors(arrays: Sequence[np.ndarray], name: str) -> tuple[int, list[dict[str, Any]]]:
    """A memfd holding the arrays one after the other (`tensors.layout`), and a ref per
    array: its dtype, shape, offset and size."""
    contiguous = [np.ascontiguousarray(a) for a in arrays]
    names = [tensors.dtype_name(a) for a in contiguous]
    offsets, size = tensors.layout(contiguous)
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        if size:
            os.ftruncate(fd, size)
            with mmap.mmap(fd, size) as memory:
                for a, dtype, offset in zip(contiguous, names, offsets, strict=True):
                    np.copyto(tensors.view(memory, dtype, a.shape, offset), a)
    except BaseException:
        os.close(fd)
        raise
    refs = [
        {"dtype": dtype, "shape": list(a.shape), "offset": offset, "nbytes": a.nbytes}
        for a, dtype, offset in zip(contiguous, names, offsets, strict=True)
    ]
    return fd, refs


def read_tensors(fd: int, refs: Any, *, writable: bool = False) -> list[np.ndarray]:
    """Arrays over a memfd's tensors, each checked against the memfd first (its dtype, its
    shape against its size, its bytes inside the file); the descriptor is closed."""
    try:
        size = os.fstat(fd).st_size
        if not isinstance(refs, list):
            raise IllegalArgumentError("tensor refs must be a list")
        checked = []
        for index, ref in enumerate(refs):
            if not isinstance(ref, dict):
                raise IllegalArgumentError("a tensor ref must be an object")
            dtype, shape = ref.get("dtype"), ref.get("shape")
            offset, nbytes = ref.get("offset"), ref.get("nbytes")
            if dtype not in tensors.DTYPES or not isinstance(shape, list):
                raise IllegalArgumentError(f"tensor {index} has no known dtype and shape")
            if not all(type(d) is int and d >= 0 for d in shape) or len(shape) > 32:
                raise IllegalArgumentError(f"tensor {index} has a bad shape {shape!r}")
            if type(offset) is not int or type(nbytes) is not int:
                raise IllegalArgumentError(f"tensor {index} has a bad offset or size")
            tensors.check_tensor(str(index), dtype, shape, offset, nbytes, size)
            checked.append((dtype, shape, offset, nbytes))
        if not size:
            return [np.empty(shape, tensors.DTYPES[dtype]) for dtype, shape, _, _ in checked]
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        memory = mmap.mmap(fd, size, access=access)
    finally:
        os.close(fd)
    return [
        tensors.view(memory, dtype, shape, offset) if nbytes else np.empty(shape, dtype)
        for dtype, shape, offset, nbytes in checked
    ]
