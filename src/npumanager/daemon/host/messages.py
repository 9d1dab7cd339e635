"""What the daemon and a model host say to each other: messages on a SOCK_SEQPACKET
socketpair, each a JSON header and the bytes after it, descriptors beside them
(SCM_RIGHTS); tensors of up to `INLINE_BYTES` in the message, larger ones in a memfd.

The daemon trusts nothing a host says: a message is at most `MAX_MESSAGE_BYTES`, at most
`MAX_FDS` descriptors come with it, and every tensor a host names is checked against the
bytes or the memfd it came in (`read_tensors`) before an array is made over it.
"""

from __future__ import annotations

import array
import json
import mmap
import os
import socket
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from npumanager.daemon.wire import tensors
from npumanager.errors import IllegalArgumentError

MAX_HEADER_BYTES = 16 << 10
"""A header of at most this many bytes travels in the message; a longer one (a run of a
model with hundreds of inputs) in a memfd sent first, of at most `MAX_SPILLED_HEADER_BYTES`."""
MAX_SPILLED_HEADER_BYTES = 1 << 20
"""As large as a client's frame: no run the daemon accepts needs a longer header."""
INLINE_BYTES = 64 << 10
"""Tensors of at most this many bytes in all travel in the message itself."""
MAX_MESSAGE_BYTES = 4 + MAX_HEADER_BYTES + INLINE_BYTES
MAX_FDS = 8
_FD_SIZE = array.array("i").itemsize


class Message(NamedTuple):
    """A message received: its header, the bytes after it, and its descriptors (owned)."""

    header: dict[str, Any]
    payload: bytes
    fds: list[int]


def send(
    sock: socket.socket, header: dict[str, Any], fds: Sequence[int] = (), payload: bytes = b""
) -> None:
    """One message: its header and payload, and descriptors beside it."""
    head = json.dumps(header, separators=(",", ":")).encode()
    if len(head) > MAX_SPILLED_HEADER_BYTES or len(payload) > INLINE_BYTES:
        raise IllegalArgumentError(
            f"a host message with a header of {len(head)} bytes and {len(payload)} bytes "
            f"inline is over the limits ({MAX_SPILLED_HEADER_BYTES} and {INLINE_BYTES})"
        )
    spilled = -1
    if len(head) > MAX_HEADER_BYTES:
        spilled = os.memfd_create("npu-header", os.MFD_CLOEXEC)
        os.write(spilled, head)  # a memfd takes it whole
        head = b'{"header_in_fd":%d}' % len(head)
        fds = [spilled, *fds]
    try:
        body = len(head).to_bytes(4, "little") + head + payload
        if fds:
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
            sock.sendmsg([body], rights)
        else:
            sock.sendall(body)
    finally:
        if spilled >= 0:
            os.close(spilled)


def receive(sock: socket.socket) -> Message | None:
    """The next message (the caller owns its descriptors); None at the end.
    `IllegalArgumentError` for one that is not a JSON object within the limits (its
    descriptors closed)."""
    body, ancillary, flags, _ = sock.recvmsg(
        MAX_MESSAGE_BYTES + 1, socket.CMSG_SPACE(MAX_FDS * _FD_SIZE)
    )
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % _FD_SIZE
            fds.extend(array.array("i", data[:usable]))
    if not body and not fds:
        return None
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(body) > MAX_MESSAGE_BYTES:
            raise IllegalArgumentError("a host message is over the limit")
        size = int.from_bytes(body[:4], "little")
        if len(body) < 4 or size > min(MAX_HEADER_BYTES, len(body) - 4):
            raise IllegalArgumentError("a host message's header runs past its end")
        header = json.loads(body[4 : 4 + size])
        if not isinstance(header, dict):
            raise IllegalArgumentError("a host message is not a JSON object")
        if "header_in_fd" in header:
            header = _spilled_header(header["header_in_fd"], fds)
    except (ValueError, IllegalArgumentError) as exc:
        for fd in fds:
            os.close(fd)
        raise IllegalArgumentError(f"an unreadable host message: {exc}") from None
    return Message(header, body[4 + size :], fds)


def _spilled_header(declared: Any, fds: list[int]) -> dict[str, Any]:
    """The header a memfd (the message's first descriptor, taken and closed) carries."""
    if type(declared) is not int or not MAX_HEADER_BYTES < declared <= MAX_SPILLED_HEADER_BYTES:
        raise IllegalArgumentError(f"a spilled header of {declared!r} bytes")
    if not fds:
        raise IllegalArgumentError("a spilled header without its descriptor")
    fd = fds.pop(0)
    try:
        if os.fstat(fd).st_size != declared:
            raise IllegalArgumentError("a spilled header of another size than it says")
        head = os.pread(fd, declared, 0)
    finally:
        os.close(fd)
    header = json.loads(head)
    if not isinstance(header, dict):
        raise IllegalArgumentError("a spilled header is not a JSON object")
    return header


def pack_tensors(arrays: Sequence[np.ndarray]) -> tuple[bytes, list[dict[str, Any]]] | None:
    """The arrays laid out in bytes for the message itself, with their refs; None when
    they are over `INLINE_BYTES` (a memfd carries them: `write_tensors`)."""
    contiguous = [np.require(a, requirements="C") for a in arrays]
    offsets, size = tensors.layout(contiguous)
    if size > INLINE_BYTES:
        return None
    out = bytearray(size)
    for a, offset in zip(contiguous, offsets, strict=True):
        out[offset : offset + a.nbytes] = a.tobytes()
    return bytes(out), refs_at(contiguous, offsets)


def refs_at(arrays: Sequence[np.ndarray], offsets: Sequence[int]) -> list[dict[str, Any]]:
    """Refs to contiguous arrays lying at `offsets` of a payload, a memfd or a mapping."""
    return [
        {"dtype": tensors.dtype_name(a), "shape": list(a.shape), "offset": at, "nbytes": a.nbytes}
        for a, at in zip(arrays, offsets, strict=True)
    ]


def write_tensors(arrays: Sequence[np.ndarray], name: str) -> tuple[int, list[dict[str, Any]]]:
    """A memfd holding the arrays one after the other (`tensors.layout`), and a ref per
    array: its dtype, shape, offset and size."""
    contiguous = [np.require(a, requirements="C") for a in arrays]
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
    return fd, refs_at(contiguous, offsets)


def read_tensors(source: int | bytes | mmap.mmap, refs: Any) -> list[np.ndarray]:
    """Arrays over the tensors of a memfd (closed after), of a message's payload or of a
    mapping, each checked first: its dtype, its shape against its size, its bytes inside
    the source."""
    if not isinstance(source, int):
        checked = _checked_refs(refs, len(source))
        return [
            tensors.view(source, dtype, shape, offset) if nbytes else np.empty(shape, dtype)
            for dtype, shape, offset, nbytes in checked
        ]
    fd = source
    try:
        size = os.fstat(fd).st_size
        checked = _checked_refs(refs, size)
        if not size:
            return [np.empty(shape, tensors.DTYPES[dtype]) for dtype, shape, _, _ in checked]
        memory = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    return [
        tensors.view(memory, dtype, shape, offset) if nbytes else np.empty(shape, dtype)
        for dtype, shape, offset, nbytes in checked
    ]


def _checked_refs(refs: Any, size: int) -> list[tuple[str, list[int], int, int]]:
    """Each ref's dtype, shape, offset and size, checked against a source of `size` bytes."""
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
    return checked
