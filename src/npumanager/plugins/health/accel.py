"""The accelerator's own counters under `/sys/class/accel/accel*/device/` (Intel's ivpu names).

`npu_busy_time_us` (time spent executing, a counter), `npu_memory_utilization` (bytes in
use), `freq/current_freq` (MHz now, 0 while idle) against `freq/hw_max_freq`, or the older
`npu_current_frequency_mhz` / `npu_max_frequency_mhz`. accelN is device N.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from npumanager.plugins.health.files import Files, numbered
from npumanager.schemas import DeviceReading
from npumanager.schemas.limits import MAX_DEVICES

_FIELDS = {
    "busy_time_us": ("npu_busy_time_us",),
    "memory_used_bytes": ("npu_memory_utilization",),
    "frequency_mhz": ("freq/current_freq", "npu_current_frequency_mhz"),
    "max_frequency_mhz": ("freq/hw_max_freq", "npu_max_frequency_mhz"),
}
"""Each reading and the files that may hold it, newest name first."""


@dataclass
class Accel:
    """One accelerator: its device number and the file of each reading it has."""

    name: str
    device: int
    paths: dict[str, Path]


def discover(files: Files) -> list[Accel]:
    """The accelerators under the root, each with the files it has (a missing one logged)."""
    accels = []
    for number, directory in numbered(files.path("/sys/class/accel"), "accel"):
        if number >= MAX_DEVICES:
            continue
        paths = {}
        for key, names in _FIELDS.items():
            candidates = [directory / "device" / name for name in names]
            present = next((p for p in candidates if p.exists()), None)
            if present is None:
                files.off(candidates[0], "missing")
            else:
                paths[key] = present
        accels.append(Accel(directory.name, number, paths))
    return accels


def read_accel(files: Files, accel: Accel) -> DeviceReading:
    """The accelerator's counters now; a reading that fails is left out."""
    values = {key: files.integer(path, low=0) for key, path in accel.paths.items()}
    return DeviceReading(device=accel.device, name=accel.name, **values)
