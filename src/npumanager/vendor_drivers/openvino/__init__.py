"""The `openvino` driver: models run for real by OpenVINO on NPU, GPU or CPU (extra `openvino`).

This module imports neither `openvino` nor `onnx`; without them it registers nothing and
logs (at info level) which extra to install. The driver lives in
`npumanager.vendor_drivers.openvino.driver`.
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
"""Real execution on the monotonic clock, several devices, fair share at dispatch, and
RESTART_PREEMPTION (a running request of a less important band is stopped with
`InferRequest.cancel()` and starts over). No PREEMPTION (a running request is never paused
and resumed), no THERMAL_MODEL, no VIRTUAL_TIME."""

EXTRA_HINT = "pip install 'npu-manager[openvino]'"


def available() -> bool:
    """True if `openvino` and `onnx` can be imported."""
    for name in ("openvino", "onnx"):
        try:
            if importlib.util.find_spec(name) is None:
                return False
        except (ImportError, ValueError):
            return False
    return True


@hookimpl
def npumanager_register_drivers() -> Iterable[DriverRecord]:
    """Register `openvino` if the extra is installed; otherwise nothing (logged at info)."""
    if not available():
        log.info(
            "driver 'openvino' not registered: openvino/onnx are not installed (%s)", EXTRA_HINT
        )
        return []
    return [
        DriverRecord(
            name="openvino",
            factory=LazyFactory("npumanager.vendor_drivers.openvino.driver", "OpenVinoDriver"),
            capabilities=CAPABILITIES,
            description="models run for real by OpenVINO (NPU if present, else CPU)",
        )
    ]


@hookimpl
def npumanager_unavailable() -> Iterable[tuple[str, str, str]]:
    """The driver, when the extra is not installed, and how to install it."""
    return [] if available() else [("driver", "openvino", EXTRA_HINT)]
