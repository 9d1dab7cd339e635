"""The `onnxruntime` driver: ONNX models run for real in `InferenceSession`s (extra `onnxruntime`).

This module imports neither `onnxruntime` nor `onnx`. The registration hook only checks
that both can be found; when they cannot, it registers nothing and logs (at info level:
an absent optional driver is no problem) which extra to install, so `npu-manager plugins`
works without it. The driver itself lives in `npumanager.vendor_drivers.onnxruntime.driver`.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable

from npumanager.core.plugins.factories import LazyFactory
from npumanager.core.plugins.hookspecs import hookimpl
from npumanager.schemas import DriverCapability, DriverRecord

log = logging.getLogger(__name__)

CAPABILITIES = frozenset(
    {
        DriverCapability.REAL_TIME,
        DriverCapability.MULTI_DEVICE,
        DriverCapability.FAIR_SHARE,
        DriverCapability.RESTART_PREEMPTION,
    }
)
"""What the driver claims: real execution on the monotonic clock, several devices, fair
share between uids at dispatch (bands, virtual runtime, floor), and RESTART_PREEMPTION (a
running job of a less important band is stopped with `RunOptions.terminate` and starts over
when a more important one finds no free channel). No PREEMPTION (a running inference is
never paused and resumed), no THERMAL_MODEL, no VIRTUAL_TIME."""

EXTRA_HINT = "pip install 'npu-manager[onnxruntime]'"


def available() -> bool:
    """True if `onnxruntime` and `onnx` can be imported."""
    for name in ("onnxruntime", "onnx"):
        try:
            if importlib.util.find_spec(name) is None:
                return False
        except (ImportError, ValueError):  # e.g. sys.modules[name] is None
            return False
    return True


@hookimpl
def npumanager_register_drivers() -> Iterable[DriverRecord]:
    """Register `onnxruntime` if the extra is installed; otherwise nothing (logged at info)."""
    if not available():
        log.info(
            "driver 'onnxruntime' not registered: onnxruntime/onnx are not installed (%s)",
            EXTRA_HINT,
        )
        return []
    return [
        DriverRecord(
            name="onnxruntime",
            factory=LazyFactory(
                "npumanager.vendor_drivers.onnxruntime.driver", "OnnxRuntimeDriver"
            ),
            capabilities=CAPABILITIES,
            description="ONNX models run for real in onnxruntime sessions, fair-scheduled",
        )
    ]


@hookimpl
def npumanager_unavailable() -> Iterable[tuple[str, str, str]]:
    """The driver, when the extra is not installed, and how to install it."""
    return [] if available() else [("driver", "onnxruntime", EXTRA_HINT)]
