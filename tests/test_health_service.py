"""Health sources inside a real-clock service: combined with the driver, fed to the arbiter,
shown in the snapshot and sent to the sinks as device samples."""

from __future__ import annotations

import json
import logging
import os
import select
import threading
from pathlib import Path
from typing import Any

import pytest

from helpers import health_trees as tree
from helpers.service_apps import WAIT_S, background_app, wait_for
from npumanager.core.plugins.health import HealthBoard
from npumanager.core.service.service import Service
from npumanager.errors import IllegalArgumentError, UnknownPluginError
from npumanager.plugins.sinks import MemorySink
from npumanager.schemas import HealthSample, ThermalReading, ThermalSeverity, UnloadReason
from npumanager.telemetry import DeviceSample
from npumanager.telemetry.records import to_json_line, to_record


class Source:
    """A health source whose next readings the test sets."""

    interval_ms = 10

    def __init__(self, sample: HealthSample | dict[str, Any] | None = None) -> None:
        self.sample: Any = sample or HealthSample()
        self.reads = threading.Event()
        self.closed = False

    def read(self) -> Any:
        self.reads.set()
        if isinstance(self.sample, Exception):
            raise self.sample
        return self.sample

    def close(self) -> None:
        self.closed = True


def hot(severity: ThermalSeverity, device: int | None = None) -> HealthSample:
    return HealthSample(
        thermal=(
            ThermalReading(name="soc", device=device, temperature_mc=90_000, severity=severity),
        )
    )


def test_a_sources_thermal_spike_asks_a_background_app_to_unload(tmp_path: Path) -> None:
    source = Source()
    with Service("vnpu", "pressure", clock="real", health=[source]) as service:
        app = background_app(service)
        source.sample = hot(ThermalSeverity.MODERATE)
        assert app.unloaded.wait(WAIT_S)
        assert app.reason is UnloadReason.THERMAL
        snapshot = service.snapshot()
        assert snapshot["devices"][0]["severity"] == "MODERATE"
        assert snapshot["devices"][0]["driver_severity"] == "NONE"
        (shown,) = snapshot["health"]["sources"]
        assert shown["name"] == "Source" and shown["thermal"][0]["severity"] == "MODERATE"
    assert source.closed


def test_a_sources_memory_level_asks_for_unloads_and_outranks_a_lower_signal() -> None:
    source = Source()
    with Service("vnpu", "pressure", clock="real", health=[source]) as service:
        app = background_app(service)
        source.sample = {"memory": [{"name": "system", "level": 2, "some_avg10": 55.0}]}
        assert app.unloaded.wait(WAIT_S)
        assert app.reason is UnloadReason.MEMORY_PRESSURE
        service.set_memory_pressure(0)  # the source still reads 2: it stays
        assert service.snapshot()["memory_pressure"] == 2
        source.sample = HealthSample()
        wait_for(lambda: service.snapshot()["memory_pressure"] == 0)
        service.set_memory_pressure(1)
        assert service.snapshot()["memory_pressure"] == 1


def test_the_more_severe_of_driver_and_sources_wins() -> None:
    board = HealthBoard()
    first, second = board.add("linux"), board.add("linux")
    assert second.name == "linux#2"
    first.sample = hot(ThermalSeverity.LIGHT)
    second.sample = hot(ThermalSeverity.SEVERE, device=1)
    assert board.severity(0) is ThermalSeverity.LIGHT
    assert board.severity(1) is ThermalSeverity.SEVERE
    source = Source(hot(ThermalSeverity.LIGHT))
    with Service("vnpu", "pressure", clock="real", health=[source]) as service:
        service.add_heat(0, 200_000)  # the simulated device itself is far hotter
        wait_for(lambda: service.snapshot()["devices"][0]["driver_severity"] == "SHUTDOWN")
        assert service.snapshot()["devices"][0]["severity"] == "SHUTDOWN"


def test_sinks_get_the_sources_readings_as_device_samples() -> None:
    sink = MemorySink()
    source = Source(
        {
            "memory": [{"name": "system", "level": 1}],
            "thermal": [{"name": "soc", "temperature_mc": 250_000, "severity": 2}],
            "devices": [
                {
                    "device": 0,
                    "name": "accel0",
                    "busy_time_us": 77,
                    "memory_used_bytes": 88,
                    "frequency_mhz": 600,
                    "max_frequency_mhz": 1400,
                }
            ],
        }
    )
    with Service("vnpu", "pressure", clock="real", sinks=[sink], health=[source]) as service:

        def seen() -> list[DeviceSample]:
            return [e for e in sink.events if isinstance(e, DeviceSample) and e.busy_time_us == 77]

        wait_for(seen)
        assert service is not None
    sample = seen()[-1]
    assert (sample.severity, sample.temperature_mc, sample.memory_pressure) == (2, 250_000, 1)
    assert (sample.device_memory_used_bytes, sample.frequency_mhz) == (88, 600)
    assert sample.max_frequency_mhz == 1400


def test_a_broken_source_is_logged_once_and_counts_for_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = Source(RuntimeError("sensor on fire"))
    with (
        caplog.at_level(logging.WARNING, logger="npumanager.core.service.health_monitor"),
        Service("vnpu", "pressure", clock="real", health=[source]) as service,
    ):
        wait_for(lambda: service.snapshot()["health"]["sources"][0]["error"])
        assert service.snapshot()["health"]["sources"][0]["error"] == (
            "RuntimeError: sensor on fire"
        )
        source.reads.clear()
        assert source.reads.wait(WAIT_S)  # read again, not logged again
        source.sample = {"thermal": [{"name": "x", "severity": 99}]}
        wait_for(lambda: "invalid sample" in (service.snapshot()["health"]["sources"][0]["error"]))
        assert service.snapshot()["devices"][0]["severity"] == "NONE"
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("health source Source: RuntimeError: sensor on fire") == 1


def test_the_linux_source_by_name_on_a_fake_tree(tmp_path: Path) -> None:
    tree.zone(tmp_path, 0, "x86_pkg_temp", 100_000, tree.SOC_TRIPS)
    with Service("vnpu", "pressure", clock="real") as service:
        name = service.add_health_source("linux", root=str(tmp_path), interval_ms=10)
        assert name == "linux"
        wait_for(lambda: service.snapshot()["devices"][0]["severity"] == "SEVERE")


def test_health_sources_need_the_real_clock_and_a_known_name() -> None:
    with (
        Service("vnpu", clock="virtual") as service,
        pytest.raises(IllegalArgumentError, match="use clock='real'"),
    ):
        service.add_health_source(Source())
    with Service("vnpu", clock="real") as service:
        with pytest.raises(UnknownPluginError, match="available: linux"):
            service.add_health_source("thermometer")
        with pytest.raises(IllegalArgumentError, match="unknown option 'bogus'"):
            service.add_health_source("linux", bogus=1)
        with pytest.raises(IllegalArgumentError, match="an object with read"):
            service.add_health_source(object())  # type: ignore[arg-type]


class HungUp(Source):
    """A source whose descriptor is hung up for good and whose ready() does nothing."""

    interval_ms = 3_600_000

    def __init__(self) -> None:
        super().__init__()
        self._read_end, write_end = os.pipe()
        os.close(write_end)
        self.ready_calls = 0

    def descriptors(self) -> dict[int, int]:
        return {self._read_end: select.POLLIN}

    def ready(self, fd: int) -> None:
        self.ready_calls += 1

    def close(self) -> None:
        os.close(self._read_end)


def test_a_descriptor_that_keeps_reporting_an_error_is_polled_no_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hung, ticker = HungUp(), Source()
    reads = 0

    def count() -> HealthSample:
        nonlocal reads
        reads += 1
        return HealthSample()

    ticker.read = count  # type: ignore[method-assign]
    with (
        caplog.at_level(logging.WARNING, logger="npumanager.core.service.health_monitor"),
        Service("vnpu", clock="real", health=[hung, ticker]),
    ):
        wait_for(lambda: reads >= 20)
    assert hung.ready_calls == 1
    assert "reports an error; it is polled no more" in caplog.text


def test_device_samples_with_health_readings_write_the_same_json_both_ways() -> None:
    sample = DeviceSample(0, 90_000, 2, 1, 2, 0, 5, 1, 77, 88, 600, 1400)
    record = to_record(sample)
    assert json.loads(to_json_line(sample)) == record
    assert (record["memoryPressure"], record["busyTimeUs"], record["maxFrequencyMhz"]) == (
        1,
        77,
        1400,
    )
    assert to_record(sample._replace(busy_time_us=-1))["busyTimeUs"] is None
