"""The built-in health sources, registered through the same hook as any third party's.

`linux` reads the kernel: PSI memory pressure, thermal zones and the accelerator's sysfs
(see `linux`). Its module is imported on first use, so discovery stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from npumanager.core.plugins.hookspecs import hookimpl
from npumanager.schemas import HealthSourceRecord


def _linux(**options: Any) -> Any:
    from npumanager.plugins.health.linux import linux

    return linux(**options)


@hookimpl
def npumanager_register_health_sources() -> Iterable[HealthSourceRecord]:
    """The built-in health sources."""
    return [
        HealthSourceRecord(
            name="linux",
            factory=_linux,
            description="PSI memory pressure, thermal zones and accel sysfs of this machine",
        )
    ]
