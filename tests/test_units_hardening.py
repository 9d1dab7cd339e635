"""The service unit's sandbox: `systemd-analyze security` rates it OK, the daemon still
serves under its kernel-side part, and `npu-manager units` refuses what would not run in it.

The ratings come from the real `systemd-analyze`; the daemon runs under the unit's
system-call filter, W^X rule, address families and network namespace as systemd's executor
would set them (tests/helpers/unit_sandbox.py), started by the real
`systemd-socket-activate`.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.daemon_support import FOREGROUND_UID, SOCKET_GID, WAIT_S, Child
from helpers.real_daemon import granted, in_process_digest
from npumanager.cli import units
from npumanager.cli.program import main
from npumanager.cli.units import NAMES, check_program, render, render_all
from npumanager.errors import NpuManagerError

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guides" / "integrators.md"
SANDBOX = Path(__file__).with_name("helpers") / "unit_sandbox.py"
ANALYZE = shutil.which("systemd-analyze")
ACTIVATE = shutil.which("systemd-socket-activate")
TRUE = shutil.which("true") or "/bin/true"
"""An executable every machine has outside the folders the sandbox hides, for --exec."""
SCRIPT = Path(sys.executable).with_name("npu-manager")
CONSOLE = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "npumanager"]
MAX_EXPOSURE = 2.0
DRIVERS = ("vnpu", "onnxruntime", "openvino")
"""The built-in drivers that run in real time, each with a sandbox of its own."""

needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="needs systemd-analyze (systemd)")


def security_report(unit: Path) -> str:
    """What `systemd-analyze security --offline=yes` prints of the unit (and its drop-ins)."""
    assert ANALYZE is not None
    result = subprocess.run(
        [ANALYZE, "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return result.stdout + result.stderr


def exposure(unit: Path) -> float:
    """The overall exposure `systemd-analyze security` gives the unit."""
    report = security_report(unit)
    found = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", report)
    assert found, report
    return float(found.group(1))


def written_unit(folder: Path, driver: str) -> Path:
    """The service unit as `npu-manager units` writes it, in `folder`."""
    path = folder / "npu-manager.service"
    with path.open("w") as out:
        subprocess.run(
            [*CONSOLE, "units", "npu-manager.service", "--driver", driver, "--exec", TRUE],
            stdout=out,
            check=True,
            timeout=120,
        )
    return path


# The rating ----------------------------------------------------------------------------


@needs_analyze
@pytest.mark.parametrize("driver", DRIVERS)
def test_systemd_analyze_security_rates_the_written_unit_ok(tmp_path: Path, driver: str) -> None:
    assert exposure(written_unit(tmp_path, driver)) <= MAX_EXPOSURE


@needs_analyze
def test_without_its_sandbox_the_unit_would_be_rated_exposed(tmp_path: Path) -> None:
    """The rating measures the sandbox: the same unit without its lines fails the bound."""
    text = render("npu-manager.service", executable=TRUE, driver="openvino")
    head, _, rest = text.partition("# The sandbox")
    bare = tmp_path / "npu-manager.service"
    bare.write_text(head + "\n[Install]" + rest.split("\n[Install]", 1)[1])
    assert exposure(bare) > MAX_EXPOSURE


def test_each_driver_gets_the_sandbox_its_runtime_needs() -> None:
    def lines(driver: str) -> set[str]:
        return set(render("npu-manager.service", executable=TRUE, driver=driver).splitlines())

    vnpu, ort, openvino, other = map(lines, ("vnpu", "onnxruntime", "openvino", "acme"))
    assert {"PrivateDevices=yes", "MemoryDenyWriteExecute=yes"} <= vnpu
    assert not any(line.startswith("DeviceAllow=") for line in vnpu)
    accelerator = {"DevicePolicy=closed", "DeviceAllow=char-accel rw", "DeviceAllow=char-drm rw"}
    for real in (ort, openvino, other):
        assert accelerator <= real and "PrivateDevices=yes" not in real
    assert "MemoryDenyWriteExecute=yes" in ort
    assert "MemoryDenyWriteExecute=yes" not in openvino | other, "JIT runtimes need W+X"
    for unit in (vnpu, ort, openvino):
        assert {
            "ProtectSystem=strict",
            "ProtectHome=yes",
            "PrivateTmp=yes",
            "PrivateNetwork=yes",
            "RestrictAddressFamilies=AF_UNIX",
            "CapabilityBoundingSet=",
            "SystemCallFilter=@system-service",
            "ProtectProc=default",
        } <= unit


def _guide_block(first_line: str) -> str:
    """The ```ini block of the integrators' guide whose first line is `first_line`."""
    for block in GUIDE.read_text(encoding="utf-8").split("```ini\n")[1:]:
        body = block.split("\n```", 1)[0] + "\n"
        if body.startswith(first_line):
            return body
    raise AssertionError(f"no ini block starting {first_line!r} in {GUIDE}")


def test_the_guides_copy_of_the_units_is_what_units_prints() -> None:
    shown = _guide_block("# /etc/systemd/system/npu-manager.socket")
    options = {"executable": "/usr/bin/npu-manager", "driver": "openvino", "policy": "budget"}
    assert shown == render_all(**options)


@needs_analyze
def test_the_guides_network_sink_drop_in_opens_the_network_and_still_rates_ok(
    tmp_path: Path,
) -> None:
    drop_in = _guide_block("# /etc/systemd/system/npu-manager.service.d/network-sink.conf")
    (tmp_path / "npu-manager.service.d").mkdir()
    (tmp_path / "npu-manager.service.d" / "network-sink.conf").write_text(drop_in)
    unit = tmp_path / "npu-manager.service"
    unit.write_text(render("npu-manager.service", executable=TRUE, driver="openvino"))
    report = security_report(unit)
    opened = [line for line in report.splitlines() if "AF_(INET|INET6)" in line]
    assert opened and opened[0].startswith("✗"), "the drop-in is read and gives IP sockets"
    assert exposure(unit) <= MAX_EXPOSURE
    assert "--sink prometheus:port=9464" in drop_in


# Refusals ------------------------------------------------------------------------------


def _refused(tmp_path: Path, *args: str) -> str:
    """Run `npu-manager units ARGS` into a file: exit 2, one line on stderr, the file empty."""
    written = tmp_path / "units.out"
    with written.open("w") as out:
        result = subprocess.run(
            [*CONSOLE, "units", *args],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=120,
        )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert written.read_text() == "", "nothing is written before the check"
    return result.stderr


HIDDEN_HINT = "install npu-manager outside /home, /root, /run/user, /tmp and /var/tmp"
GROUP_HINT = "a name is a letter or _ then letters, digits, _ or -, at most 31 characters"


@pytest.mark.parametrize(
    ("args", "wrong", "allowed"),
    [
        (["--driver", "nope"], "unknown driver 'nope'", "available: "),
        (["--driver", "reference"], "driver 'reference' runs in virtual time only", "vnpu"),
        (["--policy", "nope"], "unknown policy 'nope'", "available: "),
        (["--exec", "/opt/no-npu-manager"], "/opt/no-npu-manager does not exist", "installed"),
        (["--exec", "npu-manager"], "got 'npu-manager'", "must be an absolute path"),
        (["--exec", "/usr/bin/npu manager"], "holds ' '", "give a path without whitespace"),
        (["--exec", "/home/al/bin/npu-manager"], "under /home, which ProtectHome=", HIDDEN_HINT),
        (["--exec", "/root/bin/npu-manager"], "under /root, which ProtectHome=", HIDDEN_HINT),
        (["--exec", "/run/user/1000/npu-manager"], "under /run/user, which Prot", HIDDEN_HINT),
        (["--exec", "/var/tmp/npu-manager"], "under /var/tmp, which PrivateTmp=", HIDDEN_HINT),
        (["--device-groups", "render,vid eo!"], "'eo!' is not a valid group name", GROUP_HINT),
        (["--device-groups", "9render"], "'9render' is not a valid group name", GROUP_HINT),
        (["npu-manager.service", "--device-groups", "a" * 32], "is not a valid", GROUP_HINT),
    ],
)
def test_units_refuses_with_one_line_and_writes_nothing(
    tmp_path: Path, args: list[str], wrong: str, allowed: str
) -> None:
    if "--exec" not in args:
        args = [*args, "--exec", TRUE]
    stderr = _refused(tmp_path, *args)
    assert wrong in stderr and allowed in stderr, stderr


def test_an_exec_under_tmp_is_refused_though_it_exists(tmp_path: Path) -> None:
    program = tmp_path / "npu-manager"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    stderr = _refused(tmp_path, "--exec", str(program))
    assert f"--exec {program} lies under /tmp, which PrivateTmp= hides" in stderr
    assert "install npu-manager outside /home, /root, /run/user, /tmp and /var/tmp" in stderr


def test_links_and_interpreters_are_followed_into_hidden_places(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hidden, shown = tmp_path / "hidden", tmp_path / "shown"
    hidden.mkdir()
    shown.mkdir()
    monkeypatch.setattr(units, "HIDDEN", {str(hidden): "ProtectHome="})
    python = hidden / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    (shown / "python").symlink_to(python)
    (shown / "link").symlink_to(python)
    for name, interpreter in (("via-link", shown / "python"), ("fine", Path(TRUE))):
        script = shown / name
        script.write_text(f"#!{interpreter} -u\n")
        script.chmod(0o755)
    with pytest.raises(
        NpuManagerError, match=rf"--exec {shown}/link, really {hidden}/python, lies under"
    ):
        check_program(str(shown / "link"))
    with pytest.raises(
        NpuManagerError,
        match=r"--exec \S+/via-link runs \S+/shown/python, really \S+/hidden/python, lies",
    ):
        check_program(str(shown / "via-link"))
    check_program(str(shown / "fine"))
    (shown / "plain").write_text("")
    with pytest.raises(NpuManagerError, match="plain is not an executable file"):
        check_program(str(shown / "plain"))


def test_without_exec_the_running_npu_manager_is_checked_the_same_way(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(units, "_default_command", lambda: ("/home/x/venv/bin/npu-manager",))
    assert main(["units"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert (
        "the npu-manager you ran (no --exec given) /home/x/venv/bin/npu-manager lies under /home"
        in err
    )
    assert err.count("\n") == 1


def test_a_good_unit_is_still_written_whole_with_groups_as_systemd_takes_them() -> None:
    result = subprocess.run(
        [*CONSOLE, "units", "--exec", TRUE, "--device-groups", "render,video"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert result.stdout == render_all(executable=TRUE, device_groups="render,video")
    assert "SupplementaryGroups=render video\n" in result.stdout
    assert all(f"# {units.PLACES[name]}" in result.stdout for name in NAMES)


# The daemon under the sandbox ----------------------------------------------------------

needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0
    or platform.machine() != "x86_64"
    or ANALYZE is None
    or ACTIVATE is None
    or not Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h").exists(),
    reason="needs root (a network namespace), x86-64, systemd-analyze, "
    "systemd-socket-activate and the kernel's syscall numbers (linux-libc-dev)",
)


def _notify_socket(path: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(path))
    path.chmod(0o666)  # the daemon runs as another uid
    listener.settimeout(0.2)
    return listener


def _wait_for(listener: socket.socket, state: str, timeout: float = WAIT_S) -> None:
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            seen.append(listener.recv(4096).decode())
        if any(state in message.split("\n") for message in seen):
            return
    raise AssertionError(f"no {state} within {timeout} s; got {seen}")


@needs_sandbox
@pytest.mark.parametrize("driver", DRIVERS)
def test_the_daemon_serves_under_the_units_sandbox(
    socket_dir: Path, model_file: Path, driver: str
) -> None:
    if driver != "vnpu":
        pytest.importorskip(driver)
    assert ACTIVATE is not None
    unit = socket_dir / "npu-manager.service"
    unit.write_text(render("npu-manager.service", executable=TRUE, driver=driver))
    path, log = socket_dir / "npu.sock", socket_dir / "daemon.log"
    notify = _notify_socket(socket_dir / "notify")
    env = [f"--setenv=NOTIFY_SOCKET={socket_dir / 'notify'}", "--setenv=HOME=/"]
    env += [f"--setenv=PYTHONPATH={os.environ['PYTHONPATH']}"] if "PYTHONPATH" in os.environ else []
    sandboxed = [sys.executable, str(SANDBOX), str(unit)]
    serve = [
        sys.executable,
        "-m",
        "npumanager",
        "serve",
        "--driver",
        driver,
        "--log-level",
        "debug",
    ]
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [ACTIVATE, "--listen", str(path), "--fdname=npu", *env, *sandboxed, *serve],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    child = None
    try:
        deadline = time.monotonic() + WAIT_S
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.chown(path, -1, SOCKET_GID)  # as the socket unit's SocketGroup= would
        path.chmod(0o660)
        child = Child(path, FOREGROUND_UID)  # the first connection starts the daemon
        assert "ready" in child.hello, (child.hello, log.read_text())
        _wait_for(notify, "READY=1")
        status = Path(f"/proc/{process.pid}/status").read_text()
        for held in ("CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "Seccomp:\t2"):
            assert held in status, status
        granted(child)
        if driver == "vnpu":
            assert child.ok("load", id=1, weight_bytes=1 << 20)["model"] >= 0
            assert isinstance(child.ok("submit", id=1), int)
        else:
            child.ok("real_load", id=1, path=str(model_file))
            expected = in_process_digest(rows=4, value=0.5, driver=driver)
            assert child.ok("real_run", id=1, rows=4, value=0.5) == expected
        child.close()
        process.send_signal(signal.SIGTERM)
        _wait_for(notify, "STOPPING=1")
        assert process.wait(WAIT_S) == 0, log.read_text()
    finally:
        if child is not None:
            child.close()
        if process.poll() is None:
            process.kill()
            process.wait(WAIT_S)
        notify.close()
    text = log.read_text(errors="replace")
    assert "serving the socket systemd passed" in text, text
    assert "Traceback" not in text and "Operation not permitted" not in text, text


@needs_sandbox
def test_openvinos_cpu_plugin_needs_memory_both_written_and_run(socket_dir: Path) -> None:
    """Why the openvino unit has no MemoryDenyWriteExecute=: under it, compiling fails."""
    pytest.importorskip("openvino")
    unit = socket_dir / "npu-manager.service"
    text = render("npu-manager.service", executable=TRUE, driver="openvino")
    unit.write_text(text.replace("RemoveIPC=yes\n", "MemoryDenyWriteExecute=yes\nRemoveIPC=yes\n"))
    compile_one = (
        "import numpy as np, openvino as ov, openvino.opset13 as ops\n"
        "p = ops.parameter([2], np.float32)\n"
        "ov.Core().compile_model(ov.Model([ops.add(p, p)], [p]), 'CPU')\n"
    )
    sandboxed = [sys.executable, str(SANDBOX), str(unit)]
    result = subprocess.run(
        [*sandboxed, sys.executable, "-c", compile_one],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "HOME": "/"},
    )
    assert result.returncode != 0 and "can't protect" in result.stderr, result.stderr
