"""npu-manager: one arbiter between the apps that want a neural accelerator and its driver.

The platform's constant names are attributes of this module with the platform's values,
e.g. `npumanager.NPU_MODEL_SIZE_GREATER_THAN_2G == 2`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from npumanager.core.client.lease import AsyncLease, Lease, LeaseEndedError
from npumanager.core.client.manager import (
    LoadedModel,
    ModelLoadRequestCallback,
    ModelLoadStatusListener,
    NpuManager,
)
from npumanager.core.driver.contract import (
    BatchCallback,
    Driver,
    DriverBase,
    RealClock,
    SchedulingCallback,
    ThermalModel,
    VirtualClock,
)
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.core.plugins.hookspecs import hookimpl
from npumanager.core.plugins.registry import PluginRegistry, load_plugins
from npumanager.core.service.service import Service
from npumanager.daemon.client.client import DaemonClient, connect
from npumanager.errors import (
    CapacityError,
    ConfigError,
    DaemonError,
    DaemonUnavailableError,
    DuplicateRequestError,
    ExecutionError,
    IllegalArgumentError,
    ModelHostError,
    NpuManagerError,
    NpuPermissionError,
    PluginError,
    PluginWarning,
    PolicyParamsError,
    RequestStateError,
    UnknownDeviceError,
    UnknownModelError,
    UnknownPluginError,
    UnknownRequestError,
    UnknownWorkError,
)
from npumanager.schemas import *  # noqa: F403
from npumanager.schemas import __all__ as _schema_names
from npumanager.schemas.device import DeviceDescription, DeviceSpec, DeviceStatus, ThermalSpec
from npumanager.telemetry import (
    DeviceSample,
    EventSink,
    ModelLoadRequested,
    ModelLoadState,
    ModelLoadStateChanged,
    Sink,
    SinkHandle,
    SinkStats,
    TelemetryEvent,
)
from npumanager.vendor_drivers.reference.engine import ReferenceEngine
from npumanager.vendor_drivers.simulated import Engine, EngineDriver, SimulatedDriver

try:
    __version__ = version("npu-manager")
except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
    __version__ = "0+unknown"

__all__ = [  # noqa: PLE0604
    *_schema_names,
    "AsyncLease",
    "BatchCallback",
    "CapacityError",
    "ConfigError",
    "DaemonClient",
    "DaemonError",
    "DaemonUnavailableError",
    "DeviceDescription",
    "DuplicateRequestError",
    "DeviceSample",
    "DeviceSpec",
    "DeviceStatus",
    "Driver",
    "DriverBase",
    "Engine",
    "EngineDriver",
    "EventKind",
    "EventSink",
    "ExecutionError",
    "IllegalArgumentError",
    "Lease",
    "LeaseEndedError",
    "LoadedModel",
    "ModelHostError",
    "ModelLoadRequestCallback",
    "ModelLoadRequested",
    "ModelLoadState",
    "ModelLoadStateChanged",
    "ModelLoadStatusListener",
    "NpuManager",
    "Service",
    "NpuManagerError",
    "NpuPermissionError",
    "PluginError",
    "PluginRegistry",
    "PluginWarning",
    "PolicyParamsError",
    "RealClock",
    "ReferenceEngine",
    "RequestStateError",
    "SchedulingCallback",
    "SimulatedDriver",
    "Sink",
    "SinkHandle",
    "SinkStats",
    "TelemetryEvent",
    "ThermalModel",
    "ThermalSpec",
    "UnknownDeviceError",
    "UnknownModelError",
    "UnknownPluginError",
    "UnknownRequestError",
    "UnknownWorkError",
    "VirtualClock",
    "WorkEvent",
    "__version__",
    "connect",
    "hookimpl",
    "load_plugins",
]
