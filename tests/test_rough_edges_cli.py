"""A new user's rough edges of issue 31, through the real console script (one line, exit 2,
no traceback) and the public API (an `NpuManagerError`)."""

from __future__ import annotations

import os
import re
import select
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

import npumanager as npu_api
from helpers.console import npu, one_line_error, started
from npumanager.core.plugins.registry import load_plugins
from npumanager.errors import NpuManagerError

WAIT_S = 60.0
"""How long a test waits for an event before it calls the run hung (never a pace)."""

HAS_ONNXRUNTIME = "onnxruntime" in {r.name for r in load_plugins().registrations()}
needs_onnxruntime = pytest.mark.skipif(not HAS_ONNXRUNTIME, reason="needs the onnxruntime extra")


def serve(tmp_path: Path, *argv: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """`serve` on a socket in `tmp_path`, expected to refuse before it binds."""
    result = npu("serve", "--socket", str(tmp_path / "s.sock"), *argv, timeout=WAIT_S, **kwargs)
    assert not (tmp_path / "s.sock").exists(), "refused before the socket was bound"
    return result


# Driver options (items 1 and 2) -----------------------------------------------------------


@needs_onnxruntime
@pytest.mark.parametrize(
    ("value", "expected"),
    [("abc", "option channels takes an int; got 'abc'"), ("0", "greater than or equal to 1")],
)
def test_a_driver_option_of_the_wrong_type_or_range_is_one_line(
    tmp_path: Path, value: str, expected: str
) -> None:
    result = serve(tmp_path, "--driver", "onnxruntime", "--driver-option", f"channels={value}")
    line = one_line_error(result, "driver 'onnxruntime'", "channels", expected)
    assert "pydantic" not in line and "errors.pydantic.dev" not in line


@needs_onnxruntime
def test_a_driver_option_out_of_range_in_process_is_an_npu_manager_error() -> None:
    with pytest.raises(NpuManagerError, match="channels") as caught:
        npu_api.Service("onnxruntime", "budget", driver_options={"channels": 0})
    assert "\n" not in str(caught.value), "one line, as at the command line"
    with pytest.raises(NpuManagerError, match="option channels takes an int; got 'abc'"):
        npu_api.Service("onnxruntime", "budget", driver_options={"channels": "abc"})


def test_serve_help_shows_driver_options_the_default_driver_takes() -> None:
    result = npu("serve", "--help")
    assert result.returncode == 0, result.stderr
    help_text = " ".join(result.stdout.split())
    examples = re.search(r"an option of the driver, e\.g\. (.*?) or, for", help_text)
    assert examples is not None, help_text
    options = dict(item.split("=") for item in examples.group(1).split(", "))
    assert options, help_text
    typed = {key: int(value) if value.isdigit() else value for key, value in options.items()}
    with npu_api.Service("vnpu", "budget", clock="virtual", driver_options=typed):
        pass


def test_an_option_the_default_driver_lacks_is_named_with_the_ones_it_takes(
    tmp_path: Path,
) -> None:
    line = one_line_error(
        serve(tmp_path, "--driver-option", "channels=2"),
        "driver 'vnpu' has no option 'channels'",
        "max_live_work (int)",
        "max_models (int)",
    )
    assert "clock" not in line, "the service passes the clock itself"
    assert "devices" not in line.split("options:")[1], "--devices gives the devices"


@needs_onnxruntime
def test_an_unknown_onnxruntime_option_lists_the_drivers_options(tmp_path: Path) -> None:
    line = one_line_error(
        serve(tmp_path, "--driver", "onnxruntime", "--driver-option", "bogus=1"),
        "driver 'onnxruntime' has no option 'bogus'",
        "channels (int)",
        "capacity_bytes (int)",
        "max_models (int)",
    )
    assert "Channels.__init__" not in line and "clock" not in line


def test_a_third_party_drivers_options_are_checked_the_same_way() -> None:
    registry = load_plugins()
    if "acme" not in {r.name for r in registry.registrations()}:
        pytest.skip("examples/acme-npu is not installed")
    with pytest.raises(NpuManagerError, match=r"driver 'acme' has no option 'bogus'; .*max_models"):
        npu_api.Service("acme", clock="virtual", driver_options={"bogus": 1}, registry=registry)


def test_the_clock_is_the_services_not_a_driver_option() -> None:
    with pytest.raises(NpuManagerError, match="'clock' is not an option of driver 'vnpu'"):
        npu_api.Service("vnpu", clock="virtual", driver_options={"clock": "real"})


# The socket (items 3 and 6) ---------------------------------------------------------------


@pytest.mark.parametrize("given", ["", ".", "/"])
def test_serve_on_a_socket_path_without_a_name_is_one_line(tmp_path: Path, given: str) -> None:
    one_line_error(
        npu("serve", "--socket", given, timeout=WAIT_S),
        "--socket must name the daemon's socket file",
    )


@pytest.mark.parametrize("verb", [["serve"], ["info"]])
def test_an_empty_socket_variable_is_refused_not_taken_as_unset(verb: list[str]) -> None:
    env = {**os.environ, "NPUMANAGER_SOCKET": ""}
    one_line_error(
        npu(*verb, env=env, timeout=WAIT_S), "NPUMANAGER_SOCKET is set but empty", "unset it"
    )


# Sinks (item 4) ---------------------------------------------------------------------------


def test_a_sink_path_in_a_missing_folder_is_refused_and_not_created(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "x.jsonl"
    one_line_error(
        serve(tmp_path, "--sink", f"jsonl:path={target}"),
        f"{tmp_path / 'missing'}: no such folder",
    )
    assert not target.parent.exists()


def test_a_sink_path_that_cannot_be_written_is_refused_before_serving(tmp_path: Path) -> None:
    one_line_error(serve(tmp_path, "--sink", f"jsonl:path={tmp_path}"), "is a directory")
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        one_line_error(
            serve(tmp_path, "--sink", f"jsonl:path={locked / 'x.jsonl'}"), "Permission denied"
        )


def test_a_perfetto_path_in_a_missing_folder_is_refused_too(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "trace.json"
    one_line_error(
        serve(tmp_path, "--sink", f"perfetto:path={target}"), f"{target.parent}: no such folder"
    )


def read_until(process: subprocess.Popen[str], wanted: str) -> list[str]:
    """The stderr lines of `process` up to the first holding `wanted` (waits for it)."""
    assert process.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stderr], [], [], 1.0)
        if ready:
            line = process.stderr.readline()
            if not line:
                break
            lines.append(line)
            if wanted in line:
                return lines
    raise AssertionError(f"no line with {wanted!r} within {WAIT_S} s; got {lines}")


def test_a_full_disk_under_the_jsonl_sink_is_one_log_line_without_a_traceback(
    tmp_path: Path,
) -> None:
    socket_path = tmp_path / "s.sock"
    serve = ["serve", "--socket", str(socket_path), "--health-interval-ms", "10"]
    with started(*serve, "--sink", "jsonl:path=/dev/full") as process:
        read_until(process, "serving on")
        lines = read_until(process, "/dev/full")
        process.send_signal(signal.SIGTERM)
        rest = process.communicate(timeout=WAIT_S)[1]
    log = "".join(lines) + rest
    assert process.returncode == 0, log
    assert "Traceback" not in log, log
    about = [line for line in log.splitlines() if "/dev/full" in line]
    assert len(about) == 1, log
    assert "No space left on device" in about[0] and "dropped" in about[0], about


def test_the_jsonl_sink_in_process_logs_a_write_error_once_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from npumanager.telemetry.jsonl import JsonlSink

    sink = JsonlSink("/dev/full")
    event = npu_api.WorkEvent(2, 0, 1, None, 10001, 0, 10001, None, 0, 0, 1, 0, 1000, 1)
    with caplog.at_level("INFO", logger="npumanager"):
        for _ in range(3):
            sink.handle([event] * 1000)  # past the file's buffer: written at once
        sink.close()
    about = [r for r in caplog.records if "/dev/full" in r.getMessage()]
    assert len(about) == 1, [r.getMessage() for r in caplog.records]
    assert about[0].exc_info is None


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a device node of its own (root)")
def test_the_jsonl_sink_never_rotates_a_device(tmp_path: Path) -> None:
    from npumanager.telemetry.jsonl import JsonlSink

    null = tmp_path / "null"  # a /dev/null of this test's own: renaming it harms no one
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    sink = JsonlSink(null, max_bytes=1)
    event = npu_api.WorkEvent(2, 0, 1, None, 10001, 0, 10001, None, 0, 0, 1, 0, 1000, 1)
    sink.handle([event])
    sink.handle([event])
    sink.close()
    assert null.is_char_device() and not (tmp_path / "null.1").exists()


# Config, plugins and options (items 7 to 10) ----------------------------------------------


def test_dev_null_is_an_empty_config_and_other_devices_are_still_refused() -> None:
    result = npu("--config", "/dev/null", "config")
    assert result.returncode == 0, result.stderr
    assert "config file: /dev/null" in result.stdout
    one_line_error(npu("--config", "/dev/zero", "config"), "/dev/zero: is a character device")


def test_disabling_a_plugin_no_one_installed_warns_naming_the_installed_ones() -> None:
    env = {**os.environ, "NPUMANAGER_DISABLE_PLUGINS": "bogus"}
    result = npu("plugins", env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "warning:" in lines[0] and "'bogus'" in lines[0], lines[0]
    assert "vnpu" in lines[0] and "builtin-sinks" in lines[0], "names the installed ones"


def test_a_negative_unload_grace_names_the_option_and_a_human_range(tmp_path: Path) -> None:
    line = one_line_error(serve(tmp_path, "--unload-grace-ms", "-1"), "--unload-grace-ms", "-1")
    assert "unload_grace_ms" not in line and "9223372036854775807" not in line


def test_set_policy_names_the_policies_as_they_are_registered() -> None:
    result = npu("set-policy", "--help")
    assert result.returncode == 0, result.stderr
    registered = {r.name for r in load_plugins().registrations()}
    named = re.findall(r"\b[a-z]+[-_][a-z]+\b", " ".join(result.stdout.split()))
    policies = [n for n in named if n.replace("-", "_") in registered]
    assert policies and all(n in registered for n in policies), policies


# Ctrl-C (item 11) -------------------------------------------------------------------------


def importing_npu_manager(process: subprocess.Popen[str]) -> None:
    """Wait until `process` is importing npu-manager (pydantic's core is mapped): past
    CPython's own start (site, the wrapper's `import re`), which no console script can
    guard, and inside the entry point's guard."""
    deadline = time.monotonic() + WAIT_S
    while process.poll() is None and time.monotonic() < deadline:
        with open(f"/proc/{process.pid}/maps") as maps:
            if "_pydantic_core" in maps.read():
                return
        time.sleep(0.001)
    assert process.poll() is None, "the command ended before it imported npu-manager"
    raise AssertionError(f"npu-manager was not imported within {WAIT_S} s")


CTRL_C_IN_SET_NAME = """
import os, signal, sys


class Landing:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):  # the handler runs between these steps, inside __set_name__
            pass


class CtrlCWhileImporting:
    def find_spec(self, name, path=None, target=None):
        if name == "npumanager.schemas":
            sys.meta_path.remove(self)

            class Model:  # a class made while npu-manager is imported, as pydantic's are
                field = Landing()
        return None


sys.meta_path.insert(0, CtrlCWhileImporting())
"""
"""A `sitecustomize`: Ctrl-C lands inside a class's `__set_name__` while npu-manager is
being imported, where Python 3.11 wraps the KeyboardInterrupt in a RuntimeError."""


def test_ctrl_c_inside_a_class_being_made_at_start_is_quiet(tmp_path: Path) -> None:
    """A busy CI run met this: the Ctrl-C landed in pydantic's `__set_name__` and the
    launcher, which caught only KeyboardInterrupt, let the RuntimeError out as a traceback."""
    (tmp_path / "sitecustomize.py").write_text(CTRL_C_IN_SET_NAME)
    result = npu("plugins", env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=WAIT_S)
    assert result.stderr.splitlines() == ["npu-manager: interrupted"], result.stderr
    assert result.returncode == 130


def test_ctrl_c_wrapped_in_another_error_while_a_command_runs_is_quiet(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once started, a Ctrl-C that Python wrapped in another error (its cause) still ends
    the command in one line with 130; any other error is not taken for one."""
    import _npumanager_launch
    import npumanager.cli.program

    def interrupted() -> None:
        raise RuntimeError("Error calling __set_name__") from KeyboardInterrupt()

    monkeypatch.setattr(npumanager.cli.program, "entry", interrupted)
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as ended:
            _npumanager_launch.entry()
    finally:
        signal.signal(signal.SIGINT, handler)  # entry ignores a second Ctrl-C from then on
    assert ended.value.code == 130
    assert capsys.readouterr().err == "npu-manager: interrupted\n"

    def broken() -> None:
        raise RuntimeError("a bug") from ValueError("not a Ctrl-C")

    monkeypatch.setattr(npumanager.cli.program, "entry", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        _npumanager_launch.entry()


@pytest.mark.parametrize("delay_s", [0, 0.05, 0.2])
def test_ctrl_c_at_any_moment_of_the_start_is_quiet(delay_s: float) -> None:
    with started("plugins", stdout=subprocess.PIPE) as process:
        importing_npu_manager(process)
        if delay_s:
            time.sleep(delay_s)  # where the signal lands; nothing is asserted about time
        process.send_signal(signal.SIGINT)
        err = process.communicate(timeout=WAIT_S)[1]
    assert "Traceback" not in err, err
    assert process.returncode in (130, 0), (process.returncode, err)
    if process.returncode == 130:
        assert err.splitlines() == ["npu-manager: interrupted"], err
