"""`npu-manager health` and `serve --health`: readings, severities, and one-line mistakes."""

from __future__ import annotations

import argparse
import io
import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import health_trees as tree
from helpers.daemon_support import WAIT_S
from npumanager.cli.program import main
from npumanager.cli.serve import health_specs
from npumanager.core.plugins.registry import load_plugins

REAL_PSI = Path("/proc/pressure/memory")


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def fake(root: Path) -> str:
    return f"linux:root={root},triggers=off"


def test_health_json_reports_levels_and_severities_of_a_fake_tree(tmp_path: Path) -> None:
    tree.memory(tmp_path, 12.5, full=3.0)
    tree.zone(tmp_path, 0, "x86_pkg_temp", 96_000, tree.SOC_TRIPS)
    tree.accel(tmp_path, 0, busy_us=9, memory=10, freq=700, max_freq=1400)
    code, out, err = run("health", "--source", fake(tmp_path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["memory_pressure"] == 1 and doc["severity"] == {"0": "SEVERE"}
    (source,) = doc["sources"]
    assert source["name"] == "linux" and source["error"] is None
    assert source["memory"][0]["some_avg10"] == 12.5
    assert source["thermal"][0] == {
        "name": "thermal_zone0:x86_pkg_temp",
        "device": None,
        "temperature_mc": 96_000,
        "severity": "SEVERE",
    }
    assert source["devices"][0]["frequency_mhz"] == 700


def test_health_text(tmp_path: Path) -> None:
    tree.memory(tmp_path, 45.0)
    tree.zone(tmp_path, 3, "soc", 81_000, tree.SOC_TRIPS)
    code, out, _ = run("health", "--source", fake(tmp_path) + ",zones=1:soc")
    assert code == 0
    assert "memory system: critical (2); some avg10 45.00%, full avg10 0.00%, no triggers" in out
    assert "thermal_zone3:soc  1       81.0    MODERATE" in out
    assert out.rstrip().endswith(
        "memory pressure: critical (2); thermal: device 0: unknown, device 1: MODERATE"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("linux:colour=red", "unknown option 'colour'; allowed: root, interval_ms,"),
        ("linux:interval_ms=0", "interval_ms: Input should be greater than or equal to 10"),
        ("linux:zones", "options are KEY=VALUE separated by commas; got 'zones'"),
        ("linux:root=/,root=/tmp", "option 'root' given twice"),
        (":root=/", "name a health source first"),
        ("thermometer", "unknown health_source 'thermometer'; available: linux"),
    ],
)
def test_every_mistake_is_one_line_and_exit_2(spec: str, message: str) -> None:
    code, out, err = run("health", "--source", spec)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.skipif(not REAL_PSI.exists(), reason="this kernel has no PSI")
def test_health_json_reports_this_machines_real_psi() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "npumanager", "health", "--json"],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=True,
    )
    doc = json.loads(done.stdout)
    system = next(m for m in doc["sources"][0]["memory"] if m["name"] == "system")
    assert system["path"] == "/proc/pressure/memory"
    assert 0 <= system["some_avg10"] <= 100 and system["full_avg10"] is not None
    assert system["level"] in (0, 1, 2)


def test_watch_prints_each_new_reading_until_interrupted(tmp_path: Path) -> None:
    tree.zone(tmp_path, 0, "soc", 40_000, tree.SOC_TRIPS)
    spec = fake(tmp_path) + ",interval_ms=20"
    process = subprocess.Popen(
        [sys.executable, "-m", "npumanager", "health", "--source", spec, "--json", "--watch"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    try:
        assert json.loads(process.stdout.readline())["severity"] == {"0": "NONE"}
        tree.heat(tmp_path, 0, 106_000)
        for line in process.stdout:
            if json.loads(line)["severity"] == {"0": "CRITICAL"}:
                break
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=WAIT_S)  # reading on: a full pipe would block its writes
        assert process.returncode == 0
    finally:
        process.kill()
        process.wait()


def test_a_third_party_source_through_the_cli(plugin_site: Callable[..., Path]) -> None:
    plugin_site("thermometer")
    code, out, _ = run("health", "--source", "thermometer:temp_mc=90000", "--json")
    assert code == 0
    assert json.loads(out)["severity"] == {"0": "MODERATE"}
    code, out, _ = run("health", "--source", "thermometer:temp_mc=-1", "--json")
    assert code == 1
    assert json.loads(out)["sources"][0]["error"] == "RuntimeError: probe unplugged"
    code, out, err = run("health", "--source", "thermometer:temp_mc=warm")
    (error,) = [line for line in err.splitlines() if "error:" in line]
    assert (code, out) == (2, "")
    assert "health source 'thermometer' did not start: ValueError: invalid literal" in error


class _Ctx:
    def __init__(self, driver: str, health: list[str]) -> None:
        self.args = argparse.Namespace(driver=driver, health=health)
        self.registry = load_plugins()
        self.out = self.err = io.StringIO()


def test_serve_reads_linux_by_default_for_a_real_driver_only() -> None:
    assert health_specs(_Ctx("vnpu", [])) == []
    expected: list[tuple[str, dict[str, Any]]] = (
        [("linux", {})] if sys.platform.startswith("linux") else []
    )
    assert health_specs(_Ctx("onnxruntime", [])) == expected
    assert health_specs(_Ctx("onnxruntime", ["none"])) == []
    assert health_specs(_Ctx("vnpu", ["linux:interval_ms=50", "linux:zones=gpu"])) == [
        ("linux", {"interval_ms": 50}),
        ("linux", {"zones": "gpu"}),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--health", "linux:bogus=1"], "unknown option 'bogus'"),
        (["--health", "none", "--health", "linux"], "--health none turns health sources off"),
    ],
)
def test_serve_rejects_a_bad_health_source_in_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "npumanager", "serve", "--socket", str(tmp_path / "s"), *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert done.returncode == 2
    errors = [ln for ln in done.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and message in errors[0], done.stderr
