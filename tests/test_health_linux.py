"""The `linux` health source on fake sysfs/procfs trees, and on this machine's real PSI."""

from __future__ import annotations

import base64
import logging
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from helpers import health_trees as tree
from npumanager.errors import IllegalArgumentError
from npumanager.plugins.health import psi
from npumanager.plugins.health.linux import LinuxHealth, options_of
from npumanager.schemas import ThermalSeverity

REAL_PSI = Path("/proc/pressure/memory")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def source(root: Path, environ: dict[str, str] | None = None, **options: Any) -> LinuxHealth:
    return LinuxHealth(
        options_of({"root": str(root), **options}), environ=environ or {}, clock=Clock()
    )


def severities(health: LinuxHealth) -> dict[str, ThermalSeverity]:
    return {t.name: t.severity for t in health.read().thermal}


# Thermal zones -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("temp", "expected"),
    [
        (40_000, ThermalSeverity.NONE),
        (50_000, ThermalSeverity.LIGHT),
        (79_999, ThermalSeverity.LIGHT),
        (80_000, ThermalSeverity.MODERATE),
        (95_000, ThermalSeverity.SEVERE),
        (105_000, ThermalSeverity.CRITICAL),
        (130_000, ThermalSeverity.CRITICAL),
    ],
)
def test_a_zone_maps_to_the_severity_of_the_highest_trip_it_reached(
    tmp_path: Path, temp: int, expected: ThermalSeverity
) -> None:
    tree.zone(tmp_path, 0, "x86_pkg_temp", temp, tree.SOC_TRIPS)
    health = source(tmp_path)
    reading = health.read().thermal[0]
    assert reading.severity is expected
    assert reading.temperature_mc == temp
    assert reading.device is None and reading.name == "thermal_zone0:x86_pkg_temp"


def test_crossing_the_passive_trip_gives_moderate_and_critical_gives_critical(
    tmp_path: Path,
) -> None:
    tree.zone(tmp_path, 0, "x86_pkg_temp", 60_000, [("passive", 80_000), ("critical", 100_000)])
    health = source(tmp_path)
    assert health.read().severity(0) is ThermalSeverity.NONE
    tree.heat(tmp_path, 0, 80_500)
    assert health.read().severity(0) is ThermalSeverity.MODERATE
    tree.heat(tmp_path, 0, 100_000)
    assert health.read().severity(0) is ThermalSeverity.CRITICAL
    tree.heat(tmp_path, 0, 70_000)
    assert health.read().severity(0) is ThermalSeverity.NONE


def test_configured_thresholds_replace_the_trip_points(tmp_path: Path) -> None:
    tree.zone(tmp_path, 0, "soc", 72_000, tree.SOC_TRIPS)
    health = source(tmp_path, thresholds_mc="60000/70000/90000")
    assert health.read().severity(0) is ThermalSeverity.MODERATE
    tree.heat(tmp_path, 0, 91_000)
    assert health.read().severity(0) is ThermalSeverity.SEVERE


def test_zones_count_for_the_devices_the_rules_say(tmp_path: Path) -> None:
    tree.zone(tmp_path, 0, "x86_pkg_temp", 81_000, tree.SOC_TRIPS)
    tree.zone(tmp_path, 1, "gpu", 96_000, tree.SOC_TRIPS)
    tree.zone(tmp_path, 2, "iwlwifi_1", 120_000, tree.SOC_TRIPS)
    everyone = source(tmp_path).read()
    assert [t.name for t in everyone.thermal] == ["thermal_zone0:x86_pkg_temp", "thermal_zone1:gpu"]
    assert everyone.severity(0) is everyone.severity(3) is ThermalSeverity.SEVERE
    split = source(tmp_path, zones="0:x86_pkg_temp/1:thermal_zone1").read()
    assert split.severity(0) is ThermalSeverity.MODERATE
    assert split.severity(1) is ThermalSeverity.SEVERE
    assert split.severity(2) is None
    radios = source(tmp_path, zones="iwl*", exclude="").read()
    assert radios.severity(0) is ThermalSeverity.CRITICAL


def test_a_garbage_temperature_turns_that_zone_off_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tree.zone(tmp_path, 0, "x86_pkg_temp", 99_000, tree.SOC_TRIPS)
    tree.zone(tmp_path, 1, "acpitz", 30_000, tree.SOC_TRIPS)
    tree.write(tmp_path, "/sys/class/thermal/thermal_zone0/temp", "hot!\n")
    health = source(tmp_path)
    with caplog.at_level(logging.WARNING, logger="npumanager.health.linux"):
        for _ in range(3):
            sample = health.read()
    assert [t.name for t in sample.thermal] == ["thermal_zone1:acpitz"]
    assert sample.severity(0) is ThermalSeverity.NONE
    lines = [r.getMessage() for r in caplog.records if "thermal_zone0/temp" in r.getMessage()]
    assert lines == [
        "/sys/class/thermal/thermal_zone0/temp: not a whole number ('hot!'); that reading is off"
    ]


def test_odd_trip_points_are_ignored_not_guessed(tmp_path: Path) -> None:
    tree.zone(tmp_path, 0, "soc", 90_000, [("passive", 0), ("weird", 10_000), ("hot", 85_000)])
    tree.write(tmp_path, "/sys/class/thermal/thermal_zone0/trip_point_3_type", "critical\n")
    health = source(tmp_path)  # trip 3 has a type but no temperature file
    assert health.read().severity(0) is ThermalSeverity.SEVERE


def test_a_missing_temperature_and_no_thermal_class_give_no_reading(tmp_path: Path) -> None:
    assert source(tmp_path).read().thermal == ()
    tree.zone(tmp_path, 0, "soc", 90_000, tree.SOC_TRIPS)
    (tmp_path / "sys/class/thermal/thermal_zone0/temp").unlink()
    assert source(tmp_path).read().thermal == ()


# PSI memory pressure -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("some", "level"), [(0.0, 0), (9.99, 0), (10.0, 1), (39.0, 1), (40.0, 2), (100.0, 2)]
)
def test_psi_some_avg10_maps_to_the_memory_level(tmp_path: Path, some: float, level: int) -> None:
    tree.memory(tmp_path, some, full=1.5)
    (reading,) = source(tmp_path, memory="system").read().memory
    assert (reading.name, reading.path, reading.level) == ("system", "/proc/pressure/memory", level)
    assert reading.some_avg10 == pytest.approx(some) and reading.full_avg10 == 1.5
    assert reading.triggers == 0  # a fake tree gets no triggers unless asked


def test_configured_psi_levels(tmp_path: Path) -> None:
    tree.memory(tmp_path, 5.0)
    health = source(tmp_path, memory="system", some_moderate=2, some_critical="4.5")
    assert health.read().memory_pressure == 2
    with pytest.raises(IllegalArgumentError, match="some_critical .* must be above"):
        options_of({"some_moderate": 50, "some_critical": 20})


def test_the_processes_cgroup_pressure_is_read_where_cgroup2_is_mounted(tmp_path: Path) -> None:
    tree.memory(tmp_path, 1.0)
    tree.cgroup(tmp_path, "/system.slice/npu-manager.service", 45.0, mount="/sys/fs/cgroup/unified")
    sample = source(tmp_path).read()
    assert [(m.name, m.level) for m in sample.memory] == [("system", 0), ("cgroup", 2)]
    assert sample.memory[1].path == (
        "/sys/fs/cgroup/unified/system.slice/npu-manager.service/memory.pressure"
    )
    assert sample.memory_pressure == 2


def test_the_root_cgroup_is_not_read_twice(tmp_path: Path) -> None:
    tree.memory(tmp_path, 1.0)
    tree.cgroup(tmp_path, "/", 90.0)
    assert [m.name for m in source(tmp_path).read().memory] == ["system"]


@pytest.mark.parametrize("text", ["", "some avg10=x\n", "some total=3\n", "some avg10=250.0\n"])
def test_a_garbage_psi_file_gives_no_level_and_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    tree.write(tmp_path, "/proc/pressure/memory", text)
    health = source(tmp_path, memory="system")
    with caplog.at_level(logging.WARNING, logger="npumanager.health.linux"):
        assert health.read().memory == ()
        tree.memory(tmp_path, 90.0)  # off for good: a file that lied once is not trusted
        assert health.read().memory == ()
    assert len([r for r in caplog.records if "pressure/memory" in r.getMessage()]) == 1


def test_no_psi_file_no_memory_reading(tmp_path: Path) -> None:
    assert source(tmp_path).read().memory_pressure is None


def test_unknown_options_are_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(IllegalArgumentError, match=r"unknown option 'colour'; allowed: root, "):
        options_of({"colour": "red"})
    with pytest.raises(IllegalArgumentError, match="memory places are system/cgroup"):
        options_of({"memory": "swap"})
    with pytest.raises(IllegalArgumentError, match="strictly increasing"):
        options_of({"thresholds_mc": "80000/70000"})
    with pytest.raises(IllegalArgumentError, match="trigger_window_ms"):
        options_of({"trigger_window_ms": 100})


# Triggers --------------------------------------------------------------------------------


def test_unprivileged_windows_are_rounded_up_to_2_s(tmp_path: Path) -> None:
    assert psi.window_ms(1000, is_privileged=False) == 2000
    assert psi.window_ms(3000, is_privileged=False) == 4000
    assert psi.window_ms(10_000, is_privileged=False) == 10_000
    assert psi.window_ms(1000, is_privileged=True) == 1000
    files = psi.Files(str(tmp_path))
    tree.write(tmp_path, "/proc/self/status", "Name:\tx\nCapEff:\t0000000001000000\n")
    assert psi.privileged(files)
    tree.write(tmp_path, "/proc/self/status", "Name:\tx\nCapEff:\t0000000000ffffff\n")
    assert not psi.privileged(psi.Files(str(tmp_path)))


needs_psi = pytest.mark.skipif(not REAL_PSI.exists(), reason="this kernel has no PSI")


@needs_psi
def test_this_machines_psi_is_read() -> None:
    health = LinuxHealth(options_of({"memory": "system", "triggers": "off"}), environ={})
    (reading,) = health.read().memory
    assert reading.path == str(REAL_PSI)
    assert reading.some_avg10 is not None and 0 <= reading.some_avg10 <= 100
    expected = psi.parse_psi(REAL_PSI.read_text())
    assert expected is not None and reading.full_avg10 is not None


def _real(clock: Clock, **options: Any) -> LinuxHealth:
    return LinuxHealth(
        options_of({"memory": "system", "triggers": "on", **options}), environ={}, clock=clock
    )


@needs_psi
def test_a_trigger_the_kernel_accepts_raises_the_level_for_its_hold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    health = _real(clock)
    try:
        if health.memory.trigger_count == 0:
            pytest.skip(f"this kernel refused a 2 s PSI trigger: {caplog.text.strip()}")
        assert health.memory.trigger_count == 2
        (reading,) = health.read().memory
        assert reading.triggers == 2 and not reading.trigger
        moderate, critical = sorted(health.descriptors())
        health.ready(moderate)  # what the health thread does on POLLPRI
        (reading,) = health.read().memory
        assert reading.trigger and reading.level >= 1
        health.ready(critical)
        assert health.read().memory_pressure == 2
        clock.now += 2 * 2.0 + 0.1  # two windows without an event
        (reading,) = health.read().memory
        assert not reading.trigger and reading.level == psi.level_of(
            reading.some_avg10 or 0.0, psi.PsiLevels(10.0, 40.0, 2000)
        )
    finally:
        health.close()
    assert health.descriptors() == {}


@needs_psi
def test_without_cap_sys_resource_the_kernel_refuses_a_1_s_window_and_we_ask_for_2_s(
    caplog: pytest.LogCaptureFixture,
) -> None:
    files = psi.Files("/")
    if psi.privileged(files):
        pytest.skip("this process holds CAP_SYS_RESOURCE: the kernel accepts any window")
    with caplog.at_level(logging.INFO, logger="npumanager.health.linux"):
        refused = psi.psi_trigger(files, REAL_PSI, b"some 100000 1000000", 1, 2.0)
    assert refused is None
    assert "trigger 'some 100000 1000000' refused" in caplog.text
    health = _real(Clock(), trigger_window_ms=1000)  # asks for 2 s instead
    try:
        assert health.memory.trigger_count == 2
    finally:
        health.close()


def test_a_refused_trigger_falls_back_to_avg10(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tree.memory(tmp_path, 12.0)

    def refuse(fd: int, data: bytes) -> int:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(psi.os, "write", refuse)
    with caplog.at_level(logging.INFO, logger="npumanager.health.linux"):
        health = source(tmp_path, memory="system", triggers="on")
    assert health.descriptors() == {}
    assert "refused (Operation not permitted)" in caplog.text
    assert health.read().memory[0].level == 1
    assert path.read_text().startswith("some avg10=12.00")


# systemd's MEMORY_PRESSURE_WATCH -----------------------------------------------------------


def test_memory_pressure_watch_dev_null_turns_the_cgroup_off(tmp_path: Path) -> None:
    tree.memory(tmp_path, 0.0)
    tree.cgroup(tmp_path, "/npu.service", 90.0)
    health = source(tmp_path, {psi.WATCH_ENV: "/dev/null"})
    assert [m.name for m in health.read().memory] == ["system"]


def test_memory_pressure_watch_names_the_psi_file_to_read(tmp_path: Path) -> None:
    tree.cgroup(tmp_path, "/npu.service", 0.0)
    other = tree.write(tmp_path, "/run/elsewhere.pressure", tree.psi_text(15.0))
    health = source(tmp_path, {psi.WATCH_ENV: "/run/elsewhere.pressure"}, memory="cgroup")
    (reading,) = health.read().memory
    assert (reading.name, reading.level, reading.path) == ("cgroup", 1, "/run/elsewhere.pressure")
    assert other.read_text() == tree.psi_text(15.0)  # nothing written into a fake file


def test_memory_pressure_watch_fifo_events_mean_moderate(tmp_path: Path) -> None:
    fifo = tmp_path / "run/npu.pressure"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    spec = base64.b64encode(b"some 200000 2000000").decode()
    health = source(
        tmp_path, {psi.WATCH_ENV: "/run/npu.pressure", psi.WRITE_ENV: spec}, memory="cgroup"
    )
    clock = health.memory._clock
    assert isinstance(clock, Clock)
    try:
        (fd,) = health.descriptors()
        assert health.read().memory[0].level == 0
        writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.write(writer, b"pressure\n")
        os.close(writer)
        health.ready(fd)
        (reading,) = health.read().memory
        assert (reading.name, reading.level, reading.trigger) == ("systemd", 1, True)
        clock.now += 4.1  # two of the written trigger's 2 s windows
        assert health.read().memory[0].level == 0
    finally:
        health.close()


def test_memory_pressure_watch_socket_gets_the_trigger_and_its_events(tmp_path: Path) -> None:
    path = tmp_path / "run/npu.sock"
    path.parent.mkdir(parents=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    spec = base64.b64encode(b"full 100000 2000000").decode()
    health = source(
        tmp_path, {psi.WATCH_ENV: "/run/npu.sock", psi.WRITE_ENV: spec}, memory="cgroup"
    )
    peer, _ = server.accept()
    try:
        assert peer.recv(100) == b"full 100000 2000000"
        peer.sendall(b"\n")
        (fd,) = health.descriptors()
        health.ready(fd)
        assert health.read().memory_pressure == 1
        peer.close()
        health.ready(fd)  # the peer went away: the watch ends, nothing breaks
        assert health.descriptors() == {}
    finally:
        health.close()
        server.close()


# The accelerator ---------------------------------------------------------------------------


def test_accel_readings(tmp_path: Path) -> None:
    tree.accel(tmp_path, 0, busy_us=123_456, memory=512 << 20, freq=700, max_freq=1400)
    tree.accel(tmp_path, 1, busy_us=5, memory=0, freq=0, max_freq=1850, legacy=True)
    first, second = source(tmp_path).read().devices
    assert first.model_dump() == {
        "device": 0,
        "name": "accel0",
        "busy_time_us": 123_456,
        "memory_used_bytes": 512 << 20,
        "frequency_mhz": 700,
        "max_frequency_mhz": 1400,
    }
    assert (second.device, second.frequency_mhz, second.max_frequency_mhz) == (1, 0, 1850)


def test_missing_and_garbage_accel_files_turn_those_readings_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tree.accel(tmp_path, 0, busy_us=10, memory=20, freq=30, max_freq=40)
    (tmp_path / "sys/class/accel/accel0/device/npu_memory_utilization").unlink()
    tree.write(tmp_path, "/sys/class/accel/accel0/device/freq/current_freq", "-5\n")
    with caplog.at_level(logging.WARNING, logger="npumanager.health.linux"):
        health = source(tmp_path)
        (reading,) = health.read().devices
        health.read()
    assert (reading.busy_time_us, reading.memory_used_bytes) == (10, None)
    assert (reading.frequency_mhz, reading.max_frequency_mhz) == (None, 40)
    assert len([r for r in caplog.records if "accel0" in r.getMessage()]) == 2
