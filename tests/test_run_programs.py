"""Unmodified programs under `npu-manager run` against a real `serve --driver onnxruntime`:
onnxruntime's and OpenVINO's public API, many sessions, fork, threads, a refused model, an
unload request in the middle, Ctrl-C, and the daemon's view of the app while it runs."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.console import npu
from helpers.daemon_support import FOREGROUND_UID, DaemonProcess
from helpers.real_daemon import CAN_LOAD_NOW, app, endless_model, info, running, wait_for
from helpers.run_support import (
    ORT_APP,
    OV_APP,
    Program,
    all_lines,
    managed_command,
    python,
    without_hook,
)

pytest.importorskip("onnxruntime")
Start = Callable[..., DaemonProcess]


def managed(daemon: DaemonProcess, *args: str, **kwargs: object) -> Program:
    return Program(managed_command(daemon.socket, *python(*args)), **kwargs)  # type: ignore[arg-type]


def direct_lines(*args: str) -> list[str]:
    return all_lines(python(*args), env=without_hook())


def loaded_requests(daemon: DaemonProcess, pid: int) -> list[dict[str, object]]:
    """The daemon's loaded requests of the client whose process is `pid`."""
    document = info(daemon)
    clients = {c["client"] for c in document["clients"] if c["pid"] == pid}
    return [r for r in document["requests"]["loaded"] if r["client"] in clients]


def test_onnxruntime_public_api_runs_through_the_daemon(
    start_onnxruntime: Start, model_file: Path
) -> None:
    daemon = start_onnxruntime()
    program = managed(daemon, ORT_APP, "api", model_file)
    try:
        pid = int(program.line("loaded").split()[1])
        assert loaded_requests(daemon, pid), "the program's model is loaded through the daemon"
        listed = npu("apps", "--socket", str(daemon.socket), "--json")
        assert listed.returncode == 0, listed.stderr
        assert any(pid in a["pids"] for a in json.loads(listed.stdout)["apps"]), listed.stdout
        shown = npu("info", "--socket", str(daemon.socket), "--json")
        assert shown.returncode == 0, shown.stderr
        clients = json.loads(shown.stdout)["clients"]
        assert [c["models"] for c in clients if c["pid"] == pid] == [3], clients  # three sessions
        program.send()
        program.line("run_again")
        assert program.finish() == 0, program.stderr
    finally:
        program.kill()
    managed_lines = [line for line in program.seen if not line.startswith("loaded")]
    expected = [
        line for line in direct_lines(ORT_APP, "api", model_file) if not line.startswith("loaded")
    ]
    assert managed_lines[0] == "managed True"
    assert expected[0] == "managed False"
    assert managed_lines[1:] == expected[1:]
    assert "warning" not in program.stderr, program.stderr


def test_openvino_public_api_runs_through_the_daemon(
    start_onnxruntime: Start, model_file: Path
) -> None:
    pytest.importorskip("openvino")
    daemon = start_onnxruntime()
    program = managed(daemon, OV_APP, model_file)
    assert program.finish() == 0, program.stderr
    lines = list(iter(program.lines.get, None))
    assert lines[0] == "managed True"
    direct = direct_lines(OV_APP, model_file)
    assert direct[0] == "managed False"
    # the daemon runs the model with ONNX Runtime: its outputs are ONNX Runtime's, bit for bit
    (expected,) = [x for x in direct_lines(ORT_APP, "api", model_file) if x.startswith("run_none")]
    digest = expected.split()[1]
    assert lines[1:5] == [f"{step} {digest}" for step in ("call", "by_port", "request", "async")]
    # a run's results are OpenVINO's own OVDict, and answer every lookup as a direct run's do
    assert lines[5] == direct[5]
    assert lines[5].startswith("results True 1 True True"), lines[5]


def test_a_hundred_sessions_load_and_give_back(start_onnxruntime: Start, model_file: Path) -> None:
    daemon = start_onnxruntime()
    program = managed(daemon, ORT_APP, "hundred", model_file)
    try:
        line = program.line("sessions")
        pid = int(program.line("loaded").split()[1])
        assert loaded_requests(daemon, pid) == [], "every dropped session gave its model back"
        program.send()
        assert program.finish() == 0, program.stderr
    finally:
        program.kill()
    (expected,) = [
        x for x in direct_lines(ORT_APP, "hundred", model_file) if x.startswith("sessions")
    ]
    assert line == expected
    assert "distinct_outputs 1 " in line


def test_a_forked_child_connects_on_its_own(start_onnxruntime: Start, model_file: Path) -> None:
    daemon = start_onnxruntime()
    program = managed(daemon, ORT_APP, "fork", model_file)
    assert program.finish() == 0, program.stderr
    lines = list(iter(program.lines.get, None))
    parent = lines[0].split()[1]
    assert lines[1] == f"child {parent} True", lines
    assert lines[2] == f"child_new {parent}", lines
    assert lines[3] == f"parent_after {parent}", lines


def test_threads_share_a_session(start_onnxruntime: Start, model_file: Path) -> None:
    daemon = start_onnxruntime()
    program = managed(daemon, ORT_APP, "threads", model_file)
    assert program.line("threads") == "threads 4 runs 100 wrong 0"
    assert program.finish() == 0, program.stderr


def test_a_refused_model_raises_the_runtimes_error_with_the_managers_reason(
    start_onnxruntime: Start, socket_dir: Path
) -> None:
    from helpers.onnx_builders import constant_model

    big = socket_dir / "big.onnx"
    big.write_bytes(constant_model(2 << 20).SerializeToString())
    big.chmod(0o644)
    daemon = start_onnxruntime("--max-model-mib", "1")
    program = managed(daemon, ORT_APP, "refused", big)
    assert program.line("refused") == ("refused onnxruntime.capi.onnxruntime_pybind11_state Fail")
    message = program.line("message")
    assert "npu-manager refused the model" in message
    assert "1 MiB" in message or "max-model-mib" in message, message
    assert program.finish() == 0, program.stderr


def test_ctrl_c_ends_the_program_as_without_the_manager(
    start_onnxruntime: Start, model_file: Path
) -> None:
    daemon = start_onnxruntime()
    ends = []
    for command in (
        managed_command(daemon.socket, *python(ORT_APP, "interrupt", model_file)),
        python(ORT_APP, "interrupt", model_file),
    ):
        program = Program(command, env=without_hook())
        try:
            pid = int(program.line("ready").split()[1])
            assert pid == program.process.pid, "exec: the program is the process started"
            program.interrupt()
            code = program.finish()
        finally:
            program.kill()
        ends.append((code, program.stderr.rstrip().splitlines()[-1]))
    assert ends[0] == ends[1], ends
    assert ends[0] == (-signal.SIGINT, "KeyboardInterrupt"), ends


def test_an_unload_request_mid_program_then_the_next_run_loads_again(
    start_onnxruntime: Start, model_file: Path
) -> None:
    import npumanager as npu_api

    daemon = start_onnxruntime("--policy", "turn_taking", "--unload-grace-ms", "600000")
    with npu_api.DaemonClient(daemon.socket) as admin:
        admin.set_uid_importance(FOREGROUND_UID, npu_api.IMPORTANCE_FOREGROUND)
    program = managed(daemon, ORT_APP, "unload", model_file)
    try:
        first = program.line("first").split()[1]
        foreground = app(daemon, FOREGROUND_UID)
        foreground.ok("request", id=1, size=0)
        # granted only once the program gave its model back: the grace period is ten minutes
        foreground.expect(
            lambda m: m.get("event") == "decision" and m.get("status") == CAN_LOAD_NOW
        )
        assert loaded_requests(daemon, program.process.pid) == [], "the program gave it back"
        foreground.ok("cancel", id=1)
        program.send()
        assert program.line("second") == f"second {first}"
        assert program.finish() == 0, program.stderr
    finally:
        program.kill()
    wait_for(lambda: not info(daemon)["requests"]["loaded"])


def test_a_host_crash_under_a_run_is_the_runtimes_error_with_the_reason(
    start_onnxruntime: Start, model_file: Path, socket_dir: Path
) -> None:
    endless = socket_dir / "endless.onnx"
    endless.write_bytes(endless_model())
    endless.chmod(0o644)
    daemon = start_onnxruntime()
    program = managed(daemon, ORT_APP, "crash", model_file, endless)
    try:
        pid = int(program.line("running").split()[1])
        wait_for(lambda: running(daemon) == 1)
        (host,) = {c["host_pid"] for c in info(daemon)["clients"] if c["pid"] == pid}
        os.kill(host, signal.SIGKILL)
        crashed = program.line("crashed")
        message = program.line("message")
        assert program.line("after") == "after True", "the next run loaded the model again"
        assert program.finish() == 0, program.stderr
    finally:
        program.kill()
    module = "onnxruntime.capi.onnxruntime_pybind11_state"
    assert crashed in (f"crashed {module} EngineError", f"crashed {module} Fail"), crashed
    assert "npu-manager" in message and "host" in message, message
    lost = [line for line in program.seen if line.startswith("lost")]
    assert all(line.startswith("lost EngineError") and "SIGKILL" in line for line in lost), lost
