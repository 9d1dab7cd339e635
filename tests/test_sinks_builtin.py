"""The built-in sinks on real runs: jsonl files, Perfetto traces, Prometheus over HTTP."""

from __future__ import annotations

import json
import logging
import sys
import urllib.request
from pathlib import Path

import pytest

from helpers.daemon_support import WAIT_S
from npumanager import DeviceSpec, ModelLoadRequest, ModelSize, Service, load_plugins
from npumanager.schemas import PluginKind
from npumanager.telemetry.jsonl import JsonlSink, default_path
from npumanager.telemetry.perfetto import PerfettoSink, write_trace
from npumanager.vendor_drivers.vnpu import VnpuDriver

MIB = 1 << 20


def busy_service(svc: Service, *, heat: int = 0) -> None:
    """One app, a few jobs, a thermal spike: every kind of event."""
    app = svc.manager(10001, uses_feature=True)
    request = ModelLoadRequest.Builder(1).set_size(ModelSize.LESS_THAN_1GB).build()
    with app.reserve(request, weight_bytes=64 * MIB) as lease:
        model = lease.load_model(weight_bytes=64 * MIB)
        for _ in range(4):
            model.submit(3_000_000)
        svc.advance(2)
        if heat:
            svc.add_heat(0, heat)
        svc.run_until_idle()


# jsonl --------------------------------------------------------------------------------------


def test_jsonl_writes_every_event_as_a_camel_case_record(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "events.jsonl"
    path.parent.mkdir()  # a named file's folder must exist
    with Service("vnpu", "pressure", clock="virtual") as svc:
        svc.add_sink("jsonl", path=path)
        busy_service(svc, heat=40_000)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    types = {r["type"] for r in records}
    assert types == {"work", "model_load_requested", "model_load_state_changed", "device_sample"}
    work = next(r for r in records if r["type"] == "work" and r["kind"] == "ENDED")
    assert work["reason"] == "COMPLETED" and work["uid"] == 10001
    assert {
        "effectivePriority",
        "jobPriority",
        "originalUid",
        "timestampMs",
        "deviceNumber",
    } <= set(work)
    states = [r["state"] for r in records if r["type"] == "model_load_state_changed"]
    assert states[:2] == ["CAN_LOAD_NOW", "LOADED"] and "UNLOADED" in states
    requested = next(r for r in records if r["type"] == "model_load_requested")
    assert requested["size"] == "LESS_THAN_1GB" and requested["weightBytes"] == 64 * MIB
    severities = {r["severity"] for r in records if r["type"] == "device_sample"}
    assert {"NONE", "MODERATE"} <= severities


def test_jsonl_rotates_by_size_and_keeps_the_backup_count(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(path, max_bytes=2_000, backup_count=2)
    driver = VnpuDriver(1)
    model = driver.load_model(0, weight_bytes=1)
    for _ in range(60):
        driver.submit(model, uid=10001, cost_cycles=1000)
        driver.advance(2)
        sink.handle(driver.take_events())
    sink.close()
    driver.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["events.jsonl", "events.jsonl.1", "events.jsonl.2"]
    for name in names[1:]:
        size = (tmp_path / name).stat().st_size
        assert 2_000 <= size < 2_000 + 1_500, "rotated right after the batch that filled it"
    lines = [json.loads(line) for name in names for line in (tmp_path / name).open()]
    assert all(r["type"] == "work" for r in lines)


def test_jsonl_restarts_the_file_with_no_backups(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(path, max_bytes=600, backup_count=0)
    driver = VnpuDriver(1)
    model = driver.load_model(0, weight_bytes=1)
    driver.submit(model, uid=1, cost_cycles=1000)
    driver.advance(5)
    sink.handle(driver.take_events())
    driver.submit(model, uid=1, cost_cycles=1000)
    driver.advance(1)
    sink.handle(driver.take_events()[:1])
    sink.close()
    driver.close()
    assert [p.name for p in tmp_path.iterdir()] == ["events.jsonl"]
    assert len(path.read_text().splitlines()) == 1


def test_jsonl_defaults_to_the_user_log_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_path() == tmp_path / "npu-manager" / "log" / "events.jsonl"
    assert JsonlSink().path == default_path()


def test_sinks_label_work_by_the_app_ids_the_service_names_uids_by(tmp_path: Path) -> None:
    """As a daemon names each HAL uid by its app's id: Prometheus's `app` label and
    Perfetto's tracks and slices carry it; a sink's own `names` still come first."""
    path = tmp_path / "trace.json"
    with Service("vnpu", "pressure", clock="virtual") as svc:
        svc.name_uids({10001: "org.example.Cam"}.get)
        metrics = svc.add_sink("prometheus", port=None)
        svc.add_sink("perfetto", path=path)
        busy_service(svc)
        text = metrics.sink.exposition()
    assert 'npu_work_events_total{app="org.example.Cam",kind="ended",reason="completed"} 4.0' in (
        text.splitlines()
    )
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["name"] for e in events if e["ph"] == "X"} == {"org.example.Cam"}


# perfetto -----------------------------------------------------------------------------------


def test_a_paused_item_becomes_two_slices_with_its_priorities_as_args(tmp_path: Path) -> None:
    driver = VnpuDriver([DeviceSpec(channels=1)])
    model = driver.load_model(0, weight_bytes=1)
    slow = driver.submit(model, uid=20, cost_cycles=5_000_000, job_priority=900)
    driver.advance(1000)
    urgent = driver.submit(model, uid=21, cost_cycles=1_000_000, job_priority=0)
    driver.run_until_idle()
    sink = PerfettoSink(tmp_path / "t.json")
    sink.handle(driver.take_events())
    sink.close()
    driver.close()
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert [(e["args"]["work_id"], e["args"]["end"]) for e in slices] == [
        (slow, "PAUSED"),
        (urgent, "COMPLETED"),
        (slow, "COMPLETED"),
    ]
    assert slices[2]["args"]["start"] == "RESUMED"
    assert slices[0]["args"]["job_priority"] == 900
    assert slices[0]["args"]["effective_priority"] > slices[1]["args"]["effective_priority"]
    assert sum(e["dur"] for e in slices if e["args"]["work_id"] == slow) == 5000
    assert all(e["tid"] == 1 and e["pid"] == 2 for e in slices), "one channel, one lane"


def test_a_service_trace_has_tracks_slices_instants_and_counters(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    with Service("vnpu", "pressure", clock="virtual") as svc:
        svc.add_sink("perfetto", path=path, label="run", names={10001: "camera"})
        busy_service(svc, heat=40_000)
    document = json.loads(path.read_text())
    events = document["traceEvents"]
    meta = {(e["name"], e["pid"], e.get("tid")): e["args"] for e in events if e["ph"] == "M"}
    processes = {args["name"] for (name, _, _), args in meta.items() if name == "process_name"}
    assert processes == {"run: npu0", "run: model loads"}
    threads = {args["name"] for (name, _, _), args in meta.items() if name == "thread_name"}
    assert {"channel lane 0", "thermal", "camera"} <= threads
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == 4 and {e["name"] for e in slices} == {"camera"}
    assert {"uid", "original_uid", "job_priority", "effective_priority", "work_id"} <= set(
        slices[0]["args"]
    )
    lanes = {e["tid"] for e in slices}
    assert lanes <= {1, 2, 3, 4} and len(lanes) == 4, "four jobs at once on four channels"
    instants = [e["name"] for e in events if e["ph"] == "i"]
    assert instants[:3] == ["requested", "CAN_LOAD_NOW", "LOADED"]
    assert "UNLOADED" in instants and "thermal MODERATE" in instants
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"weight memory used (bytes)", "temperature (C)", "busy channels"}
    memory = [e["args"]["value"] for e in events if e["name"] == "weight memory used (bytes)"]
    assert max(memory) == 64 * MIB and memory[-1] == 0
    timed = [e["ts"] for e in events if e["ph"] != "M"]
    assert timed == sorted(timed)


def test_slices_still_running_at_the_end_close_at_the_last_time_seen(tmp_path: Path) -> None:
    driver = VnpuDriver(1)
    model = driver.load_model(0, weight_bytes=1)
    driver.submit(model, uid=1, cost_cycles=10**12)
    driver.advance(700)
    first, second = PerfettoSink(label="a"), PerfettoSink(label="b", pid_base=100)
    batch = driver.take_events()
    first.handle(batch)
    second.handle(batch)
    first.close()
    second.close()
    driver.close()
    write_trace(tmp_path / "both.json", [first, second])
    events = json.loads((tmp_path / "both.json").read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert [(e["pid"], e["dur"], e["args"]["end"]) for e in slices] == [
        (2, 0, "RUNNING_AT_END"),
        (102, 0, "RUNNING_AT_END"),
    ]


# prometheus ---------------------------------------------------------------------------------

METRICS = (
    "npu_work_events_total",
    "npu_work_duration_seconds",
    "npu_model_load_requests_total",
    "npu_weight_memory_bytes",
    "npu_temperature_celsius",
    "npu_throttling_severity",
)


def test_prometheus_is_served_on_the_port_given_and_carries_the_metrics() -> None:
    with Service("vnpu", "pressure", clock="virtual") as svc:
        handle = svc.add_sink("prometheus", port=0)
        busy_service(svc, heat=40_000)
        port = handle.sink.port
        assert isinstance(port, int) and port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S) as response:
            text = response.read().decode()
        assert text == handle.sink.exposition() or "npu_work_events_total" in text
    for name in METRICS:
        assert f"# TYPE {name.removesuffix('_total')}" in text, name
    samples = dict(
        (line.rsplit(" ", 1)[0], float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line and not line.startswith("#")
    )
    work: dict[tuple[str, str], float] = {}
    for key, value in samples.items():
        if key.startswith("npu_work_events_total{"):
            labels = dict(part.split("=", 1) for part in key[22:-1].split(","))
            assert labels["app"].startswith('"uid:'), key  # no app names in process
            pair = (labels["kind"].strip('"'), labels["reason"].strip('"'))
            work[pair] = work.get(pair, 0) + value
    assert work[("ended", "completed")] == 4
    assert work[("requested", "none")] == 4
    assert samples['npu_work_duration_seconds_count{reason="completed"}'] == 4
    assert samples['npu_model_load_requests_total{status="requested"}'] == 1
    assert samples['npu_model_load_requests_total{status="can_load_now"}'] == 1
    assert samples['npu_weight_memory_bytes{device="0"}'] == 0
    assert samples['npu_throttling_severity{device="0"}'] >= 2
    assert samples['npu_temperature_celsius{device="0"}'] > 70


def test_prometheus_closes_its_port() -> None:
    from npumanager.telemetry.prometheus import PrometheusSink

    sink = PrometheusSink(port=0)
    url = f"http://127.0.0.1:{sink.port}/metrics"
    with urllib.request.urlopen(url, timeout=WAIT_S) as response:
        assert response.status == 200
    sink.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_without_the_extra_the_prometheus_sink_is_simply_absent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with caplog.at_level(logging.INFO, logger="npumanager.plugins.sinks"):
        registry = load_plugins()
    names = {reg.name for reg in registry.registrations(PluginKind.SINK)}
    assert names == {"memory", "jsonl", "perfetto"}
    assert not registry.problems
    assert "npu-manager[prometheus]" in caplog.text
    info = [r for r in caplog.records if "prometheus" in r.getMessage()]
    assert info and all(r.levelno == logging.INFO for r in info)


def test_the_builtins_are_registered_through_the_entry_point() -> None:
    registry = load_plugins()
    sinks = {reg.name: reg for reg in registry.registrations(PluginKind.SINK)}
    assert set(sinks) >= {"memory", "jsonl", "perfetto", "prometheus"}
    assert {reg.source.name for reg in sinks.values()} == {"builtin-sinks"}


def test_the_fast_json_line_is_the_record_exactly() -> None:
    from npumanager import ModelLoadState, ModelLoadStateChanged
    from npumanager.plugins.sinks import MemorySink
    from npumanager.telemetry.records import to_json_line, to_record

    sink = MemorySink()
    with Service("vnpu", "pressure", clock="virtual", sinks=[sink]) as svc:
        busy_service(svc, heat=40_000)
    odd = ModelLoadStateChanged(1, 2, 3, 9, 77, ModelLoadState.REVOKED, 2, -1, 5)
    driver = VnpuDriver(1)
    model = driver.load_model(0, weight_bytes=1)
    driver.submit(model, uid=3, cost_cycles=5, group_id=bytes(range(16)), feature_id='a "q"\n')
    driver.advance(10)
    for event in [*sink.events, odd, *driver.take_events()]:
        line = to_json_line(event)  # type: ignore[arg-type]
        assert line.endswith("\n") and line.count("\n") == 1
        assert json.loads(line) == to_record(event)  # type: ignore[arg-type]
        assert list(json.loads(line)) == list(to_record(event))  # type: ignore[arg-type]
    driver.close()


def test_the_sink_in_contributing_works_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    import re

    text = (Path(__file__).parent.parent / "CONTRIBUTING.md").read_text()
    code = re.search(r"## Write a sink.*?```python\n(.*?)```", text, re.DOTALL)
    assert code is not None
    namespace: dict[str, object] = {}
    exec(code.group(1), namespace)
    sink = namespace["SlowJobs"](threshold_us=1000)  # type: ignore[operator]
    with Service("vnpu", clock="virtual", sinks=[sink]) as svc:
        app = svc.manager(1, uses_feature=True)
        with app.reserve(ModelLoadRequest.Builder(1).build()) as lease:
            model = lease.load_model(weight_bytes=1)
            model.submit(500_000)
            model.submit(5_000_000)
            svc.run_until_idle()
    assert capsys.readouterr().out == "ENDED(COMPLETED) #2 uid 1 at 5000 us\n"
    record = namespace["npumanager_register_sinks"]()[0]  # type: ignore[operator]
    assert record.name == "slow-jobs"
