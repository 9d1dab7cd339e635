"""Rough edges of the tools a new user meets (`demo`, `vts`, `simulate --driver`, `health`),
through the real console script: a mistake is one line on stderr and exit 2, never a
traceback, and what the tools print says what they did."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.unavailable import without, write_blocker

CONSOLE_SCRIPT = str(Path(sys.executable).with_name("npu-manager"))
"""The installed `npu-manager` command, as a user runs it."""

BROKEN_ZETA = 'raise ImportError("libzeta.so.1: cannot open shared object file")\n'
"""A vendor plugin whose import fails on a machine without the vendor's library."""

TRIO = '''
from npumanager import DeviceSpec, DriverRecord, EngineDriver, ReferenceEngine, hookimpl

TRIO_BOARD = DeviceSpec(channels=3, weight_memory_bytes=1 << 30, clock_mhz=1000)


class TrioDriver(EngineDriver):
    """A board of one device with three channels and 1 GiB of weight memory."""

    def __init__(self, devices=(TRIO_BOARD,), **options):
        super().__init__([TRIO_BOARD] if isinstance(devices, int) else devices, **options)

    def _make_engine(self):
        return ReferenceEngine(self.specs, self.max_live_work, self.max_models)


@hookimpl
def npumanager_register_drivers():
    caps = {"virtual_time", "preemption", "thermal_model", "fair_share"}
    return [DriverRecord(name="trio", factory=TrioDriver, capabilities=caps)]
'''
"""A third-party driver whose own device differs from the default one."""


def npu(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`npu-manager ARGV` as a user runs it."""
    return subprocess.run(
        [CONSOLE_SCRIPT, *argv],
        capture_output=True,
        text=True,
        env=env if env is not None else dict(os.environ),
        check=False,
        timeout=timeout,
    )


def one_line_error(result: subprocess.CompletedProcess[str], *parts: str) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def with_path(*folders: Path, **variables: str) -> dict[str, str]:
    """This environment with `folders` first on PYTHONPATH and `variables` set."""
    env = dict(os.environ, **variables)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*map(str, folders), env.get("PYTHONPATH")]))
    return env


def distribution(site: Path, name: str, entry_point: str, source: str) -> Path:
    """`site` holding a one-module distribution `name` as pip would install it."""
    module = name.replace("-", "_")
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[npumanager]\n{entry_point} = {module}\n")
    return site


@pytest.fixture(scope="module")
def blocker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_blocker(tmp_path_factory.mktemp("blocker"))


# demo ------------------------------------------------------------------------------------


def test_demo_real_without_a_runtime_names_the_extras(blocker: Path) -> None:
    result = npu("demo", "--real", env=without(blocker, "onnxruntime", "openvino"))
    one_line_error(
        result,
        "demo --real needs a real driver",
        "pip install 'npu-manager[onnxruntime]'",
        "pip install 'npu-manager[openvino]'",
    )


@pytest.mark.parametrize("driver", ["vnpu", "acme", "reference"])
def test_demo_real_on_a_driver_without_real_models_is_refused_naming_those_that_can(
    driver: str,
) -> None:
    if driver == "acme" and "acme" not in npu("plugins").stdout:
        pytest.skip("the acme example is not installed")
    one_line_error(
        npu("demo", "--real", "--driver", driver),
        f"driver {driver!r} runs no real models",
        "demo --real runs on openvino or onnxruntime",
    )


def test_demo_seconds_without_real_is_refused() -> None:
    one_line_error(npu("demo", "--seconds", "2"), "--seconds applies to demo --real only")
    assert "--real only" in npu("demo", "--help").stdout


@pytest.mark.parametrize("seconds", ["0", "-1", "601", "nan"])
def test_demo_seconds_out_of_range_states_what_is_accepted(seconds: str) -> None:
    one_line_error(
        npu("demo", "--real", "--seconds", seconds),
        "--seconds must be more than 0 and at most 600",
        f"got {seconds}",
    )


def test_demo_real_refuses_the_pictures_it_does_not_draw(tmp_path: Path) -> None:
    for option in ("--plot", "--trace"):
        one_line_error(
            npu("demo", "--real", option, str(tmp_path / "x.png")),
            f"{option} draws the simulated runs; demo --real does not take it",
        )
    assert not (tmp_path / "x.png").exists()


# vts -------------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["pytest", "hypothesis"])
def test_vts_without_the_test_extra_names_it(blocker: Path, missing: str) -> None:
    result = npu("vts", "--driver", "vnpu", env=without(blocker, missing))
    line = one_line_error(
        result, f"vts runs the conformance suite with {missing}", "pip install 'npu-manager[test]'"
    )
    assert "FAIL" not in result.stdout + line and result.stdout == ""


def test_vts_on_a_driver_whose_plugin_failed_names_the_reason(tmp_path: Path) -> None:
    site = distribution(tmp_path / "site", "npu-zeta", "zeta", BROKEN_ZETA)
    result = npu("vts", "--driver", "zeta", env=with_path(site))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error = result.stderr.splitlines()[-1]
    assert error.startswith("npu-manager: error: unknown driver 'zeta': ")
    assert "plugin 'zeta' from distribution npu-zeta 1.0 did not load: failed to import:" in error
    assert "ImportError: libzeta.so.1: cannot open shared object file" in error
