"""Inference lanes: `LoadedModel.run` on a socket and a daemon thread of the connection's own.

Apps are child processes with their own uids (tests/helpers/daemon_child.py); the test
process, as root, is also a raw client that opens a lane by hand and sends frames a real
app never would.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import npumanager as npu
from helpers.daemon_support import FOREGROUND_UID, WAIT_S, DaemonProcess
from npumanager.daemon.client import inference as remote_inference
from npumanager.daemon.client import lane as client_lane
from npumanager.daemon.server.lane import REFUSAL_PAUSE_S
from npumanager.daemon.wire import protocol as p
from npumanager.daemon.wire.lane import (
    MAX_LANE_FRAME_BYTES,
    Kind,
    Reply,
    Status,
    TensorRef,
    decode_reply,
    encode_request,
)
from npumanager.vendor_drivers.realexec.chain import chain_model

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="giving client processes their own uids needs root"
)

from helpers.real_daemon import (  # noqa: E402
    RawApp,
    apps_in_front,
    endless_model,
    in_process_digest,
    info,
    load_endless,
    running,
    segments_mapped,
    wait_for,
)


def counters(daemon: DaemonProcess) -> dict[str, int]:
    document = info(daemon)["daemon"]
    keys = (
        "inferences_on_lane",
        "inferences_inline",
        "inferences_to_workers",
        "lanes_opened",
        "lane_frames_repeated",
    )
    return {key: document[key] for key in keys}


def test_a_run_goes_over_the_lane_on_its_thread_or_the_workers_by_the_apps_band(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path
) -> None:
    daemon, foreground, background = apps_in_front(start_onnxruntime, model_file)
    before = counters(daemon)
    for _ in range(3):
        assert foreground.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
    after = counters(daemon)
    assert after["lanes_opened"] == before["lanes_opened"] + 1
    assert after["inferences_on_lane"] == before["inferences_on_lane"] + 3
    assert after["inferences_inline"] == before["inferences_inline"] + 3, "on the lane's thread"
    for _ in range(3):
        assert background.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
    cached = counters(daemon)
    assert cached["inferences_on_lane"] == after["inferences_on_lane"] + 3
    assert cached["inferences_to_workers"] == after["inferences_to_workers"] + 3, "workers"
    assert cached["inferences_inline"] == after["inferences_inline"]
    timed = foreground.ok("real_run", id=1, rows=4, value=0.5, run_timeout=WAIT_S)
    assert timed == in_process_digest(4, 0.5)
    assert counters(daemon)["inferences_on_lane"] == cached["inferences_on_lane"] + 1, "timed"


def test_a_run_past_its_timeout_is_cancelled_on_the_lane_and_the_lane_goes_on(
    start_onnxruntime: Callable[..., DaemonProcess], socket_dir: Path, model_file: Path
) -> None:
    events = socket_dir / "events.jsonl"
    sink = f"jsonl:path={events},debounce_duration_ms=10"
    daemon, foreground, _ = apps_in_front(lambda: start_onnxruntime("--sink", sink), model_file)
    endless = load_endless(foreground, socket_dir)  # only its cancel ends the run
    before = counters(daemon)
    timed_out = foreground.send("real_run", id=endless, rows=4, run_timeout=0.05)
    assert timed_out.get("error") == "TimeoutError", timed_out
    assert "cancelled" in timed_out["message"]
    after = counters(daemon)
    assert after["inferences_on_lane"] == before["inferences_on_lane"] + 1, "over the lane"
    assert after["lanes_opened"] == before["lanes_opened"] + 1

    def ended() -> list[dict[str, Any]]:
        lines = events.read_text().splitlines() if events.exists() else []
        return [
            e
            for e in map(json.loads, lines)
            if e.get("kind") == "ENDED" and e.get("uid") == FOREGROUND_UID
        ]

    wait_for(lambda: bool(ended()))
    assert [e["reason"] for e in ended()] == ["CANCELLED_USER"]
    assert running(daemon) == 0
    assert foreground.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
    assert counters(daemon)["inferences_on_lane"] == after["inferences_on_lane"] + 1
    assert counters(daemon)["lanes_opened"] == after["lanes_opened"], "the same lane"


def test_cancel_lane_says_whether_the_lane_was_running_and_needs_a_lane(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path
) -> None:
    daemon = start_onnxruntime()
    raw = RawApp(daemon)
    daemon.children.append(raw)  # type: ignore[attr-defined]
    with pytest.raises(npu.UnknownWorkError, match="this connection has no lane"):
        raw.client.call(p.CancelLane)
    RawLane(raw)
    assert raw.client.call(p.CancelLane) == {"cancelled": False}


class RawLane:
    """A lane the test process opened by hand on a raw client's connection."""

    def __init__(self, raw: RawApp) -> None:
        self.raw = raw
        self.segment = raw.client._inference.segment()
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        raw.client.call(p.OpenLane, fds=[theirs.fileno()])
        theirs.close()
        self.sock.settimeout(WAIT_S)

    def send(self, frame: bytes) -> Reply:
        self.sock.sendall(frame)
        return decode_reply(self.sock.recv(MAX_LANE_FRAME_BYTES))

    def infer(
        self, model: int, refs: list[TensorRef], out: tuple[int, int] = (1 << 19, 4096)
    ) -> Reply:
        return self.send(encode_request(Kind.INFER, model, 0, out, refs))


def x_ref(offset: int = 0, rows: int = 4, nbytes: int | None = None) -> TensorRef:
    return TensorRef("x", "float32", (rows, 256), offset, rows * 1024 if nbytes is None else nbytes)


@pytest.fixture
def raw_lane(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path
) -> tuple[DaemonProcess, RawApp, RawLane, npu.LoadedModel]:
    daemon = start_onnxruntime()
    raw = RawApp(daemon)
    model = raw.granted_model(model_file)
    lane = RawLane(raw)
    daemon.children.append(raw)  # type: ignore[attr-defined]
    return daemon, raw, lane, model


def infer_frame(*refs: TensorRef, out: tuple[int, int] = (8192, 4096)) -> Callable[[int], bytes]:
    return lambda model: encode_request(Kind.INFER, model, 0, out, list(refs))


@pytest.mark.parametrize(
    ("frame", "kind", "error"),
    [
        (lambda _: b"\x01\x00\x01", "IllegalArgumentError", "at least 28 bytes; this one is 3"),
        (lambda _: b"\x07" + bytes(27), "IllegalArgumentError", "kinds are 1 (infer) and 2"),
        (infer_frame(x_ref(offset=(1 << 20) - 64)), "IllegalArgumentError", "outside the shared"),
        (
            infer_frame(x_ref(nbytes=64)),
            "IllegalArgumentError",
            "says 64 bytes, but float32[4, 256]",
        ),
        (infer_frame(x_ref(rows=1 << 20)), "IllegalArgumentError", "outside the shared segment"),
        (infer_frame(x_ref(), out=((1 << 20) - 10, 4096)), "IllegalArgumentError", "output region"),
        (infer_frame(x_ref(), x_ref()), "IllegalArgumentError", "given twice"),
        (lambda _: infer_frame(x_ref())(999), "UnknownModelError", "model 999 is not loaded"),
        (
            lambda _: encode_request(Kind.FETCH, 0, 0, (8192, 4096)),
            "UnknownWorkError",
            "no outputs are held",
        ),
        (lambda _: bytes(MAX_LANE_FRAME_BYTES + 1), "IllegalArgumentError", "at most 65536 bytes"),
    ],
    ids=[
        "short",
        "kind",
        "offset",
        "lying-bytes",
        "lying-shape",
        "out-region",
        "twice",
        "model",
        "fetch",
        "too-long",
    ],
)
def test_lane_frames_malformed_out_of_bounds_or_lying_are_refused_and_the_lane_goes_on(
    raw_lane: tuple[DaemonProcess, RawApp, RawLane, npu.LoadedModel],
    frame: Callable[[int], bytes],
    kind: str,
    error: str,
) -> None:
    daemon, _, lane, model = raw_lane
    reply = lane.send(frame(model.handle))
    assert (reply.status, reply.kind) == (Status.REFUSED, kind), reply
    assert error in reply.message, reply.message
    np.frombuffer(lane.segment.memory, np.float32, 1024, 0)[:] = 0.5
    good = lane.infer(model.handle, [x_ref()])
    assert good.status == Status.COMPLETED, good
    [out] = good.outputs
    assert out.offset >= 1 << 19 and out.shape == (4, 256)
    expected = npu_in_process_run(np.full((4, 256), 0.5, np.float32))
    got = np.frombuffer(lane.segment.memory, np.float32, 1024, out.offset).reshape(4, 256)
    assert np.array_equal(got, expected)
    assert info(daemon)["devices"][0]["models_loaded"] == 1, "the connection is still served"


def test_open_lane_takes_one_seqpacket_socket_of_the_clients_own_uid_once(
    start_onnxruntime: Callable[..., DaemonProcess],
) -> None:
    daemon = start_onnxruntime()
    raw = RawApp(daemon)
    try:
        call = raw.client.call
        with pytest.raises(npu.IllegalArgumentError, match="needs a descriptor"):
            call(p.OpenLane)
        pipe_r, pipe_w = os.pipe()
        with pytest.raises(npu.IllegalArgumentError, match="needs a socket"):
            call(p.OpenLane, fds=[pipe_r])
        os.close(pipe_r)
        os.close(pipe_w)
        stream, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with pytest.raises(npu.IllegalArgumentError, match="AF_UNIX SOCK_SEQPACKET socket"):
            call(p.OpenLane, fds=[stream.fileno()])
        stream.close()
        other.close()
        foreign = foreign_lane_end(FOREGROUND_UID)
        with pytest.raises(npu.IllegalArgumentError, match="belongs to uid 20001"):
            call(p.OpenLane, fds=[foreign.fileno()])
        foreign.close()
        lane, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        call(p.OpenLane, fds=[theirs.fileno()])
        second, theirs_too = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with pytest.raises(npu.IllegalArgumentError, match="has a lane already"):
            call(p.OpenLane, fds=[theirs_too.fileno()])
        for sock in (lane, theirs, second, theirs_too):
            sock.close()
        assert counters(daemon)["lanes_opened"] == 1
    finally:
        raw.close()


FOREIGN = """
import array, socket, sys
parent = socket.socket(fileno=int(sys.argv[1]))
mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
fds = array.array("i", [theirs.fileno()]).tobytes()
parent.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
parent.recv(1)
"""


def foreign_lane_end(uid: int) -> socket.socket:
    """One end of a SOCK_SEQPACKET socketpair that a process of `uid` made."""
    here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            sys.executable,
            "-c",
            FOREIGN,
            str(there.fileno()),
        ],
        pass_fds=[there.fileno()],
    )
    there.close()
    _, fds, _, _ = socket.recv_fds(here, 1, 1)
    here.send(b"x")
    child.wait(WAIT_S)
    here.close()
    return socket.socket(fileno=fds[0])


def test_a_client_killed_during_a_run_on_its_lane_frees_everything_and_others_carry_on(
    start_onnxruntime: Callable[..., DaemonProcess], socket_dir: Path, model_file: Path
) -> None:
    daemon, victim, other = apps_in_front(start_onnxruntime, model_file)
    used_by_one = info(daemon)["devices"][0]["weight_memory_used_bytes"] // 2
    endless = load_endless(victim, socket_dir)  # its run goes on until something ends it
    threads = len(os.listdir(f"/proc/{daemon.process.pid}/task"))
    assert victim.process.stdin is not None
    victim.process.stdin.write(json.dumps({"op": "real_run", "id": endless, "rows": 4}) + "\n")
    victim.process.stdin.flush()
    wait_for(lambda: running(daemon) == 1)
    assert counters(daemon)["inferences_on_lane"] == 1, "it runs on the lane"
    victim.kill9()

    def freed() -> bool:
        device = info(daemon)["devices"][0]
        return (
            device["models_loaded"] == 1
            and device["weight_memory_used_bytes"] == used_by_one
            and device["running"] == 0
        )

    wait_for(freed)
    wait_for(lambda: segments_mapped(daemon) == 0)
    # The victim's lane thread ends, and so does the reader of its model host (counted
    # above), killed with it: at least one fewer than before, whether its lane was open
    # before the count or opened by this run; a leaked thread would keep the count up.
    wait_for(lambda: len(os.listdir(f"/proc/{daemon.process.pid}/task")) <= threads - 1)
    assert other.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)


def test_two_callers_at_once_a_taken_lane_or_a_connection_with_one_already_still_run(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path
) -> None:
    daemon = start_onnxruntime()
    raw = RawApp(daemon)
    x = np.full((4, 256), 0.25, np.float32)
    expected = npu_in_process_run(x)
    try:
        model = raw.granted_model(model_file)
        results: list[Any] = []

        def runs() -> None:
            results.extend(model.run({"x": x})[0] for _ in range(20))

        callers = [threading.Thread(target=runs) for _ in range(2)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(WAIT_S)
        assert len(results) == 40 and all(np.array_equal(r, expected) for r in results)
        lane = raw.client._inference.lane()  # taken here: a run meanwhile takes the connection
        assert lane is not None
        before = counters(daemon)["inferences_on_lane"]
        assert np.array_equal(model.run({"x": x})[0], expected)
        assert counters(daemon)["inferences_on_lane"] == before
        lane.give_back()
        assert np.array_equal(model.run({"x": x})[0], expected)
        assert counters(daemon)["inferences_on_lane"] == before + 1
    finally:
        raw.close()
    taken = RawApp(daemon)
    try:
        model = taken.granted_model(model_file)
        held = RawLane(taken)  # this connection has a lane: the client's own is refused
        before = counters(daemon)["inferences_on_lane"]
        assert np.array_equal(model.run({"x": x})[0], expected)
        assert counters(daemon)["inferences_on_lane"] == before
        del held
    finally:
        taken.close()


def npu_in_process_run(x: np.ndarray) -> np.ndarray:
    """The chain model's output for `x`, run in process."""
    service = npu.Service("onnxruntime")
    try:
        manager = service.manager(FOREGROUND_UID, uses_feature=True)
        request = npu.ModelLoadRequest.Builder(1).set_size(0).build()
        with manager.reserve(request, timeout_s=WAIT_S) as lease:
            output: np.ndarray = lease.load_model(model=chain_model()).run({"x": x})[0]
            return output
    finally:
        service.close()


def doubling_model() -> bytes:
    """`y = concat(x, x)` on `x: float32[rows, 256]`: twice the input's bytes out."""
    node = helper.make_node("Concat", ["x", "x"], ["y"], axis=0)
    graph = helper.make_graph(
        [node],
        "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["twice", 256])],
    )
    return onnx_bytes(graph)


def onnx_bytes(graph: Any) -> bytes:
    """A graph as the bytes of an opset-17 model."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data: bytes = model.SerializeToString()
    return data


def test_outputs_larger_than_the_room_given_are_fetched_and_the_room_learnt(
    start_onnxruntime: Callable[..., DaemonProcess],
) -> None:
    daemon = start_onnxruntime()
    raw = RawApp(daemon)
    try:
        model = raw.granted_model(model=doubling_model())
        x = np.arange(48 * 256, dtype=np.float32).reshape(48, 256)  # 48 KiB in, 96 KiB out
        for _ in range(2):
            [y] = model.run({"x": x})
            assert np.array_equal(y, np.concatenate([x, x]))
        assert counters(daemon)["inferences_on_lane"] == 2
        assert raw.client._inference._out_bytes[model.handle] >= 96 << 10
    finally:
        raw.close()


def test_a_scalar_goes_in_and_comes_out_a_scalar(
    start_onnxruntime: Callable[..., DaemonProcess],
) -> None:
    """0-d tensors keep their shape both ways (a C-contiguous copy must not make them 1-d)."""
    node = helper.make_node("Add", ["x", "x"], ["y"])
    graph = helper.make_graph(
        [node],
        "twice",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [])],
    )
    daemon = start_onnxruntime()
    raw = RawApp(daemon)
    try:
        model = raw.granted_model(model=onnx_bytes(graph))
        [y] = model.run({"x": np.int64(21)})
        assert y.shape == () and int(y) == 42
        [y] = model.run({"x": np.array(4, dtype=np.int64)}, timeout=WAIT_S)
        assert y.shape == () and int(y) == 8
    finally:
        raw.close()


def test_a_lane_closes_with_its_connection_even_while_the_client_keeps_its_end(
    raw_lane: tuple[DaemonProcess, RawApp, RawLane, npu.LoadedModel],
) -> None:
    daemon, raw, lane, model = raw_lane
    assert lane.infer(model.handle, [x_ref()]).status == Status.COMPLETED
    raw.client.close()  # the connection only: the test still holds its end of the lane
    assert lane.sock.recv(MAX_LANE_FRAME_BYTES) == b"", "the daemon shut the lane"
    wait_for(lambda: info(daemon)["devices"][0]["models_loaded"] == 0)


def summing_inputs_model(count: int, name_length: int) -> tuple[bytes, list[str]]:
    """`y = x0 + x1 + ...` over `count` float32[1] inputs with long names."""
    names = [f"{index:0{name_length}d}" for index in range(count)]
    graph = helper.make_graph(
        [helper.make_node("Sum", names, ["y"])],
        "many_inputs",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]) for name in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    return onnx_bytes(graph), names


def test_a_run_whose_frame_is_over_the_lanes_limit_takes_the_connection(
    start_onnxruntime: Callable[..., DaemonProcess],
) -> None:
    daemon = start_onnxruntime()
    raw = RawApp(daemon)
    try:
        data, names = summing_inputs_model(300, 250)  # about 80 KiB of tensor descriptions
        model = raw.granted_model(model=data)
        feeds = {name: np.array([1.0], np.float32) for name in names}
        assert model.run(feeds)[0].tolist() == [300.0]
        assert counters(daemon)["inferences_on_lane"] == 0
        small, few = summing_inputs_model(3, 4)
        three = raw.granted_model(model=small, request_id=2)
        assert three.run({n: np.array([2.0], np.float32) for n in few})[0].tolist() == [6.0]
        assert counters(daemon)["inferences_on_lane"] == 1
    finally:
        raw.close()


def test_a_flood_of_malformed_lane_frames_is_answered_ever_more_slowly(
    raw_lane: tuple[DaemonProcess, RawApp, RawLane, npu.LoadedModel],
) -> None:
    _, _, lane, model = raw_lane
    answered, ends = 0, time.monotonic() + 0.5
    while time.monotonic() < ends:
        assert lane.send(b"\x01").status == Status.REFUSED
        answered += 1
    # Slowness only lowers the count. The pauses double from 1 ms (1 + 2 + ... + 64 ms,
    # then 100 ms each): seven and four of them fit in half a second, with the first
    # answer and the last one, 13 at most; without them, thousands.
    assert REFUSAL_PAUSE_S == (0.001, 0.1)
    assert answered <= 13
    assert lane.infer(model.handle, [x_ref()]).status == Status.COMPLETED
    assert lane.send(b"\x01").status == Status.REFUSED, "answered again at once"


def row_sums_model() -> bytes:
    """`y = sum(x, axis=1)` on `x: float32[rows, 256]`: a small output for a large input."""
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        "row_sums",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows"])],
        [axes],
    )
    return onnx_bytes(graph)


def test_a_shared_array_is_read_in_place_and_its_room_comes_back_when_it_is_collected(
    start_onnxruntime: Callable[..., DaemonProcess],
) -> None:
    daemon = start_onnxruntime()
    raw = RawApp(daemon, shared_bytes=8 << 20)
    try:
        model = raw.granted_model(model=row_sums_model())
        segment = raw.client._inference.segment()
        x = raw.manager.shared_array((1024, 256))  # 1 MiB, float32 by default
        x[:] = 0.25
        assert segment.free_bytes == (8 << 20) - (1 << 20)
        [y] = model.run({"x": x})
        assert y.tolist() == [64.0] * 1024
        # No copy: the lane's own region is the output's room (64 KiB), not a second MiB.
        assert segment.free_bytes == (8 << 20) - (1 << 20) - (64 << 10)
        assert np.array_equal(model.run({"x": x[:4]})[0], y[:4]), "a slice of one, in place"
        with pytest.raises(npu.IllegalArgumentError, match="cannot cross the daemon"):
            raw.manager.shared_array(4, "complex64")
        del x
        gc.collect()
        assert segment.free_bytes == (8 << 20) - (64 << 10)
    finally:
        raw.close()


def test_the_shared_arrays_of_a_submitted_inference_are_kept_until_it_ends(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path
) -> None:
    daemon = start_onnxruntime("--driver-option", "channels=1")
    raw = RawApp(daemon)
    try:
        model = raw.granted_model(model_file)
        endless = raw.granted_model(model=endless_model(), request_id=2)
        busy = endless.submit({"x": np.zeros((4, 256), np.float32)})  # the one channel, for good
        wait_for(lambda: running(daemon) == 1)
        x = raw.manager.shared_array((4, 256))
        x[:] = 0.5
        future = model.submit({"x": x})  # queued behind it
        del x
        gc.collect()
        # Were its room given back now, this array would take it and change the inputs.
        other = raw.manager.shared_array((4, 256))
        other[:] = 9.0
        expected = npu_in_process_run(np.full((4, 256), 0.5, np.float32))
        assert not future.done(), "it waits for the channel"
        assert busy.cancel()
        assert np.array_equal(future.result(timeout=WAIT_S)[0], expected)
    finally:
        raw.close()


def test_a_run_on_the_lane_when_the_daemon_dies_raises_daemon_unavailable(
    start_onnxruntime: Callable[..., DaemonProcess],
) -> None:
    daemon = start_onnxruntime()
    raw = RawApp(daemon)
    try:
        model = raw.granted_model(model=endless_model())  # its run ends with the daemon only
        raised: list[BaseException] = []

        def long_run() -> None:
            try:
                model.run({"x": np.zeros((4, 256), np.float32)})
            except BaseException as exc:
                raised.append(exc)

        caller = threading.Thread(target=long_run)
        caller.start()
        wait_for(lambda: counters(daemon)["inferences_on_lane"] == 1)
        daemon.process.kill()
        daemon.process.wait(WAIT_S)
        caller.join(WAIT_S)
        assert not caller.is_alive(), "the caller waits for ever"
        assert [type(exc) for exc in raised] == [npu.DaemonUnavailableError]
        assert "closed the inference lane" in str(raised[0])
    finally:
        raw.close()


def test_runs_like_the_last_reuse_its_frames_yet_each_reads_its_own_inputs(
    start_onnxruntime: Callable[..., DaemonProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client makes and reads a lane frame once for runs like the last, and the daemon
    takes a frame byte for byte its last as that request again: every run still reads its
    own inputs and returns outputs of its own."""
    made: list[int] = []
    read: list[int] = []
    encode, decode = remote_inference.encode_request, client_lane.decode_reply
    monkeypatch.setattr(
        remote_inference, "encode_request", lambda *a, **k: made.append(1) or encode(*a, **k)
    )
    monkeypatch.setattr(client_lane, "decode_reply", lambda *a: read.append(1) or decode(*a))
    daemon = start_onnxruntime()
    raw = RawApp(daemon)
    try:
        model = raw.granted_model(model=doubling_model())
        kept = []
        for value in (0.5, 1.5, 0.5, -2.0):
            x = np.full((4, 256), value, dtype=np.float32)
            [y] = model.run({"x": x})
            assert np.array_equal(y, np.concatenate([x, x]))
            kept.append(y)
        assert (len(made), len(read)) == (1, 1), "one frame made and one reply read for four runs"
        assert counters(daemon)["lane_frames_repeated"] == 3
        assert [float(y[0, 0]) for y in kept] == [0.5, 1.5, 0.5, -2.0], "outputs are their own"
        shared = raw.manager.shared_array((4, 256))
        for value in (3.0, 4.0):
            shared[:] = value  # the same frame again: the array is read as it is now
            assert np.array_equal(model.run({"x": shared})[0], np.full((8, 256), value))
        assert counters(daemon)["lane_frames_repeated"] == 4
        x = np.arange(2 * 256, dtype=np.float32).reshape(2, 256)  # another shape: a new frame
        assert np.array_equal(model.run({"x": x})[0], np.concatenate([x, x]))
        assert len(made) == 3
        assert counters(daemon)["lane_frames_repeated"] == 4
    finally:
        raw.close()


def test_a_frame_sent_again_after_its_model_was_unloaded_is_refused(
    raw_lane: tuple[DaemonProcess, RawApp, RawLane, npu.LoadedModel],
) -> None:
    """A frame the lane took before is checked again for what may have changed: its model."""
    daemon, raw, lane, model = raw_lane
    frame = infer_frame(x_ref())(model.handle)
    assert lane.send(frame).status == Status.COMPLETED
    assert lane.send(frame).status == Status.COMPLETED
    assert counters(daemon)["lane_frames_repeated"] == 1
    raw.manager.listener.notify_model_unloaded(model.request)
    reply = lane.send(frame)
    assert (reply.status, reply.kind) == (Status.REFUSED, "UnknownModelError")


def test_a_cancel_that_arrives_before_the_lanes_inference_is_sent_again_until_it_lands() -> None:
    """`cancel_lane` can reach the daemon before the lane's thread has started the
    inference (it then cancels nothing): the client sends it again until one lands, and
    the reply that one brings ends the run."""
    from npumanager.daemon.wire.lane import Status, encode_reply

    mine, daemons = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    lane = client_lane.ClientLane(mine)
    tries: list[int] = []

    def on_late() -> bool:
        tries.append(1)
        if len(tries) < 3:
            return False  # nothing running yet in the daemon
        daemons.send(encode_reply(Status.CANCELLED, 9))
        return True

    done: list[Any] = []
    worker = threading.Thread(
        target=lambda: done.append(lane.exchange(b"frame", time.monotonic(), on_late))
    )
    worker.start()
    worker.join(WAIT_S)
    assert done and done[0].status == Status.CANCELLED and lane.late
    assert len(tries) == 3, "sent again until it landed"
    assert daemons.recv(100) == b"frame"
    mine.close()
    daemons.close()
