"""Real inference through `npu-manager serve --driver onnxruntime`, across real processes.

Every app is a child process with its own uid (tests/helpers/daemon_child.py); models go
to the daemon as descriptors the app opened, tensors through the app's sealed memfd. The
test process, as root, is the management client that reads `info`, and a raw client for
the refusals a well-behaved app never provokes.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import npumanager as npu
from helpers.checkout_access import needs_checkout_other_uids_can_enter
from helpers.daemon_support import (
    BACKGROUND_UID,
    FOREGROUND_UID,
    SOCKET_GID,
    WAIT_S,
    Child,
    DaemonProcess,
)
from npumanager.daemon.client.shared_memory import sealed_memfd
from npumanager.daemon.wire import protocol as p

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="giving client processes their own uids needs root"
)

from helpers.real_daemon import (  # noqa: E402
    RawApp,
    app,
    apps_in_front,
    endless_model,
    granted,
    in_front,
    in_process_digest,
    info,
    load_endless,
    loaded_app,
    running,
    segments_mapped,
    wait_for,
)
from npumanager.vendor_drivers.realexec.chain import chain_inputs, chain_model  # noqa: E402

DAEMON_UID = 20060
"""The uid of a daemon that runs unprivileged (it cannot read the apps' private files)."""
SETPRIV = ("setpriv", "--clear-groups")
BIG_SIDE = 6144
"""The weight of a model that takes a second or more to open here (144 MiB)."""


@pytest.mark.parametrize("driver", ["onnxruntime", "openvino"])
def test_two_apps_run_real_models_through_one_daemon_with_in_process_outputs(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path, driver: str
) -> None:
    pytest.importorskip(driver)
    if driver == "openvino":  # openvino loads its model readers late, in the app's host
        needs_checkout_other_uids_can_enter(FOREGROUND_UID)
    daemon = start_onnxruntime("--driver", driver)
    foreground = loaded_app(daemon, FOREGROUND_UID, model_file)
    background = loaded_app(daemon, BACKGROUND_UID, model_file)
    background.ok("real_flood", id=1, rows=256)
    expected = in_process_digest(rows=8, value=0.25, driver=driver)
    for _ in range(5):
        assert foreground.ok("real_run", id=1, rows=8, value=0.25) == expected
    assert background.ok("real_run", id=1, rows=8, value=0.25) == expected
    devices = info(daemon)["devices"]
    weights = len(chain_model()) - 1000  # the weights are most of the file
    assert devices[0]["models_loaded"] == 2
    assert devices[0]["weight_memory_used_bytes"] >= 2 * weights


def test_a_model_only_the_app_can_read_is_loaded_through_its_descriptor(
    socket_dir: Path, model_file: Path
) -> None:
    private = socket_dir / "private"
    private.mkdir(mode=0o700)
    secret = private / "model.onnx"
    shutil.copy(model_file, secret)
    secret.chmod(0o600)
    os.chown(private, FOREGROUND_UID, FOREGROUND_UID)
    os.chown(secret, FOREGROUND_UID, FOREGROUND_UID)
    os.chown(socket_dir, DAEMON_UID, SOCKET_GID)
    probe = subprocess.run(
        [*SETPRIV, f"--reuid={DAEMON_UID}", f"--regid={SOCKET_GID}", "cat", str(secret)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode != 0 and "Permission denied" in probe.stderr  # the daemon's uid cannot
    daemon = DaemonProcess(
        socket_dir,
        "--socket-group",
        str(SOCKET_GID),
        "--driver",
        "onnxruntime",
        # In the daemon: this machine's Python lives where only root may read, so a daemon
        # of another uid could start no model host (test_model_hosts.py covers hosts).
        "--no-model-hosts",
        user=(DAEMON_UID, SOCKET_GID),
    )
    child = Child(daemon.socket, FOREGROUND_UID)
    try:
        granted(child)
        result = child.ok("real_load", id=1, path=str(secret))
        assert result["weight_bytes"] > 0
        assert child.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
    finally:
        child.close()
        assert daemon.stop() == 0, daemon.log()
    assert "Traceback" not in daemon.log()


def test_a_killed_app_frees_its_models_and_memory_and_its_running_work_ends(
    start_onnxruntime: Callable[..., DaemonProcess], socket_dir: Path, model_file: Path
) -> None:
    events = socket_dir / "events.jsonl"
    daemon = start_onnxruntime("--sink", f"jsonl:path={events},debounce_duration_ms=10")
    foreground = loaded_app(daemon, FOREGROUND_UID, model_file)
    background = loaded_app(daemon, BACKGROUND_UID, model_file)
    used_by_one = info(daemon)["devices"][0]["weight_memory_used_bytes"] // 2
    endless = load_endless(background, socket_dir)  # its second model
    work_id = background.ok("real_submit", id=endless, rows=4)
    wait_for(lambda: running(daemon) == 1)  # and it runs until something ends it
    assert segments_mapped(daemon) == 1  # the background's (the foreground ran nothing yet)
    background.kill9()

    def freed() -> bool:
        document = info(daemon)
        device = document["devices"][0]
        return (
            device["models_loaded"] == 1
            and device["weight_memory_used_bytes"] == used_by_one
            and device["running"] == 0
            and [c["uid"] for c in document["clients"] if c["uid"]] == [FOREGROUND_UID]
        )

    wait_for(freed)
    wait_for(lambda: segments_mapped(daemon) == 0)  # its segment is unmapped

    def ended() -> list[dict[str, Any]]:
        if not events.exists():
            return []
        lines = [json.loads(line) for line in events.read_text().splitlines() if line]
        return [
            e
            for e in lines
            if e.get("kind") == "ENDED"
            and e.get("uid") == BACKGROUND_UID
            and e.get("id") == work_id
        ]

    wait_for(lambda: bool(ended()))
    assert ended()[0]["reason"] == "CANCELLED_SYSTEM"
    assert foreground.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)


def test_cancel_timeout_and_errors_cross_the_wire_with_their_class(
    start_onnxruntime: Callable[..., DaemonProcess], socket_dir: Path, model_file: Path
) -> None:
    daemon = start_onnxruntime()
    child = loaded_app(daemon, FOREGROUND_UID, model_file)
    endless = load_endless(child, socket_dir)  # only a cancel ends its inferences
    timed_out = child.send("real_run", id=endless, rows=4, run_timeout=0.05)
    assert timed_out.get("error") == "TimeoutError", timed_out
    work_id = child.ok("real_submit", id=endless, rows=4)
    wait_for(lambda: running(daemon) == 1)
    assert child.ok("real_cancel", work_id=work_id) == {"cancel": True, "cancelled": True}
    assert child.ok("real_result", work_id=work_id) == {"raised": "CancelledError"}
    wrong = child.send("real_run", id=1, rows=4, width=100)
    assert wrong["error"] == "IllegalArgumentError" and "x: float32[?, 256]" in wrong["message"]
    wait_for(lambda: running(daemon) == 0)
    assert child.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)


@pytest.mark.parametrize("ack", [True, False], ids=["work id known", "work id not yet known"])
def test_a_cancel_that_took_effect_answers_true_whichever_frame_comes_first(
    start_onnxruntime: Callable[..., DaemonProcess],
    monkeypatch: pytest.MonkeyPatch,
    ack: bool,
) -> None:
    """`RemoteWork.cancel()` answers True, and the future is cancelled, as soon as the daemon
    has cancelled the work, even when the frame saying the work ended is read after the
    cancel's reply (here it is held until the cancel has answered)."""
    daemon = start_onnxruntime()
    raw = RawApp(daemon)
    try:
        endless = raw.granted_model(model=endless_model())  # only a cancel ends its work
        client, inference = raw.client, raw.client._inference
        segment = inference.segment()
        free = segment.free_bytes
        cancelling, replied, answered = threading.Event(), threading.Event(), threading.Event()
        seqs: list[int] = []
        held: list[p.WorkEnded] = []
        handle = client._handle

        def end_read_after_the_cancel_answered(message: Any) -> None:
            if isinstance(message, p.WorkEnded) and message.call_seq in seqs:
                if not replied.is_set():
                    held.append(message)  # the daemon sent it first: read it after the reply
                    return
                answered.wait(WAIT_S)
            handle(message)
            if isinstance(message, p.Reply | p.Error) and cancelling.is_set():
                replied.set()
                if held:
                    answered.wait(WAIT_S)
                    handle(held.pop())

        monkeypatch.setattr(client, "_handle", end_read_after_the_cancel_answered)
        x = {"x": np.zeros((4, 256), np.float32)}
        work = inference.submit(endless, x, 0, None, None, None, ack=ack)
        seqs.append(work.call_seq)
        wait_for(lambda: running(daemon) == 1)
        cancelling.set()
        said, cancelled = work.cancel(), work.cancelled()
        answered.set()
        assert said and cancelled
        with pytest.raises(CancelledError):
            work.result(timeout=WAIT_S)
        assert replied.is_set()
        assert work.cancel() and work.cancelled(), "it stays cancelled"
        wait_for(lambda: segment.free_bytes == free)  # its region comes back with its end
        model = raw.granted_model(model=chain_model(), request_id=2)
        finished = model.submit(chain_inputs(2))
        finished.result(timeout=WAIT_S)
        assert not finished.cancel() and not finished.cancelled(), "it had ended"
    finally:
        raw.close()


def x_tensor(offset: int = 0, rows: int = 4, nbytes: int | None = None) -> dict[str, Any]:
    return {
        "name": "x",
        "dtype": "float32",
        "shape": [rows, 256],
        "offset": offset,
        "nbytes": rows * 256 * 4 if nbytes is None else nbytes,
    }


@pytest.mark.parametrize(
    ("inputs", "out", "error"),
    [
        ([x_tensor(offset=(1 << 20) - 64)], (0, 4096), "outside the shared segment"),
        ([x_tensor(nbytes=64)], (0, 4096), "says 64 bytes, but float32[4, 256] holds 4096"),
        ([x_tensor(rows=1 << 20)], (0, 4096), "outside the shared segment"),
        ([x_tensor(offset=2)], (0, 4096), "not a multiple of its item size 4"),
        ([x_tensor()], ((1 << 20) - 10, 4096), "the output region"),
        ([x_tensor(), x_tensor()], (0, 4096), "given twice"),
        ([{**x_tensor(), "name": "y"}], (0, 4096), "inputs must be exactly {x: float32[?, 256]}"),
    ],
    ids=["offset", "lying-bytes", "lying-shape", "misaligned", "out-region", "twice", "name"],
)
def test_tensor_frames_out_of_bounds_or_lying_are_refused_and_the_connection_stays(
    start_onnxruntime: Callable[..., DaemonProcess],
    model_file: Path,
    inputs: list[dict[str, Any]],
    out: tuple[int, int],
    error: str,
) -> None:
    daemon = start_onnxruntime()
    raw = RawApp(daemon)
    try:
        model = raw.granted_model(model_file)
        with pytest.raises(npu.IllegalArgumentError, match=re.escape(error)):
            raw.infer(model.handle, inputs, out)
        x = np.full((4, 256), 0.5, dtype=np.float32)
        (y,) = model.run({"x": x})
        assert y.shape == (4, 256)
    finally:
        raw.close()


def test_malformed_tensor_frames_get_an_error_reply(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path
) -> None:
    daemon = start_onnxruntime()
    raw = RawApp(daemon)
    try:
        model = raw.granted_model(model_file)
        raw.client._inference.segment()
        for tensor in ({**x_tensor(), "dtype": "complex64"}, {**x_tensor(), "offset": -4}):
            body = {"model": model.handle, "inputs": [tensor], "out": {"offset": 0, "size": 64}}
            error = raw.raw_infer(body)
            assert isinstance(error, npu.IllegalArgumentError), error
            assert "invalid frame: infer.inputs.0" in str(error)
        (y,) = model.run({"x": np.zeros((2, 256), dtype=np.float32)})
        assert y.shape == (2, 256)
    finally:
        raw.close()


def send_with_descriptor(
    client: npu.DaemonClient, kind: type[p.Call], fd: int, **fields: Any
) -> Any:
    return client.call(kind, fds=[fd], **fields)


def test_segments_and_descriptors_that_are_not_what_they_claim_are_refused(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path, socket_dir: Path
) -> None:
    daemon = start_onnxruntime("--max-shared-mib", "4", "--driver-option", "capacity_bytes=1048576")
    raw = RawApp(daemon, shared_bytes=8 << 20)
    try:
        with pytest.raises(npu.CapacityError, match=r"1\.\.4194304 bytes"):
            raw.client._inference.segment()
        unsealed = os.memfd_create("unsealed")
        os.ftruncate(unsealed, 4096)
        with pytest.raises(npu.IllegalArgumentError, match="sealed against shrinking"):
            send_with_descriptor(raw.client, p.Attach, unsealed, size=4096)
        os.close(unsealed)
        with (
            open(model_file, "rb") as plain,
            pytest.raises(npu.IllegalArgumentError, match="must be a memfd sealed"),
        ):
            send_with_descriptor(
                raw.client, p.Attach, plain.fileno(), size=model_file.stat().st_size
            )
        with pytest.raises(npu.IllegalArgumentError, match="needs a descriptor"):
            raw.client.call(p.Attach, size=4096)
        request = npu.ModelLoadRequest.Builder(1).set_size(0).build()
        lease = raw.manager.reserve(request, timeout_s=WAIT_S)
        lease.__enter__()
        with (
            open("/etc/passwd", "rb") as text,
            pytest.raises(npu.IllegalArgumentError, match="not an ONNX model"),
        ):
            send_with_descriptor(
                raw.client, p.LoadRealModel, text.fileno(), request_id=1, descriptor=True
            )
        with pytest.raises(npu.CapacityError, match="do not fit on device 0"):
            lease.load_model(path=str(model_file))
        device = info(daemon)["devices"][0]
        assert device["models_loaded"] == 0 and device["weight_memory_used_bytes"] == 0
        pipe_r, pipe_w = os.pipe()
        with pytest.raises(npu.IllegalArgumentError, match="not a regular file"):
            send_with_descriptor(raw.client, p.LoadRealModel, pipe_r, request_id=1, descriptor=True)
        os.close(pipe_r)
        os.close(pipe_w)
        fine = sealed_memfd("fine", size=4096)
        send_with_descriptor(raw.client, p.Attach, fine, size=4096)
        os.close(fine)
        assert info(daemon)["clients"][0]["shared_bytes"] == 4096
    finally:
        raw.close()


def test_descriptors_sent_ahead_past_the_limit_close_only_that_connection(
    start_onnxruntime: Callable[..., DaemonProcess],
) -> None:
    daemon = start_onnxruntime()
    before = daemon.open_descriptors()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(daemon.socket))
    hello = p.encode(p.Hello(version=p.PROTOCOL_VERSION))
    sock.sendall(hello)
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(3)]
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
    for _ in range(2):
        sock.sendmsg([b"\0"], rights)
    sock.settimeout(WAIT_S)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    assert b"descriptors were sent ahead" in received
    sock.close()
    for fd in fds:
        os.close(fd)
    wait_for(lambda: daemon.open_descriptors() <= before)
    assert info(daemon)["daemon"]["protocol_errors"] >= 1


def test_a_client_of_the_old_protocol_gets_a_clear_error(
    start_onnxruntime: Callable[..., DaemonProcess],
) -> None:
    daemon = start_onnxruntime()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(daemon.socket))
    sock.sendall(p.encode(p.Hello(version=1)))
    sock.settimeout(WAIT_S)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    sock.close()
    (body,) = list(p.FrameReader().feed(received))
    error = p.parse_daemon(body)
    assert isinstance(error, p.Error)
    assert (
        f"protocol version 1 is not supported; this daemon speaks version {p.PROTOCOL_VERSION}"
        in (error.message)
    )


ROOT = Path(__file__).resolve().parents[1]


def guide_block(heading: str) -> str:
    """The first python block of the app developers' guide after `heading`."""
    text = (ROOT / "docs" / "guides" / "apps.md").read_text()
    section = text[text.index(heading) :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```", start)]


@pytest.fixture
def model_onnx(model_file: Path) -> Path:
    shutil.copy(model_file, model_file.with_name("model.onnx"))
    return model_file


def test_the_app_guides_daemon_inference_example_runs_against_a_real_daemon(
    start_onnxruntime: Callable[..., DaemonProcess], model_onnx: Path
) -> None:
    daemon = start_onnxruntime()
    code = guide_block("## Real inference through the daemon")
    code += "\nassert y.shape == z.shape == (8, 256) and (y == z).all()\n"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=model_onnx.parent,  # its model.onnx
        env={**os.environ, "NPUMANAGER_SOCKET": str(daemon.socket)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_two_process_example_prints_every_figure() -> None:
    needs_checkout_other_uids_can_enter(FOREGROUND_UID)  # its apps drop to their uids
    example = ROOT / "examples" / "two_processes" / "run.py"
    # The background app's work at the normal OS priority: under SCHED_IDLE, beside busy
    # programs, one of its runs can wait a minute for a core (what is checked is the figures).
    normal = "--serve-arg=--driver-option=background_idle=false"
    done = subprocess.run(
        [sys.executable, str(example), "--seconds", "0.5", "--rounds", "2", "--json", normal],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["separate_uids"] is True
    assert figures["rounds"] == 2 and len(figures["managed_over_solo_p99_by_round"]) == 2
    for run in ("solo", "managed", "direct"):
        assert 0 < figures[f"fg_{run}_p50_ms"] <= figures[f"fg_{run}_p99_ms"]
        assert figures[f"fg_{run}_frames"] >= 2 * 25, "two runs' frames (30 a run), pooled"
    assert figures["bg_managed_per_s"] > 0 and figures["bg_direct_per_s"] > 0
    assert "bg_solo_per_s" not in figures
    refused = subprocess.run(
        [sys.executable, str(example), "--rounds", "0"], check=False, capture_output=True, text=True
    )
    assert refused.returncode == 2 and "--rounds at least 1" in refused.stderr


def test_inferences_in_flight_past_the_limit_are_refused_and_others_carry_on(
    start_onnxruntime: Callable[..., DaemonProcess], socket_dir: Path, model_file: Path
) -> None:
    daemon, other, flood = apps_in_front(
        lambda: start_onnxruntime("--max-inferences-per-connection", "2"), model_file
    )
    endless = load_endless(flood, socket_dir)  # in flight until cancelled, however long that is
    first = flood.ok("real_submit", id=endless, rows=4)
    second = flood.ok("real_submit", id=endless, rows=4)
    wait_for(lambda: running(daemon) == 1)  # the first runs, the second waits its turn
    third = flood.send("real_submit", id=1, rows=4)
    assert third.get("error") == "QuotaExceededError", third
    assert "--max-inferences-per-connection" in third["message"]
    # The foreground app's run takes the channel kept free of background work.
    assert other.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
    assert "sha256" in submitted(other, rows=4), "the limit is the connection's"
    for work_id in (first, second):
        assert flood.ok("real_cancel", work_id=work_id) == {"cancel": True, "cancelled": True}
        assert flood.ok("real_result", work_id=work_id) == {"raised": "CancelledError"}
    assert "sha256" in submitted(flood, rows=4)  # room again once they ended


def big_model(path: Path, side: int = BIG_SIDE) -> None:
    """One MatMul with a `side` x `side` float32 weight: a model that opens slowly."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((side, side), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", side])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    path.chmod(0o644)


def test_a_slow_model_load_does_not_hold_up_the_other_clients(
    start_onnxruntime: Callable[..., DaemonProcess], socket_dir: Path, model_file: Path
) -> None:
    big = socket_dir / "big.onnx"
    big_model(big)
    daemon = start_onnxruntime()
    in_front(daemon)  # the other app's runs are the foreground's: none waits for a worker
    loader = app(daemon, BACKGROUND_UID)
    other = loaded_app(daemon, FOREGROUND_UID, model_file)
    granted(loader)
    expected = in_process_digest(4, 0.5)
    assert loader.process.stdin is not None
    loader.process.stdin.write(json.dumps({"op": "real_load", "id": 1, "path": str(big)}) + "\n")
    loader.process.stdin.flush()
    wait_for(lambda: info(daemon)["daemon"]["model_loads"]["running"] == 1)  # it opens it now
    # Three runs of a few rows are answered while the daemon opens 144 MiB of weights.
    answered = [other.ok("real_run", id=1, rows=4, value=0.5) for _ in range(3)]
    assert answered == [expected] * 3
    assert loader._messages.empty(), "the load was answered before the other client's runs"
    reply = loader.expect(lambda m: m.get("reply") == "real_load")
    assert reply["result"]["weight_bytes"] == BIG_SIDE * BIG_SIDE * 4


def submitted(child: Child, **fields: Any) -> Any:
    """An inference through the connection (`submit`, not the lane) and its digest."""
    work_id = child.ok("real_submit", id=1, **fields)
    return child.ok("real_result", work_id=work_id)


def test_foreground_inferences_run_on_the_loops_thread_and_background_ones_on_workers(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path
) -> None:
    daemon, foreground, background = apps_in_front(start_onnxruntime, model_file)
    for _ in range(3):
        assert submitted(foreground, rows=4, value=0.5) == in_process_digest(4, 0.5)
    counted = info(daemon)["daemon"]
    assert counted["inferences_inline"] >= 1, counted
    for _ in range(3):
        assert "sha256" in submitted(background, rows=4)
    after = info(daemon)["daemon"]
    assert after["inferences_inline"] == counted["inferences_inline"], "background stays off it"
    assert after["inferences_to_workers"] == counted["inferences_to_workers"] + 3


def test_while_the_loops_thread_runs_a_long_inference_the_standby_serves_the_others(
    start_onnxruntime: Callable[..., DaemonProcess], socket_dir: Path, model_file: Path
) -> None:
    daemon, foreground, other = apps_in_front(start_onnxruntime, model_file)
    endless = load_endless(foreground, socket_dir)  # it runs until cancelled
    work_id = foreground.ok("real_submit", id=endless, rows=4)
    wait_for(lambda: running(daemon) == 1)
    assert info(daemon)["daemon"]["inferences_inline"] == 1, "the endless one runs on it"
    assert "sha256" in other.ok("real_run", id=1, rows=4, run_timeout=WAIT_S)
    assert "sha256" in submitted(other, rows=4), "the connection's own path is served too"
    assert running(daemon) == 1, "served while it still ran"
    assert foreground.ok("real_cancel", work_id=work_id) == {"cancel": True, "cancelled": True}
    assert foreground.ok("real_result", work_id=work_id) == {"raised": "CancelledError"}
    assert submitted(foreground, rows=4, value=0.5) == in_process_digest(4, 0.5)


def test_a_model_with_external_data_loads_by_path_with_its_weights_file_sent_along(
    start_onnxruntime: Callable[..., DaemonProcess], socket_dir: Path
) -> None:
    from helpers.onnx_builders import WIDTH, save_external, values

    weights = values(start=11)
    folder = socket_dir / "model"
    folder.mkdir(mode=0o755)
    path = save_external(folder, weights)
    for file in folder.iterdir():
        file.chmod(0o644)
    daemon = start_onnxruntime()
    child = app(daemon, FOREGROUND_UID)
    granted(child)
    assert child.ok("real_load", id=1, path=str(path))["weight_bytes"] == weights.nbytes
    result = child.ok("real_run", id=1, rows=1, width=WIDTH, value=0.0)
    assert result["sha256"] == hashlib.sha256(weights.tobytes()).hexdigest()
