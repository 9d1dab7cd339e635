"""A client's shared segment as the daemon maps it, and model files read from descriptors.

The daemon maps only a memfd the client sealed against shrinking (`F_SEAL_SHRINK`): a
segment the client could shrink under the mapping would fault the daemon on its next
touch. Every tensor the client names is bounds-checked against the segment before an
array is made over it. A model arrives as a descriptor the client opened, so the daemon
reads only what the client could read and never opens a path for it.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import stat
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from npumanager.daemon.host.shared import share
from npumanager.daemon.wire import protocol as p
from npumanager.daemon.wire import tensors
from npumanager.daemon.wire.tensors import TensorFields
from npumanager.errors import CapacityError, IllegalArgumentError


class Placed(NamedTuple):
    """One output as written into the segment."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def tensor(self) -> p.Tensor:
        """As the wire's model."""
        return p.Tensor(
            name=self.name,
            dtype=self.dtype,  # type: ignore[arg-type]
            shape=list(self.shape),
            offset=self.offset,
            nbytes=self.nbytes,
        )

    def json(self) -> str:
        """As the wire's JSON, without building the model."""
        return p.tensor_json(*self)


class SharedSegment:
    """A client's memfd mapped read-write; arrays are made over it only after checks."""

    def __init__(self, fd: int, size: int, limit: int) -> None:
        if size <= 0 or size > limit:
            raise CapacityError(
                f"a shared segment of {size} bytes is not allowed: 1..{limit} bytes "
                "(serve --max-shared-mib)"
            )
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise IllegalArgumentError("the shared segment must be a memfd (memfd_create)")
        if info.st_size != size:
            raise IllegalArgumentError(
                f"the shared segment holds {info.st_size} bytes but the frame says {size}"
            )
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            seals = 0
        if not seals & fcntl.F_SEAL_SHRINK:
            raise IllegalArgumentError(
                "the shared segment must be a memfd sealed against shrinking "
                "(MFD_ALLOW_SEALING, then F_ADD_SEALS with F_SEAL_SHRINK)"
            )
        try:
            self.memory = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        except OSError as exc:
            raise IllegalArgumentError(f"the shared segment cannot be mapped: {exc}") from None
        self.size = size
        self.shared = share(self.memory, fd)
        """The segment as model hosts map it too (`daemon.host.shared`)."""

    def inputs(self, refs: Sequence[TensorFields]) -> dict[str, np.ndarray]:
        """Arrays over the segment for an inference's inputs, each checked first."""
        feeds: dict[str, np.ndarray] = {}
        for ref in refs:
            if ref.name in feeds:
                raise IllegalArgumentError(f"input {ref.name!r} is given twice")
            tensors.check_tensor(ref.name, ref.dtype, ref.shape, ref.offset, ref.nbytes, self.size)
            feeds[ref.name] = tensors.view(self.memory, ref.dtype, ref.shape, ref.offset)
        return feeds

    def check(self, span: p.Span, what: str) -> None:
        """`IllegalArgumentError` unless the span lies inside the segment."""
        tensors.check_span(span.offset, span.size, self.size, what)

    def write(self, outputs: Sequence[np.ndarray], span: p.Span) -> list[Placed] | int:
        """Write outputs one after the other into the span: where each went, or the bytes
        they need when the span is too small (nothing written)."""
        return self.write_at(outputs, span.offset, span.size)

    def write_at(self, outputs: Sequence[np.ndarray], start: int, room: int) -> list[Placed] | int:
        """`write` into the `room` bytes from `start` (checked to lie in the segment)."""
        arrays = [np.require(out, requirements="C") for out in outputs]  # 0-d stays 0-d
        names = [tensors.dtype_name(array) for array in arrays]
        offsets, size = tensors.layout(arrays)
        if size > room:
            return size
        placed = []
        for index, (array, dtype, offset) in enumerate(zip(arrays, names, offsets, strict=True)):
            at = start + offset
            np.copyto(tensors.view(self.memory, dtype, array.shape, at), array)
            placed.append(Placed(str(index), dtype, array.shape, at, array.nbytes))
        return placed

    def bytes_at(self, span: p.Span) -> bytes:
        """A copy of the span's bytes (a small model sent in the segment)."""
        self.check(span, "the model's bytes")
        return self.memory[span.offset : span.offset + span.size]
