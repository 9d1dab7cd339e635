"""What the README, the guides and pyproject promise a new user, checked against what they get."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

import npumanager as npu
from npumanager.core.plugins.hookspecs import hookimpl
from npumanager.core.plugins.registry import PluginSource, load_plugins
from npumanager.schemas import DriverRecord
from npumanager.schemas.limits import MAX_SCENARIO_APP_MS, MAX_SCENARIO_APPS, MAX_SCENARIO_JOBS
from npumanager.simulation.scenario import App, Event, Scenario, Work

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
INTEGRATORS = (ROOT / "docs" / "guides" / "integrators.md").read_text(encoding="utf-8")
"""The system integrators' guide: telemetry sinks, scenario files, health intervals."""


def quickstart() -> list[str]:
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```sh\n(.*?)^```", section, re.MULTILINE | re.DOTALL)


def test_block_two_activates_the_environment_and_installs_npu_manager_before_acme() -> None:
    lines = quickstart()[1].splitlines()
    assert lines[0] == ". .venv/bin/activate", "block 2 works in a new shell"
    installs = [line for line in lines if line.startswith("pip install")]
    assert len(installs) == 2, "one pip command each, so an old pip resolves acme's dependency"
    assert "./examples/acme-npu" in installs[1] and "acme" not in installs[0]


def test_ci_runs_each_block_in_a_shell_of_its_own_without_the_callers_environment() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.count("fresh_shell") >= 3
    assert "-u VIRTUAL_ENV" in ci and "-u PYTHONPATH" in ci


def test_pyproject_license_is_an_spdx_string_without_the_classifier() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]


def test_the_telemetry_snippet_writes_trace_json_on_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = re.search(r"## Telemetry sinks.*?```python\n(.*?)```", INTEGRATORS, re.DOTALL)
    assert block is not None
    kept = [
        line
        for line in block.group(1).splitlines()
        if "prometheus" not in line and "my_sink" not in line and "close()" not in line
    ]
    assert any("close()" in line for line in block.group(1).splitlines()), "the snippet shows it"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"npu": npu}
    exec("\n".join(kept), namespace)
    assert not (tmp_path / "trace.json").exists(), "nothing until close, as documented"
    namespace["service"].close()  # type: ignore[attr-defined]
    assert json.loads((tmp_path / "trace.json").read_text())
    assert "writes it on close" in INTEGRATORS


def test_the_scenario_table_names_every_key_and_the_budget() -> None:
    section = INTEGRATORS.split("## Scenario files", 1)[1].split("## Configuration", 1)[0]
    keys = {*Scenario.model_fields, *App.model_fields, *Work.model_fields, *Event.model_fields}
    missing = [key for key in keys if f"`{key}`" not in section]
    assert missing == []
    for limit in (MAX_SCENARIO_APPS, MAX_SCENARIO_APP_MS, MAX_SCENARIO_JOBS):
        assert f"{limit:,}" in section


def play_json(*argv: str) -> dict[str, dict[str, object]]:
    """The `--json` document of a demo or simulate command line."""
    command = [sys.executable, "-m", "npumanager", *argv, "--json"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    document: dict[str, dict[str, object]] = json.loads(out)
    return document


def test_json_of_a_scenario_without_a_camera_has_no_camera_figures() -> None:
    for run in play_json("simulate", "turn_taking").values():
        assert not [key for key in run if key.startswith("camera_")]
    assert "camera_frames" in play_json("demo")["managed"]


def test_the_health_interval_is_documented_with_its_defaults() -> None:
    from npumanager.schemas.limits import DEFAULT_HEALTH_INTERVAL_MS, HEALTH_SAMPLE_INTERVAL_MS

    assert "--health-interval-ms" in INTEGRATORS
    assert f"by default {DEFAULT_HEALTH_INTERVAL_MS} in real time" in INTEGRATORS
    assert f"{HEALTH_SAMPLE_INTERVAL_MS} in virtual time" in INTEGRATORS


def test_contributing_gives_the_registration_hooks_return_values_as_they_are() -> None:
    from npumanager.core.plugins import hookspecs

    guide = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert "a single record, or `None`" in guide
    assert "npumanager_unavailable" in guide and hasattr(hookspecs, "npumanager_unavailable")


def test_the_contributing_guide_and_the_drivers_guide_give_one_driver_factory_signature() -> None:
    """Both say how the service calls a driver's factory, and say it the same way as the
    service does it: `devices` first (positionally), then the user's options."""
    pattern = re.compile(r"A record has a name, a factory \(`(factory\([^`]*\))`")
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    drivers = (ROOT / "docs" / "guides" / "drivers.md").read_text(encoding="utf-8")
    said = [pattern.findall(" ".join(text.split())) for text in (contributing, drivers)]
    assert said == [["factory(devices, **options)"]] * 2, said

    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    registry = load_plugins()
    vnpu = registry.driver("vnpu")

    def factory(*args: Any, **options: Any) -> Any:
        calls.append((args, options))
        return vnpu.factory(*args, **options)

    class Probe:
        @hookimpl
        def npumanager_register_drivers(self) -> DriverRecord:
            return DriverRecord(name="probe", factory=factory, capabilities=vnpu.capabilities)

    assert registry.register(Probe(), PluginSource("probe", "npu-probe", "0"))
    options = {"max_models": 64}
    npu.Service("probe", "status_quo", devices=2, driver_options=options, registry=registry).close()
    assert calls == [((2,), {**options, "clock": "real"})], "devices first, then options by name"
