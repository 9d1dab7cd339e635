"""Real inference through a daemon (`start_onnxruntime` in conftest.py): the apps, the
test process as a raw client, and the same model run in process to compare outputs with.

The daemon inference and lane tests share these (tests/test_daemon_inference.py,
tests/test_daemon_lanes.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import npumanager as npu
from helpers.daemon_support import (
    BACKGROUND_UID,
    FOREGROUND_UID,
    WAIT_S,
    Child,
    DaemonProcess,
)
from npumanager.daemon.wire import protocol as p
from npumanager.schemas import ModelLoadStatus
from npumanager.vendor_drivers.realexec.chain import chain_model

CAN_LOAD_NOW = int(ModelLoadStatus.CAN_LOAD_NOW)
ENDLESS = 2
"""The request id, in an app, of the endless model (`load_endless`); the chain model's is 1."""


def app(daemon: DaemonProcess, uid: int) -> Child:
    child = Child(daemon.socket, uid)
    daemon.children.append(child)  # type: ignore[attr-defined]
    assert "ready" in child.hello, child.hello
    return child


def granted(child: Child, request_id: int = 1) -> None:
    child.ok("request", id=request_id, size=0)
    assert child.event("decision", request_id)["status"] == CAN_LOAD_NOW


def loaded_app(daemon: DaemonProcess, uid: int, model_file: Path) -> Child:
    child = app(daemon, uid)
    granted(child)
    child.ok("real_load", id=1, path=str(model_file))
    return child


def endless_model(width: int = 256) -> bytes:
    """A model of the chain model's input (`x: float32[rows, width]`) whose inference never
    ends by itself: a Loop of 2**63 - 1 trips, each adding 1 to x. Only the runtime's cancel
    (`RunOptions.terminate`, which the loop looks at every trip) ends it, and at once: a
    test that acts while an inference runs has one running, however fast or busy the
    machine, until its cancel, timeout, unload or kill ends it."""
    from onnx import TensorProto, helper, numpy_helper

    body = helper.make_graph(
        [
            helper.make_node("Identity", ["going"], ["still_going"]),
            helper.make_node("Add", ["v", "one"], ["v_next"]),
        ],
        "trip",
        [
            helper.make_tensor_value_info("trip", TensorProto.INT64, []),
            helper.make_tensor_value_info("going", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, ["rows", width]),
        ],
        [
            helper.make_tensor_value_info("still_going", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_next", TensorProto.FLOAT, ["rows", width]),
        ],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "x"], ["y"], body=body)],
        "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", width])],
        [
            numpy_helper.from_array(np.array(np.iinfo(np.int64).max, np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "go"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data: bytes = model.SerializeToString()
    return data


def load_endless(child: Child, directory: Path) -> int:
    """Load the endless model (`endless_model`) in an app, under a new granted request
    (`ENDLESS`): the id its `real_submit` and `real_run` take."""
    path = directory / "endless.onnx"
    if not path.exists():
        path.write_bytes(endless_model())
        path.chmod(0o644)
    granted(child, ENDLESS)
    child.ok("real_load", id=ENDLESS, path=str(path))
    return ENDLESS


def running(daemon: DaemonProcess) -> int:
    """How many inferences the daemon's device runs now."""
    count: int = info(daemon)["devices"][0]["running"]
    return count


@functools.lru_cache
def in_process_digest(rows: int, value: float, driver: str = "onnxruntime") -> dict[str, Any]:
    """The same model and inputs run in process, as the child digests its outputs (run
    once for each set of arguments: compare what it returns, do not change it)."""
    service = npu.Service(driver)
    try:
        manager = service.manager(FOREGROUND_UID, uses_feature=True)
        request = npu.ModelLoadRequest.Builder(1).set_size(0).build()
        with manager.reserve(request, timeout_s=WAIT_S) as lease:
            model = lease.load_model(model=chain_model())
            x = np.full((rows, 256), value, dtype=np.float32)
            outputs = model.run({"x": x})
    finally:
        service.close()
    return {
        "shapes": [list(o.shape) for o in outputs],
        "dtypes": [str(o.dtype) for o in outputs],
        "sha256": hashlib.sha256(b"".join(o.tobytes() for o in outputs)).hexdigest(),
    }


def info(daemon: DaemonProcess) -> dict[str, Any]:
    with npu.DaemonClient(daemon.socket) as client:
        return client.info()


def segments_mapped(daemon: DaemonProcess) -> int:
    """How many clients' tensor segments the daemon has mapped (from its memory map)."""
    maps = Path(f"/proc/{daemon.process.pid}/maps").read_text()
    return len({line.split()[4] for line in maps.splitlines() if "npu-manager-tensors" in line})


def wait_for(predicate: Callable[[], bool], timeout: float = WAIT_S, every: float = 0.05) -> None:
    """Wait for an event (`predicate` true, looked at `every` seconds); only a hung test
    outlasts the timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"the condition did not hold within {timeout} s"
        time.sleep(every)


def stopped(pid: int) -> bool:
    """True once process `pid` is stopped (its state in /proc is `T`): a SIGSTOP takes
    effect a moment after it is sent, and a test whose premise is a stopped process waits."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


class RawApp:
    """The test process as a client that also sends frames a real app never would."""

    def __init__(self, daemon: DaemonProcess, shared_bytes: int = 1 << 20) -> None:
        self.client = npu.DaemonClient(daemon.socket, uses_feature=True, shared_bytes=shared_bytes)
        self.manager = self.client.manager()

    def granted_model(
        self, model_file: Path | None = None, request_id: int = 1, *, model: bytes | None = None
    ) -> npu.LoadedModel:
        """A model loaded under a new granted request: a file by path, or bytes."""
        request = npu.ModelLoadRequest.Builder(request_id).set_size(0).build()
        lease = self.manager.reserve(request, timeout_s=WAIT_S)
        lease.__enter__()
        if model is not None:
            return lease.load_model(model=model)
        return lease.load_model(path=str(model_file))

    def infer(self, model: int, inputs: list[dict[str, Any]], out: tuple[int, int]) -> Any:
        segment = self.client._inference.segment()
        assert segment.size > 0
        tensors = [p.Tensor.model_validate(t) for t in inputs]
        return self.client.call(
            p.Infer, model=model, inputs=tensors, out=p.Span(offset=out[0], size=out[1])
        )

    def raw_infer(self, body: dict[str, Any]) -> Any:
        """An infer frame as given (it may be one pydantic would not build)."""
        seq = self.client.next_seq()
        frame = json.dumps({"op": "infer", "seq": seq, **body}).encode()
        with pytest.raises(npu.NpuManagerError) as caught:
            pending = self.client._pending
            from npumanager.daemon.client.wire import _Pending

            pending[seq] = waiting = _Pending()
            self.client._wire.sent_call(seq)  # the wire pairs the daemon's answer with it
            self.client._sock.sendall(struct.pack(">I", len(frame)) + frame)
            assert waiting.wait(WAIT_S)
            if waiting.error is not None:
                raise waiting.error
        return caught.value

    def close(self) -> None:
        self.client.close()


def in_front(daemon: DaemonProcess) -> None:
    """Say, as the platform would, which app is in the foreground and which is cached."""
    with npu.DaemonClient(daemon.socket) as admin:
        admin.set_uid_importance(FOREGROUND_UID, npu.IMPORTANCE_FOREGROUND)
        admin.set_uid_importance(BACKGROUND_UID, npu.IMPORTANCE_CACHED)


def apps_in_front(
    start: Callable[..., DaemonProcess], model_file: Path
) -> tuple[DaemonProcess, Child, Child]:
    """A daemon, its foreground app and its cached app (`in_front`), each with the model."""
    daemon = start()
    in_front(daemon)
    foreground = loaded_app(daemon, FOREGROUND_UID, model_file)
    background = loaded_app(daemon, BACKGROUND_UID, model_file)
    return daemon, foreground, background
