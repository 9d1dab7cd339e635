"""Issue 18's command-line items that had no test through the installed `npu-manager` script.

Each runs the real console script as a user would: without a home directory, as a uid
that cannot enter a folder, against no daemon or a silent one, with third-party entry
points that are broken or register nothing, and `vts` on a driver with a bug.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import npumanager as npu
from helpers.checkout_access import needs_checkout_other_uids_can_enter
from helpers.daemon_support import WAIT_S, DaemonProcess, open_socket_dir

SCRIPT = str(Path(sys.executable).with_name("npu-manager"))
TESTS = Path(__file__).resolve().parent
NOBODY = 54_321
"""A uid and gid with no passwd or group entry."""
AS_NOBODY = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
as_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="running as another uid needs root and util-linux's setpriv",
)


def console(
    *argv: str, env: dict[str, str] | None = None, nobody: bool = False, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """The installed console script (as uid NOBODY if `nobody`); `env` replaces the
    environment when given."""
    if nobody:
        needs_checkout_other_uids_can_enter(NOBODY)  # the script and its venv, read as NOBODY
    kwargs.setdefault("timeout", 120)
    return subprocess.run(
        [*(AS_NOBODY if nobody else []), SCRIPT, *argv],
        capture_output=True,
        text=True,
        check=False,
        env=os.environ if env is None else env,
        **kwargs,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def distribution(site: Path, name: str, entry_point: str, module: str, source: str) -> None:
    """Install a one-module distribution into `site` as pip would (dist-info, entry point)."""
    (site / f"{module}.py").write_text(source)
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[npumanager]\n{entry_point} = {module}\n")


def with_path(*folders: Path) -> dict[str, str]:
    """This environment with `folders` first on PYTHONPATH."""
    path = os.pathsep.join([*map(str, folders), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every uid may enter (tmp_path is root's own when tests run as root)."""
    folder = Path(tempfile.mkdtemp(prefix="npu-first-hour-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# Tracebacks and hangs ---------------------------------------------------------------------


@as_root
def test_no_home_and_a_uid_without_a_passwd_entry_is_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOME", "XDG_"))}
    result = console("config", env=env, nobody=True, cwd="/")
    line = one_line_error(result)
    assert line == (
        f"npu-manager: error: no home directory (HOME is unset and uid {NOBODY} has no passwd "
        "entry); set HOME, or NPUMANAGER_CONFIG or --config"
    )


@as_root
def test_a_config_in_a_folder_another_uid_cannot_enter_is_one_line(open_dir: Path) -> None:
    locked = open_dir / "locked"
    locked.mkdir(mode=0o700)
    (locked / "config.toml").write_text("")
    env = {**os.environ, "HOME": str(open_dir)}
    result = console("--config", str(locked / "config.toml"), "config", env=env, nobody=True)
    assert one_line_error(result) == (
        f"npu-manager: error: {locked / 'config.toml'}: cannot be read: Permission denied"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["set-importance", "SOCKET", "--", "-5", "FOREGROUND"],
            "UID must be a uid 0..2147483647; got -5",
        ),
        (
            ["set-importance", "SOCKET", "99999999999", "FOREGROUND"],
            "UID must be a uid 0..2147483647",
        ),
        (
            ["set-access", "SOCKET", "99999999999", "--direct-access"],
            "UID must be a uid 0..2147483647",
        ),
        (["info", "--socket", ""], "--socket must name the daemon's socket file; got an empty"),
    ],
)
def test_daemon_verbs_check_their_arguments_before_connecting(
    open_dir: Path, argv: list[str], expected: str
) -> None:
    none = ["--socket", str(open_dir / "none.sock")]  # nothing listens there
    argv = [part for word in argv for part in (none if word == "SOCKET" else [word])]
    assert expected in one_line_error(console(*argv))


def test_a_daemon_that_never_answers_is_given_up_after_timeout(open_dir: Path) -> None:
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(open_dir / "silent.sock"))
    silent.listen(1)
    try:
        argv = ["info", "--socket", str(open_dir / "silent.sock"), "--timeout", "0.5"]
        line = one_line_error(console(*argv, timeout=25))  # the default would wait 30 s
    finally:
        silent.close()
    assert line.startswith("npu-manager: error: ")


def test_serve_checks_health_options_naming_the_allowed_ones(open_dir: Path) -> None:
    result = console("serve", "--socket", str(open_dir / "s.sock"), "--health", "linux:bogus=1")
    line = one_line_error(result)
    assert line.startswith(
        "npu-manager: error: health source 'linux': unknown option 'bogus'; allowed: root, "
    )
    assert not (open_dir / "s.sock").exists(), "refused before it listened"


# The daemon's output ----------------------------------------------------------------------


def test_set_importance_and_info_name_importances_and_the_device_of_a_loaded_model() -> None:
    directory = open_socket_dir()
    daemon = DaemonProcess(directory, "--policy", "budget")
    sock = str(daemon.socket)
    try:
        answer = console("set-importance", "10123", "foreground", "--socket", sock)
        assert answer.stdout == "uid 10123 importance is now FOREGROUND (100)\n", answer.stderr
        manager = npu.connect(daemon.socket, uses_feature=True)
        loaded = threading.Event()

        class App(npu.ModelLoadRequestCallback):
            def on_can_load_model(self, request: Any, status: object, listener: Any) -> None:
                manager.load_model(request, weight_bytes=64 << 20)
                listener.notify_model_loaded(request)
                loaded.set()

        manager.request_can_load_model(npu.ModelLoadRequest.Builder(4).set_size(0).build(), App())
        assert loaded.wait(WAIT_S)
        document = json.loads(console("info", "--socket", sock, "--json").stdout)
        (request,) = document["requests"]["loaded"]
        assert request["device"] == 0
        assert {c["uid"]: c["importance"] for c in document["priorities"]}[10123] == "FOREGROUND"
        text = console("info", "--socket", sock).stdout
        row = next(line for line in text.splitlines() if line.startswith("loaded"))
        assert row.split()[-1] == "0", "the device column of a loaded request"
        assert "FOREGROUND" in text
        manager.close()
    finally:
        assert daemon.stop() == 0, daemon.log()
        shutil.rmtree(directory, ignore_errors=True)


# Seeing what is installed and why not -----------------------------------------------------


def test_plugins_shows_broken_and_empty_entry_points_with_why(tmp_path: Path) -> None:
    distribution(tmp_path, "npu-empty", "emptynpu", "npu_empty_plugin", "X = 1\n")
    distribution(
        tmp_path, "npu-broken", "brokennpu", "npu_broken_plugin",
        "raise ImportError('no vendor library')\n",
    )  # fmt: skip
    result = console("plugins", "--json", env=with_path(tmp_path))
    assert result.returncode == 0, result.stderr
    found = {e["entry_point"]: e for e in json.loads(result.stdout)["entry_points"]}
    assert (found["emptynpu"]["status"], found["emptynpu"]["detail"]) == (
        "registered nothing",
        "its hooks returned no records",
    )
    assert found["brokennpu"]["status"] == "broken"
    assert "failed to import: ImportError: no vendor library" in found["brokennpu"]["detail"]
    assert found["brokennpu"]["distribution"] == "npu-broken"
    table = console("plugins", env=with_path(tmp_path)).stdout
    broken = next(line for line in table.splitlines() if line.startswith("brokennpu "))
    assert broken.split()[1:3] == ["npu-broken", "broken"]


# Messages that help -----------------------------------------------------------------------


def test_vts_says_what_it_expected_beside_what_it_observed(tmp_path: Path) -> None:
    distribution(tmp_path, "npu-mutants", "mutants", "npu_mutants_plugin",
                 "from helpers.mutant_drivers import npumanager_register_drivers\n")  # fmt: skip
    driver = "mutant-all-on-device-zero-virtual"  # a 3-device driver reporting device 0 only
    result = console("vts", "--driver", driver, "--json", env=with_path(tmp_path, TESTS))
    assert result.returncode == 1, result.stdout + result.stderr
    rows = {row["test"]: row for row in json.loads(result.stdout)["results"]}
    failed = {test: row["detail"] for test, row in rows.items() if row["result"] == "FAIL"}
    assert list(failed) == ["test_DeviceNumberingMultiDevice"]
    detail = failed["test_DeviceNumberingMultiDevice"]
    assert "DeviceNumbering: expected each work's events to name the device it ran on" in detail
    assert "{1: 0, 2: 1, 3: 2}; got {1: 0, 2: 0, 3: 0}" in detail


# The README's promises ---------------------------------------------------------------------


def test_json_of_a_scenario_without_a_camera_has_no_camera_figures() -> None:
    result = console("simulate", "turn_taking", "--json")
    assert result.returncode == 0, result.stderr
    for mode, run in json.loads(result.stdout).items():
        assert [key for key in run if key.startswith("camera_")] == [], mode
