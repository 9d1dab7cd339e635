"""Thermal zones (`/sys/class/thermal/thermal_zone*/`) as severities, by trip point or threshold.

A zone's severity is the highest of its trip points that its `temp` has reached: `active`
LIGHT (fans), `passive` MODERATE (the kernel throttles), `hot` SEVERE, `critical` CRITICAL
(the kernel shuts down beyond it). With configured thresholds (m°C at which LIGHT,
MODERATE, ... begin) those replace the trip points for every zone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from npumanager.plugins.health.files import Files, numbered
from npumanager.schemas import ThermalReading, ThermalSeverity

TRIP_SEVERITY = {
    "active": ThermalSeverity.LIGHT,
    "passive": ThermalSeverity.MODERATE,
    "hot": ThermalSeverity.SEVERE,
    "critical": ThermalSeverity.CRITICAL,
}
"""What reaching a trip point of each kernel type means for the accelerator."""
ABSOLUTE_ZERO_MC = -273_150
_TRIP_TYPE = re.compile(r"^trip_point_(\d+)_type$")


@dataclass(frozen=True)
class ZoneRule:
    """A zone pattern (glob over its `type` or directory name) and the device it counts for."""

    pattern: str
    device: int | None


@dataclass
class Zone:
    """One thermal zone the source reads: its temperature file and its trip points."""

    name: str
    kind: str
    temp: Path
    device: int | None
    trips: list[tuple[int, ThermalSeverity]]


def parse_rules(text: str) -> list[ZoneRule]:
    """`PATTERN/N:PATTERN/...` as rules; an item with `N:` counts for device N only."""
    rules = []
    for item in filter(None, text.split("/")):
        device, colon, pattern = item.partition(":")
        if colon and device.isdigit():
            rules.append(ZoneRule(pattern, int(device)))
        else:
            rules.append(ZoneRule(item, None))
    return rules


def _matches(pattern: str, zone: str, kind: str) -> bool:
    return fnmatchcase(kind, pattern) or fnmatchcase(zone, pattern)


def discover(
    files: Files, rules: list[ZoneRule], exclude: list[str], thresholds: bool
) -> list[Zone]:
    """The zones under the root that the rules pick (first matching rule wins), sorted."""
    zones = []
    for _, directory in numbered(files.path("/sys/class/thermal"), "thermal_zone"):
        kind = files.text(directory / "type")
        if kind is None:
            continue
        if any(_matches(pattern, directory.name, kind) for pattern in exclude):
            continue
        rule = next((r for r in rules if _matches(r.pattern, directory.name, kind)), None)
        if rule is None:
            continue
        trips = [] if thresholds else _trips(files, directory)
        zones.append(Zone(directory.name, kind, directory / "temp", rule.device, trips))
    return zones


def _trips(files: Files, directory: Path) -> list[tuple[int, ThermalSeverity]]:
    trips = []
    try:
        names = sorted(p.name for p in directory.iterdir())
    except OSError:
        return []
    for name in names:
        match = _TRIP_TYPE.match(name)
        if match is None:
            continue
        kind = files.text(directory / name)
        if kind is None:
            continue
        severity = TRIP_SEVERITY.get(kind)
        if severity is None:
            files.off(directory / name, f"unknown trip type {kind[:40]!r}")
            continue
        temp = files.integer(directory / f"trip_point_{match.group(1)}_temp", low=1)
        if temp is not None:
            trips.append((temp, severity))
    return trips


def read_zone(files: Files, zone: Zone, thresholds: tuple[int, ...]) -> ThermalReading | None:
    """The zone's temperature and severity now; None if its temperature cannot be read."""
    temp = files.integer(zone.temp, low=ABSOLUTE_ZERO_MC)
    if temp is None:
        return None
    if thresholds:
        severity = ThermalSeverity(sum(1 for t in thresholds if temp >= t))
    else:
        severity = max((s for trip, s in zone.trips if temp >= trip), default=ThermalSeverity.NONE)
    return ThermalReading(
        name=f"{zone.name}:{zone.kind}"[:128],
        device=zone.device,
        temperature_mc=temp,
        severity=severity,
    )
