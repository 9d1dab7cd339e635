"""What crosses between the daemon and a model host: messages on a SOCK_SEQPACKET pair,
tensors in the message or in a memfd, and nothing a host says trusted."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from npumanager.daemon.host import messages
from npumanager.daemon.wire.tensors import DTYPES
from npumanager.errors import IllegalArgumentError


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield a, b
    a.close()
    b.close()


arrays = st.lists(
    hnp.arrays(
        st.sampled_from(sorted(DTYPES)).map(np.dtype),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9),
    ),
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(arrays)
def test_tensors_come_back_as_they_went_in_the_message_and_in_a_memfd(
    sent: list[np.ndarray],
) -> None:
    packed = messages.pack_tensors(sent)
    assert packed is not None
    payload, refs = packed
    fd, memfd_refs = messages.write_tensors(sent, "t")
    for got in (messages.read_tensors(payload, refs), messages.read_tensors(fd, memfd_refs)):
        assert len(got) == len(sent)
        for a, b in zip(sent, got, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()


def test_a_message_crosses_with_its_payload_and_descriptors(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    fd = os.open(os.devnull, os.O_RDONLY)
    messages.send(a, {"op": "run", "id": 7}, [fd], b"\x01\x02")
    os.close(fd)
    got = messages.receive(b)
    assert got is not None
    assert got.header == {"op": "run", "id": 7} and got.payload == b"\x01\x02"
    assert len(got.fds) == 1
    os.close(got.fds[0])
    a.close()
    assert messages.receive(b) is None, "the end of the other side"


@pytest.mark.parametrize(
    "body",
    [b"", b"\x05\x00\x00\x00{}", b"\x02\x00\x00\x00[]", b"\x03\x00\x00\x00{{{", b"\xff" * 8],
    ids=["empty", "header-past-end", "not-an-object", "not-json", "huge-length"],
)
def test_a_malformed_message_is_refused_and_its_descriptors_closed(
    pair: tuple[socket.socket, socket.socket], body: bytes
) -> None:
    a, b = pair
    fd = os.open(os.devnull, os.O_RDONLY)
    a.sendmsg([body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd.to_bytes(4, "little"))])
    os.close(fd)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(IllegalArgumentError, match="unreadable host message"):
        messages.receive(b)
    assert set(os.listdir("/proc/self/fd")) <= before, "what came with it is closed"


@pytest.mark.parametrize("entries", [10, 2_000, 20_000])
def test_a_header_of_any_size_a_run_needs_crosses_and_its_memfd_is_closed(
    pair: tuple[socket.socket, socket.socket], entries: int
) -> None:
    """A run of a model with thousands of inputs names each in its header: past
    `MAX_HEADER_BYTES` the header travels in a memfd, sent before the message's own."""
    a, b = pair
    header = {"op": "run", "names": [f"input_{i}" for i in range(entries)]}
    fd = os.open(os.devnull, os.O_RDONLY)
    before = set(os.listdir("/proc/self/fd"))
    messages.send(a, header, [fd], b"\x07")
    os.close(fd)
    got = messages.receive(b)
    assert got is not None and got.header == header and got.payload == b"\x07"
    assert len(got.fds) == 1, "the message's own descriptor, the header's taken"
    os.close(got.fds[0])
    assert set(os.listdir("/proc/self/fd")) <= before


@pytest.mark.parametrize(
    ("declared", "size", "said"),
    [
        (100, 100, "a spilled header of 100 bytes"),
        (messages.MAX_SPILLED_HEADER_BYTES + 1, 8, "a spilled header of"),
        (20_000, 19_999, "another size than it says"),
        ("x", 8, "a spilled header of 'x' bytes"),
    ],
)
def test_a_lying_spilled_header_is_refused_and_closed(
    pair: tuple[socket.socket, socket.socket], declared: object, size: int, said: str
) -> None:
    a, b = pair
    memfd = os.memfd_create("h")
    os.ftruncate(memfd, size)
    head = json.dumps({"header_in_fd": declared}).encode()
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, memfd.to_bytes(4, "little"))]
    a.sendmsg([len(head).to_bytes(4, "little") + head], rights)
    os.close(memfd)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(IllegalArgumentError, match=said):
        messages.receive(b)
    assert set(os.listdir("/proc/self/fd")) <= before


def test_a_message_over_the_limit_is_refused(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    a.sendall(b"\x02\x00\x00\x00{}" + bytes(messages.MAX_MESSAGE_BYTES))
    with pytest.raises(IllegalArgumentError, match="over the limit"):
        messages.receive(b)


ref = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from([*DTYPES, "complex64", "object", 3]),
        "shape": st.one_of(
            st.lists(st.integers(-2, 1 << 40), max_size=4), st.text(max_size=3), st.none()
        ),
        "offset": st.one_of(st.integers(-(1 << 40), 1 << 40), st.floats(), st.none()),
        "nbytes": st.one_of(st.integers(-1, 1 << 40), st.text(max_size=2)),
    }
)


@settings(max_examples=200, deadline=None)
@given(st.lists(ref, min_size=1, max_size=3), st.integers(0, 4096))
def test_a_hosts_tensor_refs_are_checked_against_what_came(refs: list[Any], size: int) -> None:
    """Any refs a hostile host may send: arrays only for those that fit what came with them,
    else `IllegalArgumentError`; never an array past the end."""
    payload = bytes(size)
    try:
        got = messages.read_tensors(payload, refs)
    except IllegalArgumentError:
        return
    for r, array in zip(refs, got, strict=True):
        assert r["offset"] + r["nbytes"] <= size and array.nbytes == r["nbytes"]
