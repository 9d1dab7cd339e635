"""Tensors in the shared segment on the client's side: which inputs are read in place,
where the others are copied, and the outputs copied out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from npumanager.daemon.client.shared_memory import ClientSegment
from npumanager.daemon.wire import protocol as p
from npumanager.daemon.wire import tensors
from npumanager.daemon.wire.lane import TensorRef
from npumanager.errors import IllegalArgumentError

Arrays = list[tuple[str, str, np.ndarray]]
"""Each input's name, wire dtype and C-contiguous array."""


def arrays(inputs: Mapping[str, Any]) -> Arrays:
    """Each input's name, wire dtype and C-contiguous array."""
    if not isinstance(inputs, Mapping):
        raise IllegalArgumentError(f"inputs must be a mapping of name to array; got {inputs!r:.60}")
    arrays = []
    for name, value in inputs.items():
        if not isinstance(name, str):
            raise IllegalArgumentError(f"input names are str; got {name!r}")
        array = np.require(value, requirements="C")  # 0-d stays 0-d
        arrays.append((name, tensors.dtype_name(array), array))
    return arrays


def placement(
    segment: ClientSegment, arrays: Arrays, in_place: list[int | None] | None = None
) -> tuple[list[tuple[bool, int]], int]:
    """Where each input goes: (True, its offset in the segment) when it lies there already
    (a `shared_array`: read in place), else (False, its offset in the region it is copied
    to); and the bytes the copies need. `in_place`: each one's `segment.offset_of`, if
    known."""
    if in_place is None:
        in_place = [segment.offset_of(array) for _, _, array in arrays]
    copied = [array for (_, _, array), at in zip(arrays, in_place, strict=True) if at is None]
    offsets, size = tensors.layout(copied)
    relative = iter(offsets)
    return [(True, at) if at is not None else (False, next(relative)) for at in in_place], size


def written(
    segment: ClientSegment,
    arrays: Arrays,
    places: list[tuple[bool, int]],
    base: int,
) -> list[tuple[str, str, tuple[int, ...], int, int]]:
    """Copy the inputs not in place into the region at `base`; each one's name, dtype,
    shape, offset and bytes."""
    refs = []
    for (name, dtype, array), (in_place, offset) in zip(arrays, places, strict=True):
        at = offset if in_place else base + offset
        if not in_place:
            np.copyto(tensors.view(segment.memory, dtype, array.shape, at), array)
        refs.append((name, dtype, array.shape, at, array.nbytes))
    return refs


def views(segment: ClientSegment, refs: Sequence[p.Tensor | TensorRef]) -> list[np.ndarray]:
    """Arrays over the segment for tensors the daemon named, each checked first."""
    out = []
    for ref in refs:
        tensors.check_tensor(ref.name, ref.dtype, ref.shape, ref.offset, ref.nbytes, segment.size)
        out.append(tensors.view(segment.memory, ref.dtype, ref.shape, ref.offset))
    return out


def copy_out(segment: ClientSegment, refs: Sequence[p.Tensor | TensorRef]) -> list[np.ndarray]:
    """Copies of the tensors the daemon named (the caller's own arrays)."""
    return [view.copy() for view in views(segment, refs)]
