"""A new user's mistakes and hostile inputs, through the real console script: one line, exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from helpers.console import CONSOLE_SCRIPT, npu, one_line_error
from helpers.daemon_support import WAIT_S
from npumanager.core.plugins import tomlfile
from npumanager.errors import ConfigError
from npumanager.schemas.limits import (
    MAX_SCENARIO_APP_MS,
    MAX_SCENARIO_APPS,
    MAX_SCENARIO_JOBS,
    MAX_TOML_DEPTH,
)


def app(index: int, work: str = 'kind = "periodic", cost_us = 500, period_ms = 10') -> str:
    return (
        f'[[apps]]\nname = "a{index}"\nuid = {10000 + index}\nmodel_bytes = 1000000\n'
        f"work = {{ {work} }}\n"
    )


def scenario(tmp_path: Path, duration_ms: int, apps: list[str]) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(f'name = "s"\nduration_ms = {duration_ms}\n' + "".join(apps))
    return path


@pytest.mark.parametrize("verb", [["simulate"], ["demo", "--scenario"], ["--config"]])
def test_a_file_that_is_not_utf8_is_one_line(tmp_path: Path, verb: list[str]) -> None:
    path = tmp_path / "x.toml"
    path.write_bytes(b'name = "\xff"\n')
    args = [*verb, str(path)] + (["config"] if verb == ["--config"] else [])
    one_line_error(npu(*args), f"{path}: not UTF-8 text (byte 8 is invalid)")


@pytest.mark.parametrize("verb", [["simulate"], ["--config"]])
def test_toml_nested_2000_deep_is_one_line(tmp_path: Path, verb: list[str]) -> None:
    path = tmp_path / "x.toml"
    path.write_text("a = " + "[" * 2000 + "]" * 2000 + "\n")
    args = [*verb, str(path)] + (["config"] if verb == ["--config"] else [])
    one_line_error(npu(*args), f"nested deeper than the limit of {MAX_TOML_DEPTH}")


def test_toml_nested_just_past_the_limit_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    depth = MAX_TOML_DEPTH + 1
    path.write_text("a = " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(ConfigError, match="nested deeper"):
        tomlfile.read_toml(path)


def test_dev_zero_and_a_fifo_as_a_scenario_are_refused_without_reading(tmp_path: Path) -> None:
    one_line_error(npu("simulate", "/dev/zero"), "/dev/zero: is a character device")
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    one_line_error(npu("simulate", str(fifo)), f"{fifo}: is a FIFO, not a TOML file")


def test_a_config_in_a_folder_that_cannot_be_entered_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(path: object) -> os.stat_result:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tomlfile.os, "stat", denied)
    with pytest.raises(ConfigError, match=r"locked/config.toml: cannot be read: Permission denied"):
        tomlfile.file_kind(tmp_path / "locked" / "config.toml")


@pytest.mark.skipif(os.geteuid() == 0, reason="root enters every folder")
def test_a_config_in_a_folder_that_cannot_be_entered_through_the_cli(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "config.toml").write_text("")
    locked.chmod(0)
    try:
        one_line_error(npu("--config", str(locked / "config.toml"), "config"), "Permission denied")
    finally:
        locked.chmod(0o700)


def test_config_missing_or_a_folder_is_one_rule_for_flag_and_variable(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    one_line_error(npu("--config", str(missing), "config"), "no such file (named by --config)")
    env = {**os.environ, "NPUMANAGER_CONFIG": str(missing)}
    one_line_error(npu("config", env=env), "no such file (named by NPUMANAGER_CONFIG)")
    one_line_error(npu("--config", str(tmp_path), "config"), "is a directory, not a TOML file")


def test_output_to_a_full_disk_is_one_line() -> None:
    with open("/dev/full", "w") as full:
        result = npu("demo", stdout=full)
    one_line_error(result, "cannot write the output: No space left on device")
    one_line_error(npu("demo", "--trace", "/dev/full"), "/dev/full: cannot be written: No space")


def test_ctrl_c_during_simulate_is_one_line_and_exit_130(tmp_path: Path) -> None:
    slow = 'kind = "periodic", cost_us = 500, period_ms = 1000'
    path = scenario(tmp_path, MAX_SCENARIO_APP_MS // 20, [app(i, slow) for i in range(20)])
    process = subprocess.Popen(
        [CONSOLE_SCRIPT, "simulate", str(path), "--progress", "always"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    assert os.read(process.stderr.fileno(), 1) == b"\r", (
        "the bar is drawn once the run is under way"
    )
    process.send_signal(signal.SIGINT)
    err = process.communicate()[1].decode()
    assert process.returncode == 130
    assert "Traceback" not in err
    assert err.rstrip().endswith("npu-manager: interrupted")
    assert "left" in err, "the bar shows an estimate of the time left"


def test_too_many_apps_are_refused_up_front_with_the_limit(tmp_path: Path) -> None:
    path = scenario(tmp_path, 10, [app(i) for i in range(MAX_SCENARIO_APPS + 1)])
    one_line_error(npu("simulate", str(path)), f"{path}: apps:", f"limit is {MAX_SCENARIO_APPS}")


def test_a_long_many_app_scenario_is_refused_up_front(tmp_path: Path) -> None:
    apps = [app(i, 'kind = "periodic", cost_us = 5, period_ms = 100000') for i in range(10)]
    path = scenario(tmp_path, MAX_SCENARIO_APP_MS // 10 + 1, apps)
    one_line_error(npu("simulate", str(path)), "duration_ms:", f"limit is {MAX_SCENARIO_APP_MS}")


@pytest.mark.parametrize(
    "work",
    [
        'kind = "periodic", cost_us = 5, period_ms = 1',
        'kind = "loop", cost_us = 1',
        'kind = "burst", cost_us = 5, period_ms = 100, burst = 65536',
    ],
)
def test_a_scenario_with_too_many_jobs_is_refused_naming_the_app(tmp_path: Path, work: str) -> None:
    path = scenario(tmp_path, 3_600_000, [app(0, work)])
    one_line_error(
        npu("simulate", str(path)), "apps.work: up to", "app 'a0'", f"limit is {MAX_SCENARIO_JOBS}"
    )


def test_a_burst_past_the_drivers_limit_is_a_key_error(tmp_path: Path) -> None:
    path = scenario(tmp_path, 10, [app(0, 'kind = "burst", cost_us = 5, burst = 1000000000')])
    one_line_error(npu("simulate", str(path)), f"{path}: apps.0.work.burst:")


def test_argparse_mistakes_are_one_line_with_a_hint() -> None:
    line = one_line_error(npu("simulate", "--bogus"), "unrecognized arguments: --bogus")
    assert line.endswith("(see 'npu-manager --help')")
    line = one_line_error(npu("simulate", "--mode", "sideways", "demo"), "invalid choice")
    assert line.endswith("(see 'npu-manager simulate --help')")


def test_simulate_on_a_real_time_driver_names_the_drivers_that_fit() -> None:
    one_line_error(
        npu("simulate", "demo", "--driver", "onnxruntime"),
        "driver 'onnxruntime' cannot play a scenario",
        "no virtual_time capability",
        "drivers that can: ",
        "vnpu",
    )


def test_scenario_numbers_past_the_drivers_limits_name_file_and_key(tmp_path: Path) -> None:
    path = scenario(tmp_path, 100, [app(0).replace("1000000", str(2**63))])
    one_line_error(npu("simulate", str(path)), f"{path}: apps.0.model_bytes:")
    path = scenario(tmp_path, 100, [app(0, f'kind = "loop", cost_us = {2**62}')])
    one_line_error(npu("simulate", str(path)), f"{path}: apps.0.work.cost_us:", "at most")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            "jsonl:bogus=1",
            "sink 'jsonl': unknown option 'bogus'; allowed: path, max_bytes, backup_count, "
            "debounce_duration_ms, queue_size",
        ),
        ("memory:x=1", "sink 'memory': unknown option 'x'; allowed: debounce_duration_ms"),
    ],
)
def test_serve_sink_options_are_checked_naming_the_allowed_ones(
    tmp_path: Path, spec: str, expected: str
) -> None:
    result = npu("serve", "--sink", spec, "--socket", str(tmp_path / "s.sock"), timeout=WAIT_S)
    one_line_error(result, expected)


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (["--weights", "0,0,0"], "--weights must be 3 comma-separated ints 1..2147483647"),
        (["--weights", "1,2"], "got '1,2'"),
        (["--max-budget", str(10**23)], "--max-budget must be 1..2147483647"),
    ],
)
def test_budget_options_are_one_clear_line_before_connecting(
    tmp_path: Path, option: list[str], expected: str
) -> None:
    result = npu("set-policy", "budget", *option, "--socket", str(tmp_path / "none.sock"))
    one_line_error(result, expected)


def test_the_budget_policy_refuses_a_total_past_an_int32() -> None:
    from npumanager.errors import PolicyParamsError
    from npumanager.plugins.policies.budget import BudgetPolicy

    with pytest.raises(PolicyParamsError, match="max_budget: Input should be less than"):
        BudgetPolicy(max_budget=2**31)


def test_snapshot_names_importances_and_the_device_of_a_loaded_request() -> None:
    import npumanager as npu

    service = npu.Service("vnpu", "budget", clock="virtual")
    service.set_uid_importance(10123, npu.IMPORTANCE_FOREGROUND)
    app = service.manager(10123, uses_feature=True)

    class Loader(npu.ModelLoadRequestCallback):
        def on_can_load_model(self, request: object, status: object, listener: object) -> None:
            app.load_model(request, weight_bytes=64 << 20)  # type: ignore[arg-type]
            listener.notify_model_loaded(request)  # type: ignore[attr-defined]

    request = npu.ModelLoadRequest.Builder(1).set_size(npu.NPU_MODEL_SIZE_LESS_THAN_1GB).build()
    app.request_can_load_model(request, Loader())
    service.run_until_idle()
    snapshot = service.snapshot()
    service.close()
    assert [r["device"] for r in snapshot["requests"]["loaded"]] == [0]
    importance = {c["uid"]: c["importance"] for c in snapshot["priorities"]}
    assert importance[10123] == "FOREGROUND" and importance[0] == "PINNED"


@pytest.mark.parametrize(("interval_ms", "most"), [(None, 2000 // 50 + 2), (500, 2000 // 500 + 2)])
def test_an_idle_device_is_sampled_at_the_configured_interval(
    interval_ms: int | None, most: int
) -> None:
    import npumanager as npu
    from npumanager.telemetry import DeviceSample

    service = npu.Service("vnpu", "budget", clock="virtual", health_interval_ms=interval_ms)
    memory = service.add_sink("memory").sink
    service.advance(2000)
    samples = [e for e in memory.events if isinstance(e, DeviceSample)]
    service.close()
    assert 1 <= len(samples) <= most


def test_real_time_samples_once_a_second_and_serve_checks_the_interval(tmp_path: Path) -> None:
    import npumanager as npu
    from npumanager.schemas.limits import DEFAULT_HEALTH_INTERVAL_MS

    service = npu.Service("vnpu", "budget", clock="real")
    try:
        assert service._telemetry._sampler.period_us == DEFAULT_HEALTH_INTERVAL_MS * 1000
    finally:
        service.close()
    result = npu_cli_serve(tmp_path, "--health-interval-ms", "0")
    one_line_error(result, "health_interval_ms must be within 1..3600000; got 0")


def npu_cli_serve(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return npu("serve", "--socket", str(tmp_path / "s.sock"), *argv, timeout=WAIT_S)


def test_the_table_explains_lmk() -> None:
    result = npu("demo")
    assert result.returncode == 0, result.stderr
    assert "over-commit events (LMK)" in result.stdout
    assert "(LMK: the kernel's low-memory killer;" in result.stdout


def test_plot_writes_a_jpeg_for_jpg_and_refuses_an_unknown_suffix(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    picture = tmp_path / "x.jpg"
    result = npu("simulate", "turn_taking", "--plot", str(picture))
    assert result.returncode == 0, result.stderr
    assert picture.read_bytes()[:3] == b"\xff\xd8\xff", "a JPEG, not a PNG named .jpg"
    one_line_error(
        npu("demo", "--plot", str(tmp_path / "x.gif")), "write a picture ending in .png, .jpg"
    )
    assert not (tmp_path / "x.gif").exists()


def test_app_colours_follow_the_name_and_avoid_the_curves() -> None:
    pytest.importorskip("matplotlib")
    from npumanager.simulation.plot import app_colour_index
    from npumanager.simulation.scenario import load_scenario, shipped_scenarios

    curves = {0, 1, 6, 7}  # tab20's blues and reds: the memory and temperature curves
    assert app_colour_index("camera") == app_colour_index("camera", {99})
    assert app_colour_index("camera") not in curves
    first = app_colour_index("camera")
    assert app_colour_index("camera", {first}) != first, "a clash takes the next colour"
    from npumanager.simulation import plot

    for path in shipped_scenarios().values():
        colours = plot._colours(load_scenario(path))
        assert len(set(colours.values())) == len(colours)


def test_the_picture_labels_the_capacity_and_the_unload_reasons() -> None:
    pytest.importorskip("matplotlib")
    from npumanager.core.plugins.registry import load_plugins
    from npumanager.simulation.plot import build_figure
    from npumanager.simulation.runner import run_managed
    from npumanager.simulation.scenario import find_scenario, load_scenario

    scenario = load_scenario(find_scenario("demo"))
    result = run_managed(scenario, "vnpu", load_plugins())
    assert result.unloads
    figure = build_figure([result], scenario)
    texts = {text.get_text() for ax in figure.axes for text in ax.texts}
    assert any(text.startswith("capacity ") and text.endswith(" GiB") for text in texts)
    keys = {
        text.get_text()
        for ax in figure.axes
        if ax.get_legend() is not None
        for text in ax.get_legend().get_texts()
    }
    named = {key.split(": ", 1)[1].rsplit(" (", 1)[0] for key in keys if key.startswith("unload")}
    assert {reason.lower() for _, _, reason in result.unloads} == named, "each reason, once"


def test_the_picture_ticks_camera_misses_and_shades_throttled_stretches() -> None:
    pytest.importorskip("matplotlib")
    from npumanager.core.plugins.registry import load_plugins
    from npumanager.simulation.plot import build_figure, throttled_stretches
    from npumanager.simulation.runner import run_direct
    from npumanager.simulation.scenario import find_scenario, load_scenario

    scenario = load_scenario(find_scenario("thermal_stress"))
    result = run_direct(scenario, "vnpu", load_plugins())
    assert len(result.deadline_misses) == result.metrics.camera_deadline_misses > 0
    stretches = throttled_stretches(result)
    assert stretches and all(start < end for start, end in stretches)
    figure = build_figure([result], scenario)
    texts = {text.get_text() for ax in figure.axes for text in ax.texts}
    assert "shaded: throttled" in texts
    keys = {
        text.get_text()
        for ax in figure.axes
        if ax.get_legend() is not None
        for text in ax.get_legend().get_texts()
    }
    misses = result.metrics.camera_deadline_misses
    assert f"a camera deadline missed ({misses})" in keys, keys
