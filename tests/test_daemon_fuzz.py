"""Hypothesis against a live daemon: random bytes and random well-formed frames.

After every example the fuzzing connection is closed; the daemon must still be up, must
have forgotten that connection and every request it made, and must answer a real client.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import npumanager as npu
from helpers.daemon_support import WAIT_S, DaemonProcess, Daemons
from npumanager.schemas.limits import PROTOCOL_VERSION

OPS = [
    "hello",
    "request",
    "cancel",
    "loaded",
    "unloaded",
    "load_model",
    "submit",
    "cancel_work",
    "set_policy",
    "set_importance",
    "set_access",
    "info",
]
FIELDS = [
    "seq",
    "version",
    "request",
    "request_id",
    "weight_bytes",
    "sram_bytes",
    "model",
    "cost_cycles",
    "job_priority",
    "original_uid",
    "uid",
    "importance",
    "policy",
    "params",
    "uses_feature",
    "group_id",
    "feature_id",
    "has_direct_access",
]
scalars = (
    st.integers(-(2**64), 2**64)
    | st.integers(0, 8)
    | st.booleans()
    | st.none()
    | st.text(max_size=12)
    | st.sampled_from(
        ["budget", "status_quo", "turn_taking", "12345678-90ab-cdef-1122-334455667788"]
    )
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
requests = st.fixed_dictionaries(
    {
        "id": st.integers(0, 5),
        "size": st.integers(0, 3),
        "priority": st.sampled_from([0, 1000, 2000, 5]),
    }
)
bodies = st.fixed_dictionaries(
    {"op": st.sampled_from(OPS) | st.text(max_size=8)},
    optional={
        "seq": st.integers(0, 100) | values,
        "version": st.just(PROTOCOL_VERSION) | values,
        "request": requests | values,
        "request_id": st.integers(0, 5) | values,
    },
).flatmap(
    lambda base: st.dictionaries(st.sampled_from(FIELDS), values, max_size=3).map(
        lambda extra: {**extra, **base}
    )
)
HELLO = {"op": "hello", "version": PROTOCOL_VERSION}


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@pytest.fixture
def fuzzed(daemon: Daemons) -> DaemonProcess:
    """The daemon every example of one test sends its bytes to."""
    return daemon("--policy", "budget")


def _send_and_close(path: Path, payload: bytes) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2)
    sock.connect(str(path))
    try:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and sock.recv(65536):
            pass
    except OSError:
        pass
    finally:
        sock.close()


def _check_consistent(daemon: DaemonProcess) -> None:
    assert daemon.alive, daemon.log()
    deadline = time.monotonic() + WAIT_S
    with npu.DaemonClient(daemon.socket) as admin:
        while True:
            info = admin.info()
            live = [r for requests in info["requests"].values() for r in requests]
            if info["daemon"]["connections"] == 1 and not live:
                break
            assert time.monotonic() < deadline, f"the daemon kept a dead connection: {info}"
            time.sleep(0.01)
        assert [c["uid"] for c in info["clients"]] == [admin.uid]
        assert info["devices"][0]["models_loaded"] == 0
        assert info["daemon"]["internal_errors"] == 0, daemon.log()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=600), after_hello=st.booleans())
def test_random_bytes_never_hurt_the_daemon(
    fuzzed: DaemonProcess, data: bytes, after_hello: bool
) -> None:
    prefix = _frame(json.dumps(HELLO).encode()) if after_hello else b""
    _send_and_close(fuzzed.socket, prefix + data)
    _check_consistent(fuzzed)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(frames=st.lists(bodies, min_size=1, max_size=8), after_hello=st.booleans())
@example(  # a request granted and loaded, then the connection goes: the death path
    frames=[
        {"op": "request", "seq": 1, "request": {"id": 1, "size": 0, "priority": 0}},
        {"op": "load_model", "seq": 2, "request_id": 1, "weight_bytes": 1},
        {"op": "loaded", "seq": 3, "request_id": 1},
    ],
    after_hello=True,
)
def test_random_well_formed_frames_never_hurt_the_daemon(
    fuzzed: DaemonProcess, frames: list[dict[str, object]], after_hello: bool
) -> None:
    sequence = ([HELLO] if after_hello else []) + frames
    _send_and_close(fuzzed.socket, b"".join(_frame(json.dumps(f).encode()) for f in sequence))
    _check_consistent(fuzzed)
