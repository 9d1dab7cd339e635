"""`npu-manager demo`: the managed run fixes what the direct run shows, on both drivers."""

from __future__ import annotations

import io
import json

import pytest

from npumanager.cli.program import main


@pytest.fixture(scope="module", params=["vnpu", "reference"])
def demo(request: pytest.FixtureRequest) -> dict[str, dict[str, object]]:
    out = io.StringIO()
    assert main(["demo", "--json", "--driver", request.param], out=out, err=io.StringIO()) == 0
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


KEYS = {
    "camera_frames",
    "camera_deadline_misses",
    "camera_p99_ms",
    "background_jobs_done",
    "overcommit_events",
    "peak_weight_memory_bytes",
    "weight_memory_capacity_bytes",
    "peak_temperature_c",
    "throttled_ms",
    "unload_requests",
}


def test_both_runs_report_every_metric(demo: dict[str, dict[str, object]]) -> None:
    assert set(demo) == {"direct", "managed"}
    assert set(demo["direct"]) >= KEYS and set(demo["managed"]) >= KEYS


def test_direct_shows_the_problems(demo: dict[str, dict[str, object]]) -> None:
    direct = demo["direct"]
    assert direct["camera_deadline_misses"] > 0  # type: ignore[operator]
    assert direct["overcommit_events"] > 0  # type: ignore[operator]
    assert direct["unload_requests"] == {}


def test_managed_meets_the_targets(demo: dict[str, dict[str, object]]) -> None:
    direct, managed = demo["direct"], demo["managed"]
    assert managed["camera_frames"] == direct["camera_frames"]
    assert managed["camera_deadline_misses"] == 0
    assert managed["overcommit_events"] == 0
    assert 2 * managed["background_jobs_done"] >= direct["background_jobs_done"]  # type: ignore[operator]
    assert managed["peak_weight_memory_bytes"] <= managed["weight_memory_capacity_bytes"]  # type: ignore[operator]
    assert managed["peak_temperature_c"] < direct["peak_temperature_c"]  # type: ignore[operator]
    reasons = managed["unload_requests"]
    assert isinstance(reasons, dict) and reasons and all(count > 0 for count in reasons.values())


def test_the_table_is_side_by_side() -> None:
    out = io.StringIO()
    assert main(["demo", "--driver", "reference"], out=out, err=io.StringIO()) == 0
    lines = out.getvalue().splitlines()
    header = next(line for line in lines if "DIRECT" in line)
    assert header.split() == ["DIRECT", "MANAGED"]
    assert any(line.startswith("camera deadline misses") for line in lines)


def test_a_bad_scenario_file_is_one_line(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "s.toml"
    path.write_text('name = "x"\nduration_ms = -5\n')
    err = io.StringIO()
    assert main(["demo", "--scenario", str(path)], out=io.StringIO(), err=err) == 2
    assert err.getvalue().startswith(f"npu-manager: error: {path}: ")
    assert err.getvalue().count("\n") == 1
