"""A hosted inference's own path: a runner socket per call, inputs by place in the
client's segment (sent to the host once, mapped there), and cancels that may overtake
their run on the way.

Real host processes where a uid is needed (root); the host's serving loop on a thread of
this process where the order of two messages must be forced.
"""

from __future__ import annotations

import mmap
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from helpers.daemon_support import FOREGROUND_UID, WAIT_S, DaemonProcess
from npumanager.daemon.host import messages
from npumanager.daemon.host.shared import locate, share

ort = pytest.importorskip("onnxruntime")

from helpers.real_daemon import (  # noqa: E402
    endless_model,
    in_process_digest,
    info,
    loaded_app,
    wait_for,
)
from npumanager.vendor_drivers.realexec.chain import chain_model  # noqa: E402
from npumanager.vendor_drivers.realexec.session import Call  # noqa: E402

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a host of another uid needs root")


def mapping(size: int, name: str = "npu-test-segment") -> tuple[mmap.mmap, int]:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return mmap.mmap(fd, size), fd


# Where an array lies -----------------------------------------------------------------------


def test_arrays_over_a_shared_mapping_are_found_with_their_offsets() -> None:
    memory, fd = mapping(1 << 16)
    try:
        found = share(memory, fd)
        a = np.frombuffer(memory, np.float32, 12, 64).reshape(3, 4)
        b = np.frombuffer(memory, np.int64, 2, 4096)
        assert locate([a, b]) == (found, [64, 4096])
        assert found.size == 1 << 16 and found.fd != fd
    finally:
        os.close(fd)


def test_an_array_elsewhere_or_strided_or_over_two_mappings_goes_by_copy() -> None:
    first, fd1 = mapping(4096)
    second, fd2 = mapping(4096)
    try:
        share(first, fd1)
        share(second, fd2)
        over_first = np.frombuffer(first, np.float32, 16).reshape(4, 4)
        over_second = np.frombuffer(second, np.float32, 16)
        assert locate([np.ones(4, np.float32)]) is None, "not over a mapping"
        assert locate([over_first[:, ::2]]) is None, "not contiguous"
        assert locate([over_first, over_second]) is None, "two mappings in one run"
        unshared, fd3 = mapping(4096)
        os.close(fd3)
        assert locate([np.frombuffer(unshared, np.uint8)]) is None, "a mapping never shared"
    finally:
        os.close(fd1)
        os.close(fd2)


def test_a_shared_mappings_descriptor_is_closed_when_the_mapping_goes() -> None:
    import gc

    memory, fd = mapping(4096)
    found = share(memory, fd)
    os.close(fd)
    assert os.fstat(found.fd).st_size == 4096
    del memory
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(found.fd)


# A real host ------------------------------------------------------------------------------


@pytest.fixture
def chain_session() -> Iterator[object]:
    from npumanager.daemon.host.client import HostSettings, ModelFile, ModelHost

    host = ModelHost(HostSettings("onnxruntime"), FOREGROUND_UID, FOREGROUND_UID)
    fd = os.memfd_create("chain")
    try:
        os.write(fd, chain_model())
        os.lseek(fd, 0, os.SEEK_SET)
        yield host.open(0, host.count(ModelFile(fd), {}), 1)
    finally:
        os.close(fd)
        host.kill()


def host_mappings(pid: int, name: str) -> int:
    return sum(name in line for line in Path(f"/proc/{pid}/maps").read_text().splitlines())


@needs_root
def test_inputs_in_a_shared_segment_reach_the_host_by_place_mapped_once(
    chain_session: object,
) -> None:
    from npumanager.daemon.host.client import HostedSession

    assert isinstance(chain_session, HostedSession)
    here = ort.InferenceSession(chain_model(), providers=["CPUExecutionProvider"])
    memory, fd = mapping(4 << 20, "npu-test-by-place")
    counts = chain_session.host.settings.counts
    try:
        share(memory, fd)
        for rows in (1, 4, 64, 2048):  # 2048 rows: 2 MiB, past what a message carries
            x = np.frombuffer(memory, np.float32, rows * 256, 4096).reshape(rows, 256)
            x[:] = np.random.default_rng(rows).random((rows, 256), np.float32)
            (got,) = chain_session.run({"x": x}, Call(False))
            (want,) = here.run(None, {"x": np.array(x)})
            np.testing.assert_allclose(got, want, rtol=1e-6)
        assert counts.in_place == 4 and counts.copied == 0
        pid = chain_session.host.pid
        assert host_mappings(pid, "memfd:npu-test-by-place") == 1, "mapped once, by one runner"
        (copied,) = chain_session.run({"x": np.ones((4, 256), np.float32)}, Call(False))
        assert counts.copied == 1 and copied.shape == (4, 256)
    finally:
        os.close(fd)


# Cancels that overtake their run ----------------------------------------------------------


@pytest.fixture
def host_on_a_thread() -> Iterator[tuple[socket.socket, object]]:
    """`Host.serve` on a thread of this process, the endless model open as model 1."""
    from npumanager.core.plugins.registry import load_plugins
    from npumanager.daemon.host.process import Host

    driver = load_plugins().driver("onnxruntime").factory(1, clock="real")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    host = Host(theirs, driver)
    server = threading.Thread(target=host.serve, daemon=True)
    server.start()
    fd = os.memfd_create("endless")
    os.write(fd, endless_model())
    messages.send(ours, {"op": "count", "id": 1, "sidecars": [], "counted": 1}, [fd])
    os.close(fd)
    assert "error" not in ask(ours)
    messages.send(ours, {"op": "open", "id": 2, "counted": 1, "model": 1, "device": 0, "band": 1})
    assert "error" not in ask(ours)
    yield ours, host
    ours.close()
    server.join(WAIT_S)


def ask(sock: socket.socket) -> dict[str, object]:
    sock.settimeout(WAIT_S)
    answer = messages.receive(sock)
    assert answer is not None
    return answer.header


def runner_of(control: socket.socket, index: int) -> socket.socket:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    asked = {"op": "runner", "runner": index, "background": False}
    messages.send(control, asked, [theirs.fileno()])
    theirs.close()
    return mine


def endless_run(runner: socket.socket, run_id: int) -> None:
    payload, refs = messages.pack_tensors([np.ones((1, 256), np.float32)]) or (b"", [])
    messages.send(runner, {"run": run_id, "model": 1, "names": ["x"], "inputs": refs}, (), payload)


def test_a_cancel_that_reaches_the_host_before_its_run_still_stops_it(
    host_on_a_thread: tuple[socket.socket, object],
) -> None:
    control, host = host_on_a_thread
    runner = runner_of(control, 1)
    messages.send(control, {"op": "cancel", "run": 7, "runner": 1})
    messages.send(control, {"op": "band", "id": 3, "model": 99, "band": 0, "bands": 3})
    assert "error" in ask(control)  # the host has read the cancel: it came first
    endless_run(runner, 7)
    assert ask(runner)["error"] == "ExecutionError", "the endless run was cancelled"
    assert host._early == {}  # type: ignore[attr-defined]


def test_a_cancel_after_its_run_ended_leaves_nothing_behind(
    host_on_a_thread: tuple[socket.socket, object],
) -> None:
    control, host = host_on_a_thread
    runner = runner_of(control, 1)
    endless_run(runner, 5)
    wait_for(lambda: (1, 5) in host._calls)  # type: ignore[attr-defined]
    messages.send(control, {"op": "cancel", "run": 5, "runner": 1})
    assert "error" in ask(runner)
    messages.send(control, {"op": "cancel", "run": 5, "runner": 1})  # once more, too late
    messages.send(control, {"op": "band", "id": 3, "model": 99, "band": 0, "bands": 3})
    ask(control)
    assert host._early == {} and host._calls == {}  # type: ignore[attr-defined]


def test_a_cancel_stops_only_its_runners_run_when_two_runners_use_the_same_run_id(
    host_on_a_thread: tuple[socket.socket, object],
) -> None:
    """Each lane counts its runs from 1 (its gate's seq), so two lanes of one host (two
    connections of one app) carry runs of the same id at once: a cancel names its runner."""
    control, host = host_on_a_thread
    first, second = runner_of(control, -1), runner_of(control, -2)
    endless_run(first, 7)
    endless_run(second, 7)
    calls = host._calls  # type: ignore[attr-defined]
    wait_for(lambda: len(calls) == 2)
    messages.send(control, {"op": "cancel", "run": 7, "runner": -1})
    assert ask(first)["error"] == "ExecutionError", "the first runner's run was cancelled"
    (left,) = calls.values()
    assert not left.cancelled, "the second runner's run of the same id runs on"
    messages.send(control, {"op": "cancel", "run": 7, "runner": -2})
    assert ask(second)["error"] == "ExecutionError"
    assert host._early == {} and calls == {}  # type: ignore[attr-defined]


# Through a daemon -------------------------------------------------------------------------


@needs_root
def test_a_daemons_hosted_runs_take_their_inputs_from_the_segment(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path
) -> None:
    daemon = start_onnxruntime()
    app = loaded_app(daemon, FOREGROUND_UID, model_file)
    assert app.ok("real_run", id=1, rows=4, value=0.5) == in_process_digest(4, 0.5)
    counters = info(daemon)["daemon"]
    assert counters["inferences_direct"] == 1, "run went to the host by the lane, read there"
    work = app.ok("real_submit", id=1, rows=4, value=0.5)  # the connection's own path
    assert app.ok("real_result", work_id=work) == in_process_digest(4, 0.5)
    hosts = info(daemon)["daemon"]["model_hosts"]
    assert hosts["runs_in_place"] >= 1 and hosts["runs_copied"] == 0, hosts


class DyingHost:
    """A model host (the `SessionHost` contract) whose sessions' runs fail as a runner
    does when its host has died under it."""

    why = "the model host was killed by SIGKILL (exit status -9)"

    def count(self, model: object, sidecars: object, allowed: int | None = None) -> object:
        return type("Counted", (), {"weight_bytes": 0})()

    def open(
        self,
        device: int,
        counted: object,
        band: int,
        threads: object = None,
        options: object = None,
    ) -> object:
        from npumanager.errors import ModelHostError
        from npumanager.vendor_drivers.realexec.session import InputSpec

        class Session:
            weight_bytes = 0
            inputs = (InputSpec("x", (1, 4), np.dtype(np.float32)),)
            target = "CPU"

            def run(self, feeds: object, call: Call) -> list[np.ndarray]:
                raise ModelHostError(DyingHost.why)

            def set_band(self, band: int, bands: int) -> None:
                pass

            def close(self) -> None:
                pass

        return Session()

    def discard(self, counted: object) -> None:
        pass


def test_a_run_whose_host_died_ends_cancelled_by_the_system_and_says_why() -> None:
    """The run ends CANCELLED_SYSTEM, as the unload of the dead host's models would end
    it, and its caller learns why rather than only that it was cancelled."""
    from npumanager.core.driver.events import EventKind
    from npumanager.core.driver.job import Job
    from npumanager.errors import ModelHostError
    from npumanager.schemas import EndReason
    from npumanager.vendor_drivers.onnxruntime.driver import OnnxRuntimeDriver
    from npumanager.vendor_drivers.realexec.session import InHost

    with OnnxRuntimeDriver() as driver:
        model = driver.load_model(0, model=InHost(DyingHost(), b"model"))  # type: ignore[arg-type]
        future = driver.submit_future(model, Job(uid=10), {"x": np.zeros((1, 4), np.float32)})
        with pytest.raises(ModelHostError, match="killed by SIGKILL"):
            future.result(WAIT_S)
        ends = [e.reason for e in driver.take_events() if e.kind == EventKind.ENDED]
        assert ends == [EndReason.CANCELLED_SYSTEM]
