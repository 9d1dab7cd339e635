"""`npu-manager run` and `python -m npumanager.run` as a user meets them: mistakes are one
line, the hook reaches the runtimes and nothing else, chains to the environment's own
`sitecustomize`, and with no daemon the program runs unmanaged (or is refused)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers.console import npu, one_line_error
from helpers.run_support import ORT_APP, all_lines, managed_command, python, without_hook

pytest.importorskip("onnxruntime")
PROBE = (
    "import sys, json, numpy\n"
    "print('numpy_loader', type(numpy.__spec__.loader).__name__)\n"
    "print('runtime_imported', 'onnxruntime' in sys.modules)\n"
    "import onnxruntime\n"
    "print('managed', getattr(onnxruntime, '__npu_manager_managed__', False))\n"
)


def test_no_command_is_one_line() -> None:
    one_line_error(npu("run"), "needs a command")
    one_line_error(npu("run", "--"), "needs a command")


def test_a_command_not_found_is_one_line() -> None:
    one_line_error(npu("run", "--", "no-such-command-npu-run"), "command not found")


def test_a_bad_timeout_is_one_line() -> None:
    one_line_error(npu("run", "--timeout", "0", "--", "true"), "timeout")


def test_python_m_without_a_program_is_usage() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "npumanager.run"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2 and "usage" in done.stderr and "Traceback" not in done.stderr


def test_only_the_runtimes_are_reached(tmp_path: Path) -> None:
    missing = tmp_path / "none.sock"
    lines = all_lines(managed_command(missing, sys.executable, "-c", PROBE))
    assert lines == ["numpy_loader SourceFileLoader", "runtime_imported False", "managed True"]
    hinted = managed_command(
        missing, sys.executable, "-c", PROBE, options=("--driver-hint", "openvino")
    )
    assert all_lines(hinted)[-1] == "managed False"
    assert all_lines(python("-c", PROBE), env=without_hook())[-1] == "managed False"


def test_the_environments_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("print('their sitecustomize ran')\n")
    env = {**without_hook(), "PYTHONPATH": str(theirs)}
    command = managed_command(tmp_path / "none.sock", sys.executable, "-c", PROBE)
    assert all_lines(command, env=env)[0] == "their sitecustomize ran"
    assert all_lines(command, env=env)[-1] == "managed True"


def test_no_daemon_runs_unmanaged_with_one_warning(model_file: Path, tmp_path: Path) -> None:
    command = managed_command(tmp_path / "none.sock", *python(ORT_APP, "threads", model_file))
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["threads 4 runs 100 wrong 0"]
    warnings = done.stderr.splitlines()
    assert len(warnings) == 1 and "no daemon answers" in warnings[0], done.stderr


def test_no_daemon_refused_raises_the_runtimes_error(model_file: Path, tmp_path: Path) -> None:
    command = managed_command(
        tmp_path / "none.sock",
        *python(ORT_APP, "refused", model_file),
        options=("--no-daemon", "refuse"),
    )
    lines = all_lines(command)
    assert lines[0] == "refused onnxruntime.capi.onnxruntime_pybind11_state Fail"
    assert "no npu-manager daemon answers" in lines[1]


def test_python_m_runs_the_program_managed(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {**without_hook(), "NPUMANAGER_SOCKET": str(tmp_path / "none.sock")}
    lines = all_lines([sys.executable, "-m", "npumanager.run", str(script)], env=env)
    assert lines[-1] == "managed True"


def test_the_managed_modules_import_no_runtime_and_openvino_is_managed_after_them(
    tmp_path: Path,
) -> None:
    """A program may import every module of `npumanager.run` before any runtime (as
    benchmarks/unmodified.py does, before it drops its uid): none of them imports a
    runtime, and OpenVINO imported afterwards is still managed, with no warning."""
    pytest.importorskip("openvino")
    probe = (
        "import sys, pkgutil, npumanager.run\n"
        "for m in pkgutil.walk_packages(npumanager.run.__path__, 'npumanager.run.'):\n"
        "    if '_boot' not in m.name and not m.name.endswith('__main__'):\n"
        "        __import__(m.name)\n"
        "print('runtimes_imported', 'openvino' in sys.modules or 'onnxruntime' in sys.modules)\n"
        "import openvino\n"
        "print('managed', getattr(openvino, '__npu_manager_managed__', False))\n"
    )
    command = managed_command(tmp_path / "none.sock", sys.executable, "-c", probe)
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["runtimes_imported False", "managed True"]
    assert "warning" not in done.stderr, done.stderr
