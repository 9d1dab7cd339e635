"""Tensors in a shared segment: the dtypes the wire carries, how arrays are laid out, and
the bounds checks every offset, shape and size passes before the daemon touches memory.

Both ends use the same layout: each tensor starts at a multiple of `TENSOR_ALIGN_BYTES`
inside a region of the segment, one after the other, C-contiguous.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, Protocol, get_args

import numpy as np

from npumanager.errors import IllegalArgumentError
from npumanager.schemas.limits import TENSOR_ALIGN_BYTES

DtypeName = Literal[
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
]
DTYPES: dict[str, np.dtype[Any]] = {name: np.dtype(name) for name in get_args(DtypeName)}
"""Every dtype a tensor on the wire may have, by its numpy name (native byte order)."""


class TensorFields(Protocol):
    """What names a tensor in the segment: a `Tensor` frame's or a lane's."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> Sequence[int]: ...
    @property
    def offset(self) -> int: ...
    @property
    def nbytes(self) -> int: ...


def aligned(n: int) -> int:
    """`n` rounded up to the tensor alignment."""
    return -(-n // TENSOR_ALIGN_BYTES) * TENSOR_ALIGN_BYTES


_NAMES: dict[np.dtype[Any], str] = {dtype: name for name, dtype in DTYPES.items()}


def dtype_name(array: np.ndarray) -> str:
    """The wire name of an array's dtype, or `IllegalArgumentError` naming the allowed ones
    (a big-endian dtype is another dtype: refused)."""
    name = _NAMES.get(array.dtype)
    if name is None:
        raise IllegalArgumentError(
            f"dtype {array.dtype} cannot cross the daemon's shared memory; allowed: "
            + ", ".join(DTYPES)
        )
    return name


def layout(arrays: Sequence[np.ndarray]) -> tuple[list[int], int]:
    """The offset of each array from a region's start, and the region's size."""
    offsets, end = [], 0
    for array in arrays:
        offsets.append(end)
        end = aligned(end + array.nbytes)
    return offsets, end


def expected_nbytes(dtype: str, shape: Sequence[int]) -> int:
    """How many bytes a C-contiguous tensor of this dtype and shape holds."""
    return math.prod(shape) * DTYPES[dtype].itemsize


def check_span(offset: int, size: int, segment: int, what: str) -> None:
    """`IllegalArgumentError` unless [offset, offset+size) lies inside a segment of `segment`
    bytes."""
    if offset < 0 or size < 0 or offset + size > segment:
        raise IllegalArgumentError(
            f"{what} [{offset}, {offset + size}) is outside the shared segment of {segment} bytes"
        )


def check_tensor(
    name: str, dtype: str, shape: Sequence[int], offset: int, nbytes: int, segment: int
) -> None:
    """`IllegalArgumentError` unless the tensor's bytes match its shape and dtype, start
    aligned to its item size, and lie inside the segment."""
    want = expected_nbytes(dtype, shape)
    if nbytes != want:
        raise IllegalArgumentError(
            f"tensor {name!r} says {nbytes} bytes, but {dtype}{list(shape)} holds {want}"
        )
    if offset % DTYPES[dtype].itemsize:
        raise IllegalArgumentError(
            f"tensor {name!r} starts at {offset}, not a multiple of its item size "
            f"{DTYPES[dtype].itemsize}"
        )
    check_span(offset, nbytes, segment, f"tensor {name!r}")


def view(buffer: Any, dtype: str, shape: Sequence[int], offset: int) -> np.ndarray:
    """The tensor as an array over the segment's memory (no copy); checked first."""
    dt = DTYPES[dtype]
    count = math.prod(shape)
    return np.frombuffer(buffer, dtype=dt, count=count, offset=offset).reshape(tuple(shape))
