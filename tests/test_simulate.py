"""`npu-manager simulate` and the demo's trace and picture, through the real command line."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from npumanager.cli.program import main


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Path]:
    folder = tmp_path_factory.mktemp("demo")
    trace, plot = folder / "demo.json", folder / "demo.png"
    code, out, err = run("demo", "--json", "--trace", str(trace), "--plot", str(plot))
    assert code == 0, err
    return json.loads(out), trace, plot


def test_the_demo_trace_holds_both_runs_apart(demo_files: tuple[Any, Path, Path]) -> None:
    metrics, trace, _ = demo_files
    document = json.loads(trace.read_text())
    events = document["traceEvents"]
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert set(processes.values()) == {
        "direct: npu0",
        "direct: model loads",
        "managed: npu0",
        "managed: model loads",
    }
    by_run: dict[str, list[dict[str, Any]]] = {"direct": [], "managed": []}
    for e in events:
        if e["ph"] != "M":
            by_run[processes[e["pid"]].split(":")[0]].append(e)
    for mode, mine in by_run.items():
        phases = {e["ph"] for e in mine}
        assert phases == {"X", "C", "i"}, mode
        slices = [e for e in mine if e["ph"] == "X"]
        apps = {"camera", "assistant", "llm", "indexer"}
        # Direct, the assistant's model never fits, so it never runs.
        assert {e["name"] for e in slices} == (apps - {"assistant"} if mode == "direct" else apps)
        assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
        assert {e["tid"] for e in slices} == {1, 2, 3, 4}, "four channel lanes"
    managed_instants = [e["name"] for e in by_run["managed"] if e["ph"] == "i"]
    unloads = sum(metrics["managed"]["unload_requests"].values())
    assert sum(n.startswith("UNLOAD_REQUESTED (") for n in managed_instants) == unloads
    assert "UNLOAD_REQUESTED (THERMAL)" in managed_instants
    assert any(n.startswith("thermal ") for n in managed_instants)
    camera_frames = sum(1 for e in by_run["managed"] if e["ph"] == "X" and e["name"] == "camera")
    assert camera_frames >= metrics["managed"]["camera_frames"]


def test_the_demo_picture_is_a_png_of_sensible_size_and_not_blank(
    demo_files: tuple[Any, Path, Path],
) -> None:
    from PIL import Image

    _, _, plot = demo_files
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(plot) as image:
        width, height = image.size
        assert 1000 <= width <= 2000 and 700 <= height <= 1400
        pixels = list(image.convert("RGB").resize((260, 170)).get_flattened_data())
        colours = set(pixels)
        inked = sum(1 for p in pixels if p != (255, 255, 255))
    assert len(colours) > 50, "bars in several app colours, curves, text"
    assert inked > 0.15 * 260 * 170


def test_the_shipped_scenarios_are_listed_and_found_by_name() -> None:
    code, out, _ = run("simulate", "--list", "--json")
    assert code == 0
    listed = {row["name"]: row for row in json.loads(out)}
    assert set(listed) >= {"demo", "turn_taking", "thermal_stress"}
    assert listed["turn_taking"]["policy"] == "turn_taking"
    code, out, _ = run("simulate", "--list")
    assert code == 0 and out.splitlines()[0].split() == [
        "NAME",
        "POLICY",
        "DURATION",
        "DESCRIPTION",
    ]


def test_turn_taking_gives_each_foreground_app_its_turn() -> None:
    code, out, err = run("simulate", "turn_taking", "--json", "--progress", "never")
    assert code == 0 and err == ""
    direct, managed = json.loads(out).values()
    assert direct["overcommit_events"] > 0 and managed["overcommit_events"] == 0
    assert direct["assistant_jobs_done"] == 0 < managed["assistant_jobs_done"]
    assert managed["jobs_done"]["photos"] > 0 == direct["jobs_done"]["photos"]
    assert managed["unload_requests"] and managed["jobs_done"]["llm"] > 0


def test_thermal_stress_keeps_the_camera_and_the_device_cooler() -> None:
    code, out, _ = run("simulate", "thermal-stress", "--json", "--mode", "both")
    assert code == 0
    direct, managed = json.loads(out).values()
    assert direct["camera_deadline_misses"] > 0 == managed["camera_deadline_misses"]
    assert managed["peak_temperature_c"] < direct["peak_temperature_c"]
    assert managed["throttled_ms"] < direct["throttled_ms"]
    assert managed["unload_requests"]["THERMAL"] > 0


def test_one_mode_prints_one_column(tmp_path: Path) -> None:
    code, out, _ = run("simulate", "turn_taking", "--mode", "managed")
    assert code == 0
    header = next(line for line in out.splitlines() if "MANAGED" in line)
    assert header.split() == ["MANAGED"]
    assert "camera frames" not in out, "rows with nothing in them are left out"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "no_such"], "no scenario file or shipped scenario 'no_such'; shipped: "),
        (["simulate"], "give a scenario file or a shipped scenario's name, or --list"),
        (["simulate", "demo", "--driver", "nope"], "unknown driver 'nope'; available: "),
        (
            ["simulate", "demo", "--trace", "/no/such/dir/t.json"],
            "/no/such/dir/t.json: folder /no/such/dir does not",
        ),
    ],
)
def test_mistakes_are_one_line_and_exit_2(argv: list[str], message: str) -> None:
    code, out, err = run(*argv)
    assert code == 2 and out == ""
    assert err.startswith(f"npu-manager: error: {message}") and err.count("\n") == 1


def test_a_bad_scenario_file_names_the_key_and_what_is_allowed(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        'name = "x"\nduration_ms = 10\n[[apps]]\nname = "a"\nuid = 1\nmodel_bytes = 1\n'
        '[apps.work]\nkind = "loop"\ncost_us = 5\nspeed = 3\n'
    )
    code, _, err = run("simulate", str(path))
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"npu-manager: error: {path}: apps.0.work.speed: unknown key; allowed: ")
    assert "cost_us" in err and "period_ms" in err
    path.write_text(path.read_text().replace("speed = 3\n", "kind2 = 1\n").replace('"loop"', '"x"'))
    code, _, err = run("simulate", str(path))
    assert code == 2 and "apps.0.work.kind: Input should be 'periodic', 'loop' or 'burst'" in err


def test_plot_without_the_extra_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run("demo", "--plot", str(tmp_path / "x.png"))
    assert code == 2 and out == ""
    assert err == (
        "npu-manager: error: --plot needs the 'plot' extra (matplotlib): "
        "pip install 'npu-manager[plot]'\n"
    )
    assert not (tmp_path / "x.png").exists()


def test_a_simulation_trace_of_one_scenario_file(tmp_path: Path) -> None:
    trace = tmp_path / "tt.json"
    code, out, _ = run("simulate", "turn_taking", "--mode", "managed", "--trace", str(trace))
    assert code == 0 and f"trace: {trace}" in out
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["name"] for e in events if e["ph"] == "i"}
    assert {"requested", "WAIT_FOR_UNLOAD", "CAN_LOAD_NOW", "LOADED", "UNLOADED"} <= names
    assert any(n.startswith("UNLOAD_REQUESTED (") for n in names)
