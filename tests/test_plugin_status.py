"""`npu-manager plugins`: every entry point with its status, and why a name is missing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import pytest

from helpers.daemon_support import WAIT_S
from npumanager.core.plugins.registry import (
    BROKEN,
    DISABLED,
    EMPTY,
    LOADED,
    UNAVAILABLE,
    load_plugins,
)
from npumanager.errors import UnknownPluginError

WITHOUT_EXTRAS = (
    "import sys; sys.modules['onnx'] = None; sys.modules['prometheus_client'] = None; "
    "from npumanager.cli.program import entry; sys.argv[0] = 'npu-manager'; entry()"
)
"""The real console entry point, as on a machine without the onnxruntime and prometheus extras."""


def npu(*argv: str, extras: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    """The installed console script (without extras: its entry point, extras blocked)."""
    script = str(Path(sys.executable).with_name("npu-manager"))
    command = [script] if extras else [sys.executable, "-c", WITHOUT_EXTRAS]
    return subprocess.run(
        [*command, *argv],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **env},
    )


def entry_points(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    assert result.returncode == 0, result.stderr
    return {e["entry_point"]: e for e in json.loads(result.stdout)["entry_points"]}


def test_json_lists_every_entry_point_loaded_with_what_it_registered() -> None:
    found = entry_points(npu("plugins", "--json"))
    assert found["vnpu"]["status"] == LOADED
    assert found["vnpu"]["detail"] == "driver vnpu"
    assert found["builtin-policies"]["detail"].startswith("policy budget, policy pressure")


def test_without_an_extra_the_entry_point_is_unavailable_naming_the_extra() -> None:
    found = entry_points(npu("plugins", "--json", extras=False))
    assert found["onnxruntime"]["status"] == UNAVAILABLE
    assert found["onnxruntime"]["detail"] == (
        "driver onnxruntime (pip install 'npu-manager[onnxruntime]')"
    )
    assert found["builtin-sinks"]["status"] == LOADED
    assert (
        "unavailable: sink prometheus (pip install 'npu-manager[prometheus]')"
        in (found["builtin-sinks"]["detail"])
    )
    table = npu("plugins", extras=False).stdout
    assert "onnxruntime  " in table and "unavailable" in table


def test_an_unknown_driver_names_the_extra_it_needs() -> None:
    result = npu("simulate", "demo", "--driver", "onnxruntime", extras=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "npu-manager: error: driver 'onnxruntime' is not available here: "
        "pip install 'npu-manager[onnxruntime]'; available: "
        + result.stderr.split("available: ")[-1].strip()
    ]


def test_a_disabled_entry_point_says_by_which_setting_and_so_does_its_name() -> None:
    found = entry_points(npu("plugins", "--json", NPUMANAGER_DISABLE_PLUGINS="reference"))
    assert found["reference"]["status"] == DISABLED
    assert found["reference"]["detail"] == "by plugins.disable"
    result = npu("demo", "--driver", "reference", NPUMANAGER_DISABLE_PLUGINS="reference")
    assert result.returncode == 2
    assert "unknown driver 'reference': plugin 'reference' is disabled by plugins.disable" in (
        result.stderr
    )


def test_broken_and_empty_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty_npu_plugin.py").write_text("X = 1\n")
    (tmp_path / "broken_npu_plugin.py").write_text("raise ImportError('no vendor library')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    group = "npumanager"
    found = [
        metadata.EntryPoint("empty", "empty_npu_plugin", group),
        metadata.EntryPoint("broken", "broken_npu_plugin", group),
    ]
    with pytest.warns(UserWarning):
        registry = load_plugins(entry_points=found)
    status = {e.source.name: (e.status, e.detail) for e in registry.entries}
    assert status["empty"] == (EMPTY, "its hooks returned no records")
    assert status["broken"][0] == BROKEN
    assert "failed to import: ImportError: no vendor library" in status["broken"][1]
    with pytest.raises(UnknownPluginError, match="^unknown driver 'empty'; available: none"):
        registry.driver("empty")


@pytest.mark.slow
def test_a_daemon_of_a_simulated_driver_serves_without_the_runtime_extras() -> None:
    """A plain install (`pip install .`, README block 1) has neither onnx nor a runtime;
    `serve` with the default driver starts, answers and stops on SIGTERM all the same."""
    with tempfile.TemporaryDirectory(prefix="npu-plain-", dir="/tmp") as folder:
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(f"{folder}/notify")
        notify.settimeout(0.5)
        path = f"{folder}/npu.sock"
        process = subprocess.Popen(
            [sys.executable, "-c", WITHOUT_EXTRAS, "serve", "--socket", path],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "NOTIFY_SOCKET": f"{folder}/notify"},
        )
        try:
            deadline = time.monotonic() + WAIT_S
            ready = False
            while not ready and process.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    ready = b"READY=1" in notify.recv(4096).split(b"\n")
            assert ready, "the daemon ended or hung before it was ready"
            info = npu("info", "--socket", path, "--json", extras=False)
            assert info.returncode == 0, info.stderr
            assert json.loads(info.stdout)["daemon"]["connections"] == 1
        finally:
            process.send_signal(signal.SIGTERM)
            err = process.communicate(timeout=WAIT_S)[1]
            notify.close()
        assert process.returncode == 0, err
        assert "Traceback" not in err, err
