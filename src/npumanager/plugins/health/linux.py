"""The `linux` health source: PSI memory pressure, thermal zones and the accelerator's sysfs.

Options (`linux:KEY=VALUE,...`; lists are separated by `/`):

- `root` (default `/`): read every path under this directory instead (fake trees);
- `interval_ms` (default 1000): how often everything is read (PSI triggers wake it sooner);
- `memory` (default `system/cgroup`): which PSI files count; empty for none;
- `some_moderate`, `some_critical` (default 10 and 40): the `some` stall shares, in
  percent of avg10 or of a trigger's window, at which memory pressure is 1 and 2;
- `triggers` (`auto`, `on`, `off`; default `auto`: on when `root` is `/`), and
  `trigger_window_ms` (default 2000, 500..10000; rounded up to a multiple of 2 s
  without CAP_SYS_RESOURCE);
- `zones` (default `*`): glob patterns over a zone's `type` or directory name; an item
  `N:PATTERN` counts for device N only, others for every device; `exclude` (default
  radios, batteries and storage) drops zones first;
- `thresholds_mc` (default none: trip points): temperatures at which LIGHT, MODERATE,
  SEVERE, ... begin, e.g. `70000/85000/95000`, used instead of every zone's trip points;
- `accel` (default true): read `/sys/class/accel/accel*/device/`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from npumanager.checks import validate_options
from npumanager.plugins.health import accel, thermal
from npumanager.plugins.health.files import Files
from npumanager.plugins.health.psi import Memory, PsiLevels
from npumanager.schemas import HealthSample, ThermalSeverity
from npumanager.schemas.limits import (
    DEFAULT_PSI_SOME_CRITICAL,
    DEFAULT_PSI_SOME_MODERATE,
    DEFAULT_PSI_WINDOW_MS,
    HEALTH_READ_INTERVAL_MS,
    MAX_HEALTH_READ_INTERVAL_MS,
    MIN_HEALTH_READ_INTERVAL_MS,
    PSI_MAX_WINDOW_MS,
    PSI_MIN_WINDOW_MS,
)

MEMORY_PLACES = ("system", "cgroup")
DEFAULT_EXCLUDE = "iwlwifi*/*wifi*/ath*/BAT*/battery*/nvme*/INT3400*"
"""Zones that say nothing about the accelerator: radios, batteries, disks, DPTF's pseudo-zone."""
Share = Annotated[float, Field(gt=0, le=100)]


class LinuxOptions(BaseModel):
    """The `linux` source's options, validated (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    root: str = "/"
    interval_ms: Annotated[
        int, Field(ge=MIN_HEALTH_READ_INTERVAL_MS, le=MAX_HEALTH_READ_INTERVAL_MS)
    ] = HEALTH_READ_INTERVAL_MS
    memory: str = "/".join(MEMORY_PLACES)
    some_moderate: Share = DEFAULT_PSI_SOME_MODERATE
    some_critical: Share = DEFAULT_PSI_SOME_CRITICAL
    triggers: Literal["auto", "on", "off"] = "auto"
    trigger_window_ms: Annotated[int, Field(ge=PSI_MIN_WINDOW_MS, le=PSI_MAX_WINDOW_MS)] = (
        DEFAULT_PSI_WINDOW_MS
    )
    zones: str = "*"
    exclude: str = DEFAULT_EXCLUDE
    thresholds_mc: tuple[int, ...] = ()
    accel: bool = True

    @field_validator("memory")
    @classmethod
    def _places(cls, value: str) -> str:
        unknown = set(filter(None, value.split("/"))) - set(MEMORY_PLACES)
        if unknown:
            raise ValueError(f"memory places are {'/'.join(MEMORY_PLACES)}; got {sorted(unknown)}")
        return value

    @field_validator("thresholds_mc", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return (value,)
        if isinstance(value, str):
            try:
                return tuple(int(v) for v in filter(None, value.split("/")))
            except ValueError:
                raise ValueError(
                    f"thresholds_mc are whole m°C separated by '/'; got {value!r}"
                ) from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.some_critical <= self.some_moderate:
            raise ValueError(
                f"some_critical ({self.some_critical}) must be above some_moderate "
                f"({self.some_moderate})"
            )
        t = list(self.thresholds_mc)
        if len(t) > ThermalSeverity.SHUTDOWN or t != sorted(set(t)):
            raise ValueError(
                f"thresholds_mc: at most {int(ThermalSeverity.SHUTDOWN)} temperatures, "
                f"strictly increasing, for LIGHT, MODERATE, ...; got {t}"
            )
        return self


def options_of(options: Mapping[str, Any]) -> LinuxOptions:
    """The options validated, or `IllegalArgumentError` naming the problem and the allowed ones."""
    return validate_options("health source 'linux'", LinuxOptions, options)


class LinuxHealth:
    """Reads the machine's PSI, thermal zones and accelerators (see the module docstring)."""

    def __init__(
        self,
        options: LinuxOptions | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        options = options or LinuxOptions()
        self.options = options
        self.interval_ms = options.interval_ms
        self.files = Files(options.root)
        real_root = os.path.realpath(options.root) == "/"
        self.memory = Memory(
            self.files,
            [p for p in options.memory.split("/") if p],
            PsiLevels(options.some_moderate, options.some_critical, options.trigger_window_ms),
            triggers=options.triggers == "on" or (options.triggers == "auto" and real_root),
            environ=os.environ if environ is None else environ,
            clock=clock,
        )
        thresholds = bool(options.thresholds_mc)
        exclude = [p for p in options.exclude.split("/") if p]
        self.zones = thermal.discover(
            self.files, thermal.parse_rules(options.zones), exclude, thresholds
        )
        self.accels = accel.discover(self.files) if options.accel else []

    def read(self) -> HealthSample:
        """Everything readable now; what cannot be read is left out."""
        zones = [thermal.read_zone(self.files, z, self.options.thresholds_mc) for z in self.zones]
        return HealthSample(
            memory=tuple(self.memory.read()),
            thermal=tuple(z for z in zones if z is not None),
            devices=tuple(accel.read_accel(self.files, a) for a in self.accels),
        )

    def descriptors(self) -> dict[int, int]:
        """The PSI triggers' descriptors, polled by the health thread."""
        return self.memory.descriptors()

    def ready(self, fd: int) -> None:
        """A PSI trigger fired (or broke)."""
        self.memory.ready(fd)

    def close(self) -> None:
        """Release the triggers."""
        self.memory.close()


def linux(**options: Any) -> LinuxHealth:
    """The `linux` source from its options (`IllegalArgumentError` for a bad one)."""
    return LinuxHealth(options_of(options))
