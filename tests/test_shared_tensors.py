"""The shared segment's two ends in one process: the daemon's bounds checks, the client's
region allocator, and outputs written by one end and read by the other."""

from __future__ import annotations

import fcntl
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npumanager.daemon.client import tensors as client_tensors
from npumanager.daemon.client.shared_memory import ClientSegment, sealed_memfd
from npumanager.daemon.server.segment import SharedSegment
from npumanager.daemon.wire import protocol as p
from npumanager.daemon.wire import tensors
from npumanager.errors import CapacityError, IllegalArgumentError
from npumanager.modelfiles import read_model_file
from npumanager.schemas.limits import TENSOR_ALIGN_BYTES

SIZE = 1 << 16


@pytest.fixture(scope="module")
def daemon_side() -> SharedSegment:
    fd = sealed_memfd("test", size=SIZE)
    try:
        return SharedSegment(fd, SIZE, SIZE)
    finally:
        os.close(fd)


dtypes = st.sampled_from(sorted(tensors.DTYPES))
shapes = st.lists(st.integers(0, 70), min_size=0, max_size=4)


@given(
    dtype=dtypes,
    shape=shapes,
    offset=st.integers(0, SIZE + 100),
    slack=st.integers(-8, 8) | st.just(0),
)
@settings(max_examples=400, deadline=None)
def test_an_input_is_refused_or_lies_wholly_inside_the_segment(
    daemon_side: SharedSegment, dtype: str, shape: list[int], offset: int, slack: int
) -> None:
    itemsize = tensors.DTYPES[dtype].itemsize
    want = math.prod(shape) * itemsize
    nbytes = max(0, want + slack)
    ref = p.Tensor(name="x", dtype=dtype, shape=shape, offset=offset, nbytes=nbytes)  # type: ignore[arg-type]
    honest = nbytes == want and offset % itemsize == 0 and offset + nbytes <= SIZE
    if not honest:
        with pytest.raises(IllegalArgumentError):
            daemon_side.inputs([ref])
        return
    (array,) = daemon_side.inputs([ref]).values()
    assert array.shape == tuple(shape) and array.dtype == tensors.DTYPES[dtype]
    base = np.frombuffer(daemon_side.memory, dtype=np.uint8)
    if array.size:
        start = array.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        assert start == offset and start + array.nbytes <= SIZE


@given(
    outputs=st.lists(
        st.tuples(dtypes, st.lists(st.integers(1, 9), min_size=1, max_size=3)), max_size=4
    ),
    room=st.integers(0, 4096),
    at=st.integers(0, 1024).map(lambda n: n * TENSOR_ALIGN_BYTES // 16),
)
@settings(max_examples=200, deadline=None)
def test_outputs_written_by_the_daemon_read_back_equal_or_ask_for_room(
    daemon_side: SharedSegment, outputs: list[tuple[str, list[int]]], room: int, at: int
) -> None:
    rng = np.random.default_rng(0)
    arrays = [(rng.random(shape) * 100).astype(dtype) for dtype, shape in outputs]
    span = p.Span(offset=at, size=min(room, SIZE - at))
    refs = daemon_side.write(arrays, span)
    _, need = tensors.layout(arrays)
    if isinstance(refs, int):
        assert refs == need > span.size
        return
    assert need <= span.size
    for ref, array in zip(refs, arrays, strict=True):
        assert span.offset <= ref.offset and ref.offset + ref.nbytes <= span.offset + span.size
        back = tensors.view(daemon_side.memory, ref.dtype, ref.shape, ref.offset)
        assert np.array_equal(back, array) and back.dtype == array.dtype


@pytest.mark.parametrize(
    "output",
    [np.array(7, dtype=np.int64), np.float32(2.5), np.array(True), np.array(3.0)[()]],
    ids=["0-d int64", "float32 scalar", "0-d bool", "float64 scalar"],
)
def test_a_0d_output_is_written_described_and_read_back_with_shape_empty(output: object) -> None:
    segment = ClientSegment(4096)
    try:
        daemon_end = SharedSegment(segment.fd, 4096, 4096)
        placed = daemon_end.write_at([output, np.arange(3, dtype=np.int16)], 64, 4096 - 64)
        assert not isinstance(placed, int)
        scalar, vector = placed
        assert scalar.shape == () and vector.shape == (3,)
        wire = scalar.tensor()
        assert wire.shape == [] and wire.nbytes == np.asarray(output).itemsize
        assert p.Tensor.model_validate_json(scalar.json()) == wire
        [back, _] = client_tensors.copy_out(segment, [wire, vector.tensor()])
        assert back.shape == () and back.dtype == np.asarray(output).dtype
        assert back == output
        [viewed] = client_tensors.views(segment, [wire])
        assert viewed.shape == () and viewed == output
    finally:
        segment.close_descriptor()


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 9000)), max_size=60))
@settings(max_examples=200, deadline=None)
def test_the_client_allocator_never_lends_one_byte_twice_and_gets_all_back(
    steps: list[tuple[bool, int]],
) -> None:
    segment = ClientSegment(SIZE)
    try:
        lent: list[tuple[int, int]] = []
        for take, nbytes in steps:
            if take or not lent:
                try:
                    offset = segment.allocate(nbytes, 0)
                except CapacityError:
                    largest = max((size for _, size in segment._free), default=0)
                    assert largest < tensors.aligned(nbytes)  # refused only when nothing fits
                    continue
                assert offset % TENSOR_ALIGN_BYTES == 0
                assert offset + tensors.aligned(nbytes) <= SIZE
                for other, size in lent:
                    end, other_end = offset + tensors.aligned(nbytes), other + tensors.aligned(size)
                    assert end <= other or other_end <= offset, "two regions overlap"
                lent.append((offset, nbytes))
            else:
                offset, size = lent.pop(nbytes % len(lent))
                segment.release(offset, size)
        for offset, nbytes in lent:
            segment.release(offset, nbytes)
        assert segment.free_bytes == SIZE
        assert segment.allocate(SIZE, 0) == 0  # merged back into one stretch
    finally:
        segment.memory.close()
        segment.close_descriptor()


def test_a_region_larger_than_the_segment_is_refused_at_once() -> None:
    segment = ClientSegment(4096)
    with pytest.raises(CapacityError, match="connect\\(shared_bytes=...\\)"):
        segment.allocate(8192, None)
    segment.close_descriptor()


def test_the_clients_segment_is_sealed_so_the_daemon_can_map_it() -> None:
    segment = ClientSegment(4096)
    seals = fcntl.fcntl(segment.fd, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW and seals & fcntl.F_SEAL_SEAL
    with pytest.raises(OSError):
        os.ftruncate(segment.fd, 0)
    SharedSegment(segment.fd, 4096, 4096)
    segment.close_descriptor()


def test_a_segment_that_could_shrink_or_is_over_the_limit_is_refused() -> None:
    plain = os.memfd_create("plain")
    os.ftruncate(plain, 4096)
    with pytest.raises(IllegalArgumentError, match="sealed against shrinking"):
        SharedSegment(plain, 4096, 4096)
    with pytest.raises(CapacityError, match="1..1024 bytes"):
        SharedSegment(plain, 4096, 1024)
    with pytest.raises(IllegalArgumentError, match="holds 4096 bytes but the frame says 8192"):
        SharedSegment(plain, 8192, 1 << 20)
    os.close(plain)


def test_a_model_file_is_read_whole_without_moving_the_clients_offset() -> None:
    data = os.urandom(3 << 20)
    fd = sealed_memfd("model", data)
    os.lseek(fd, 5, os.SEEK_SET)
    assert read_model_file(fd, 4 << 20) == data
    assert os.lseek(fd, 0, os.SEEK_CUR) == 5
    with pytest.raises(CapacityError, match="at most 1048576"):
        read_model_file(fd, 1 << 20)
    os.close(fd)
