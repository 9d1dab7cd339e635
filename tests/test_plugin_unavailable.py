"""`npu-manager plugins` on a machine where a runtime cannot be imported: the real console
script, in a process whose `import openvino` (or `onnxruntime`) fails as if not installed.

The blocker is `helpers.unavailable`'s `sitecustomize` on PYTHONPATH, refusing the named
top-level packages with `ModuleNotFoundError` as if they were not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.unavailable import without, write_blocker

EXTRA = {"openvino": "openvino", "onnxruntime": "onnxruntime"}
"""The driver of each runtime package and the extra that brings it."""


@pytest.fixture(scope="module")
def blocker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_blocker(tmp_path_factory.mktemp("blocker"))


def run(
    argv: list[str], blocker: Path, blocked: str, *, python: bool = False
) -> subprocess.CompletedProcess[str]:
    """The console script (or, `python=True`, this Python) with `blocked` not importable."""
    env = without(blocker, blocked)
    command = [sys.executable] if python else [str(Path(sys.executable).with_name("npu-manager"))]
    return subprocess.run(
        [*command, *argv], capture_output=True, text=True, env=env, check=False, timeout=120
    )


@pytest.mark.parametrize("package", sorted(EXTRA))
def test_the_blocker_makes_the_import_fail_as_if_not_installed(blocker: Path, package: str) -> None:
    result = run(["-c", f"import {package}"], blocker, package, python=True)
    assert result.returncode == 1
    assert f"ModuleNotFoundError: No module named '{package}'" in result.stderr


@pytest.mark.parametrize("package", sorted(EXTRA))
def test_plugins_reports_the_driver_unavailable_naming_the_extra(
    blocker: Path, package: str
) -> None:
    hint = f"pip install 'npu-manager[{EXTRA[package]}]'"
    result = run(["plugins", "--json"], blocker, package)
    assert result.returncode == 0, result.stderr
    found = {e["entry_point"]: e for e in json.loads(result.stdout)["entry_points"]}
    assert found[package]["status"] == "unavailable"
    assert found[package]["detail"] == f"driver {package} ({hint})"
    assert package not in {d["name"] for d in json.loads(result.stdout)["plugins"]}
    assert found["vnpu"]["status"] == "loaded"
    others = set(EXTRA) - {package}
    assert all(found[other]["status"] != "unavailable" for other in others)

    table = run(["plugins"], blocker, package)
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith(f"{package} "))
    assert row.split()[2] == "unavailable"
    assert row.endswith(f"driver {package} ({hint})")


COMMANDS = [["simulate", "demo"], ["demo", "--real"], ["vts"]]
"""Commands that take `--driver`, each asked for the blocked runtime's driver."""


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] + "".join(c[1:]) for c in COMMANDS])
@pytest.mark.parametrize("package", sorted(EXTRA))
def test_a_command_asking_for_the_driver_names_the_extra(
    blocker: Path, package: str, command: list[str]
) -> None:
    result = run([*command, "--driver", package], blocker, package)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"npu-manager: error: driver {package!r} is not available here: "
        f"pip install 'npu-manager[{EXTRA[package]}]'; available: "
    )
