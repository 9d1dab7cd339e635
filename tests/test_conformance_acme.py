"""The example third-party driver, `examples/acme-npu`, installed for real and run through
the suite, the plugin list and `npu-manager vts`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npumanager.testing.rules import RULES

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "acme-npu"
CLI = "from npumanager.cli.program import entry; entry()"


@pytest.fixture(scope="module")
def acme_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where the acme-npu distribution is installed (pip --target)."""
    root = tmp_path_factory.mktemp("acme")
    project = root / "acme-npu"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = root / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(project),
        ],
        check=True,
    )
    return target


def run(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, check=False
    )


def test_acme_is_listed_as_a_plugin(acme_site: Path) -> None:
    proc = run(acme_site, "-c", CLI, "plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    drivers = {
        row["name"]: row for row in json.loads(proc.stdout)["plugins"] if row["kind"] == "driver"
    }
    assert drivers["acme"]["distribution"] == "acme-npu", drivers
    assert not drivers["acme"]["builtin"]


def test_vts_passes_on_acme(acme_site: Path) -> None:
    proc = run(acme_site, "-c", CLI, "vts", "--driver", "acme", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    outcomes = {row["test"]: (row["result"], row["detail"]) for row in report["results"]}
    assert outcomes["test_DeviceNumberingMultiDevice"] == (
        "SKIP",
        "driver does not claim multi_device",
    )
    assert outcomes["test_MatchesReferenceDevice"][0] == "PASS"
    assert report["failed"] == 0


def test_acme_s_own_test_file_runs_the_suite(acme_site: Path) -> None:
    proc = run(acme_site, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(RULES) - 2} passed, 2 skipped" in proc.stdout  # multi_device, restart
