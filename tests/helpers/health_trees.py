"""Fake sysfs and procfs trees for the health tests: each file written whole (a rename), as
the kernel's would be read."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def write(root: Path, path: str, text: str) -> Path:
    """Put `text` at the machine path `path` under `root`, atomically."""
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(target.name + ".new")
    scratch.write_text(text)
    os.replace(scratch, target)
    return target


def psi_text(some: float, full: float = 0.0) -> str:
    """A PSI file's two lines."""
    return (
        f"some avg10={some:.2f} avg60=0.00 avg300=0.00 total=1\n"
        f"full avg10={full:.2f} avg60=0.00 avg300=0.00 total=1\n"
    )


def memory(root: Path, some: float, full: float = 0.0) -> Path:
    """The system's /proc/pressure/memory."""
    return write(root, "/proc/pressure/memory", psi_text(some, full))


def cgroup(root: Path, relative: str, some: float, mount: str | None = None) -> Path:
    """The process's cgroup (/proc/self/cgroup) and its memory.pressure."""
    write(root, "/proc/self/cgroup", f"0::{relative}\n")
    if mount is not None:
        write(root, "/proc/self/mounts", f"cgroup2 {mount} cgroup2 rw,relatime 0 0\n")
    base = mount or "/sys/fs/cgroup"
    return write(root, f"{base}{relative}/memory.pressure", psi_text(some))


def zone(
    root: Path, n: int, kind: str, temp_mc: int, trips: Sequence[tuple[str, int]] = ()
) -> Path:
    """thermal_zoneN with its type, temp and trip points; the path of its temp file."""
    base = f"/sys/class/thermal/thermal_zone{n}"
    write(root, f"{base}/type", kind + "\n")
    for i, (trip_type, trip_temp) in enumerate(trips):
        write(root, f"{base}/trip_point_{i}_type", trip_type + "\n")
        write(root, f"{base}/trip_point_{i}_temp", f"{trip_temp}\n")
    return write(root, f"{base}/temp", f"{temp_mc}\n")


def heat(root: Path, n: int, temp_mc: int) -> None:
    """A zone's temperature moves."""
    write(root, f"/sys/class/thermal/thermal_zone{n}/temp", f"{temp_mc}\n")


SOC_TRIPS = (("active", 50_000), ("passive", 80_000), ("hot", 95_000), ("critical", 105_000))
"""A laptop package zone's trip points."""


def accel(
    root: Path,
    n: int,
    *,
    busy_us: int = 0,
    memory: int = 0,
    freq: int = 0,
    max_freq: int = 0,
    legacy: bool = False,
) -> None:
    """accelN/device with ivpu's files (the freq/ group, or the older names)."""
    base = f"/sys/class/accel/accel{n}/device"
    write(root, f"{base}/npu_busy_time_us", f"{busy_us}\n")
    write(root, f"{base}/npu_memory_utilization", f"{memory}\n")
    if legacy:
        write(root, f"{base}/npu_current_frequency_mhz", f"{freq}\n")
        write(root, f"{base}/npu_max_frequency_mhz", f"{max_freq}\n")
    else:
        write(root, f"{base}/freq/current_freq", f"{freq}\n")
        write(root, f"{base}/freq/hw_max_freq", f"{max_freq}\n")
