"""Scenario files: validation with clear errors, and the direct run's measurements."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from npumanager import ConfigError, Importance, ModelPriority, ModelSize
from npumanager.simulation.runner import run_direct
from npumanager.simulation.scenario import load_scenario, parse_scenario

DEMO = Path(str(resources.files("npumanager") / "scenarios" / "demo.toml"))


def minimal(**overrides: object) -> dict[str, object]:
    data: dict[str, object] = {
        "name": "t",
        "duration_ms": 100,
        "apps": [
            {
                "name": "cam",
                "uid": 1,
                "model_bytes": 1000,
                "work": {"kind": "periodic", "period_ms": 10, "cost_us": 1000, "deadline_ms": 10},
                "role": "camera",
            }
        ],
    }
    data.update(overrides)
    return data


def test_the_shipped_demo_scenario_is_valid() -> None:
    scenario = load_scenario(DEMO)
    assert {app.role for app in scenario.apps} == {"camera", "assistant", "background", "indexer"}
    llm = scenario.app("llm")
    assert llm.size_class == ModelSize.GREATER_THAN_2G
    assert scenario.app("indexer").priority == ModelPriority.OPPORTUNISTIC
    assert scenario.app("assistant").importance == Importance.CACHED
    assert [e.kind for e in scenario.events] == ["importance", "heat"]


def test_names_map_to_enums_and_sizes_derive_from_bytes() -> None:
    scenario = parse_scenario(minimal())
    app = scenario.apps[0]
    assert app.importance == Importance.FOREGROUND
    assert app.size_class == ModelSize.LESS_THAN_1GB


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"duration_ms": 0}, "duration_ms"),
        ({"apps": []}, "apps"),
        ({"surprise": 1}, "surprise: unknown key; allowed: name, description, duration_ms"),
        (
            {"events": [{"at_ms": 1, "kind": "importance", "app": "nope", "importance": "CACHED"}]},
            "unknown app 'nope'",
        ),
        (
            {"events": [{"at_ms": 1, "kind": "importance", "app": "cam"}]},
            "needs 'app' and 'importance'",
        ),
        ({"events": [{"at_ms": 1, "kind": "heat", "device": 3}]}, "unknown device 3"),
        ({"devices": [{"chanels": 2}]}, r"devices\.0\.chanels: unknown key; allowed: channels,"),
    ],
)
def test_bad_scenarios_name_the_key(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_scenario(minimal(**change))


def test_bad_enum_name_lists_what_is_allowed() -> None:
    data = minimal()
    data["apps"][0]["importance"] = "SOMETIMES"  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"apps\.0\.importance: .*must be one of FOREGROUND"):
        parse_scenario(data)


def test_bad_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("name = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_scenario(path)
    with pytest.raises(ConfigError, match="absent.toml: no such file"):
        load_scenario(tmp_path / "absent.toml")


def test_direct_run_shows_the_problems_the_manager_solves() -> None:
    result = run_direct(load_scenario(DEMO), "reference")
    metrics = result.metrics
    assert metrics.camera_frames == len(range(0, 6000, 33))
    assert metrics.camera_deadline_misses > 0, "FIFO behind long background jobs"
    assert metrics.overcommit_events > 0, "the assistant's model does not fit"
    assert metrics.peak_weight_memory_bytes <= metrics.weight_memory_capacity_bytes
    assert metrics.background_jobs_done > 0
    assert metrics.throttled_ms > 0
    assert metrics.unload_requests == {}
    assert len(result.samples) == 6000


def test_an_app_can_stop_and_name_its_device() -> None:
    app = minimal()["apps"][0]  # type: ignore[index]
    parse_scenario(minimal(apps=[{**app, "start_ms": 10, "stop_ms": 50}]))
    with pytest.raises(ConfigError, match=r"stop_ms \(10\) must be after start_ms \(10\)"):
        parse_scenario(minimal(apps=[{**app, "start_ms": 10, "stop_ms": 10}]))
    with pytest.raises(ConfigError, match="app 'cam' names unknown device 1"):
        parse_scenario(minimal(apps=[{**app, "device": 1}]))


def test_an_app_that_stops_gives_its_model_back_in_both_runs() -> None:
    from npumanager.simulation.runner import run_managed

    app = {**minimal()["apps"][0], "work": {"kind": "loop", "cost_us": 1000}}  # type: ignore[index]
    scenario = parse_scenario(minimal(apps=[{**app, "stop_ms": 40}], duration_ms=100))
    for result in (run_direct(scenario, "reference"), run_managed(scenario, "reference")):
        memory = [s.weight_memory_used_bytes for s in result.samples]
        assert memory[30] == 1000 and memory[60] == 0, result.mode
        done = result.metrics.jobs_done["cam"]
        assert 30 <= done <= 40, result.mode
