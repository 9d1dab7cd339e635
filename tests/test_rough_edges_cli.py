"""A new user's rough edges of issue 31, through the real console script (one line, exit 2,
no traceback) and the public API (an `NpuManagerError`)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

import npumanager as npu_api
from helpers.console import npu, one_line_error
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
