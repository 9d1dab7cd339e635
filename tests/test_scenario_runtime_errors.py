"""Errors while a scenario runs (not only when it loads) name the file and the key or app.

Each case goes through the real console script. The built-in drivers accept everything
a valid scenario asks, so the errors of a picky third-party driver (installed as a real
distribution: a dist-info folder with its entry point, on PYTHONPATH) stand for what a
vendor's board refuses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from npumanager.schemas.limits import MAX_DEVICES, MAX_HEAT_STEP_MC

PICKY = '''
from npumanager import (
    DriverCapability, DriverRecord, EngineDriver, IllegalArgumentError, ReferenceEngine, hookimpl,
)


class PickyDriver(EngineDriver):
    """A board of one device that takes job priorities up to 500 and small heat steps."""

    def __init__(self, devices=1, **options):
        count = devices if isinstance(devices, int) else len(devices)
        if count != 1:
            raise IllegalArgumentError(f"a Picky board has one device; asked for {count}")
        super().__init__(devices, **options)

    def _make_engine(self):
        return ReferenceEngine(self.specs, self.max_live_work, self.max_models)

    def submit(self, model, **kwargs):
        priority = kwargs.get("job_priority", 0)
        if priority > 500:
            raise IllegalArgumentError(f"job_priority must be 0..500 on Picky; got {priority}")
        return super().submit(model, **kwargs)

    def add_heat(self, device, millicelsius):
        if millicelsius > 50_000:
            raise IllegalArgumentError(f"Picky heat steps are at most 50000; got {millicelsius}")
        super().add_heat(device, millicelsius)


@hookimpl
def npumanager_register_drivers():
    caps = {"virtual_time", "preemption", "thermal_model"}
    return [DriverRecord(name="picky", factory=PickyDriver, capabilities=caps)]
'''

CAMERA = """
[[apps]]
name = "camera"
uid = 10001
model_bytes = 1000000
work = { kind = "periodic", cost_us = 500, period_ms = 10, job_priority = PRIORITY }
"""


@pytest.fixture(scope="module")
def picky_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the `npu-picky` distribution as pip would install it."""
    site = tmp_path_factory.mktemp("picky-site")
    (site / "npu_picky.py").write_text(PICKY)
    info = site / "npu_picky-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: npu-picky\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[npumanager]\npicky = npu_picky\n")
    return site


def npu(*argv: str, site: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The installed `npu-manager` console script, with `site` on the path if given."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    script = Path(sys.executable).with_name("npu-manager")
    return subprocess.run(
        [str(script), *argv], capture_output=True, text=True, env=env, check=False, timeout=120
    )


def on_picky(path: Path, mode: str, site: Path) -> subprocess.CompletedProcess[str]:
    """`npu-manager simulate PATH --driver picky --mode MODE`."""
    return npu("simulate", str(path), "--driver", "picky", "--mode", mode, site=site)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed run (exit 2, no traceback)."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def scenario(tmp_path: Path, head: str = "", *, priority: int = 0, tail: str = "") -> Path:
    path = tmp_path / "scenario.toml"
    body = CAMERA.replace("PRIORITY", str(priority))
    path.write_text(f'name = "s"\nduration_ms = 50\n{textwrap.dedent(head)}{body}{tail}')
    return path


def test_an_unknown_policy_names_the_file_and_key_before_any_run(tmp_path: Path) -> None:
    path = scenario(tmp_path, 'policy = "bogus"\n')
    line = one_line(npu("simulate", str(path)))
    assert line.startswith(f"npu-manager: error: {path}: policy: unknown policy 'bogus'; ")
    assert "; available: " in line
    assert "budget" in line


def test_policy_params_the_policy_refuses_name_the_file_and_key(tmp_path: Path) -> None:
    path = scenario(tmp_path, 'policy = "budget"\npolicy_params = { bogus = 1 }\n')
    line = one_line(npu("simulate", str(path)))
    assert f"{path}: policy_params: policy 'budget': unknown key 'bogus'. Allowed: weights" in line
    one_line(npu("demo", "--scenario", str(path)))


@pytest.mark.parametrize("mode", ["direct", "managed"])
def test_devices_the_driver_refuses_name_the_file_and_key(
    tmp_path: Path, picky_site: Path, mode: str
) -> None:
    path = scenario(tmp_path, "[[devices]]\n[[devices]]\n")
    line = one_line(on_picky(path, mode, picky_site))
    assert line == f"npu-manager: error: {path}: devices: a Picky board has one device; asked for 2"


@pytest.mark.parametrize("mode", ["direct", "managed"])
def test_work_the_driver_refuses_names_the_file_and_the_app(
    tmp_path: Path, picky_site: Path, mode: str
) -> None:
    path = scenario(tmp_path, priority=900)
    line = one_line(on_picky(path, mode, picky_site))
    assert line == (
        f"npu-manager: error: {path}: app 'camera': job_priority must be 0..500 on Picky; got 900"
    )


@pytest.mark.parametrize("mode", ["direct", "managed"])
def test_an_event_the_driver_refuses_names_the_file_and_the_event(
    tmp_path: Path, picky_site: Path, mode: str
) -> None:
    heat = '\n[[events]]\nat_ms = 5\nkind = "memory_pressure"\nlevel = 1\n'
    heat += '\n[[events]]\nat_ms = 7\nkind = "heat"\nmillicelsius = 90000\n'
    path = scenario(tmp_path, tail=heat)
    line = one_line(on_picky(path, mode, picky_site))
    assert line == (
        f"npu-manager: error: {path}: events.1 (heat at 7 ms): Picky heat steps are at most "
        "50000; got 90000"
    )


def test_the_drivers_limits_of_heat_and_devices_are_refused_when_the_file_loads(
    tmp_path: Path,
) -> None:
    heat = f'\n[[events]]\nat_ms = 5\nkind = "heat"\nmillicelsius = {MAX_HEAT_STEP_MC + 1}\n'
    path = scenario(tmp_path, tail=heat)
    line = one_line(npu("simulate", str(path)))
    assert f"{path}: events.0.millicelsius: Input should be less than or equal to" in line
    path = scenario(tmp_path, "[[devices]]\n" * (MAX_DEVICES + 1))
    line = one_line(npu("simulate", str(path)))
    assert f"{path}: devices: List should have at most {MAX_DEVICES} items" in line
