"""A client's shared segment as mapped where its inferences run (the daemon, or its model
host): arrays over its inputs made only after each is checked, and outputs written into
the region the client named.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from npumanager.daemon.wire import protocol as p
from npumanager.daemon.wire import tensors
from npumanager.daemon.wire.tensors import TensorFields
from npumanager.errors import IllegalArgumentError


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


class Segment:
    """A mapping of a client's segment of `size` bytes; every tensor named is checked
    against it before an array is made over it."""

    def __init__(self, memory: mmap.mmap, size: int) -> None:
        self.memory = memory
        self.size = size

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
