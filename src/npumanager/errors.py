"""The exceptions a user of npu-manager may catch; the CLI prints these as one line."""

from __future__ import annotations


class NpuManagerError(Exception):
    """Base of every error that reports a user's or a plugin's mistake, not a bug."""


class ConfigError(NpuManagerError, ValueError):
    """A configuration file or environment variable holds a value that is not allowed."""


class PluginError(NpuManagerError):
    """A plugin failed to load or registered something invalid (raised in strict mode)."""


class UnknownPluginError(NpuManagerError, LookupError):
    """A driver, policy or sink name that no installed plugin registered."""


class PluginWarning(UserWarning):
    """A broken plugin was skipped; the message names its distribution."""


class IllegalArgumentError(NpuManagerError, ValueError):
    """A HAL call got an argument the HAL forbids (the platform's ILLEGAL_ARGUMENT)."""


class CapacityError(NpuManagerError, ValueError):
    """A model does not fit in what the device has left; nothing was loaded."""


class UnknownDeviceError(NpuManagerError, LookupError):
    """A device number the driver does not have."""


class UnknownModelError(NpuManagerError, LookupError):
    """A model handle that is not loaded (never was, or already unloaded)."""


class UnknownWorkError(NpuManagerError, LookupError):
    """A work id that is not live: never submitted, or already ended."""


class DriverClosedError(NpuManagerError, RuntimeError):
    """The driver was closed; it accepts no more calls."""


class DuplicateRequestError(NpuManagerError, ValueError):
    """A client reused the id of one of its requests that is still live."""

    @classmethod
    def of(cls, request_id: int) -> DuplicateRequestError:
        """The error for reusing ``request_id``, worded once for every place that checks."""
        return cls(
            f"request id {request_id} is already live for this client; ids may be reused "
            "only after the request completes"
        )


class UnknownRequestError(NpuManagerError, LookupError):
    """No live request of this client has that id (never made, ended, or someone else's)."""


class RequestStateError(NpuManagerError, ValueError):
    """A notification that the request's state does not allow, e.g. loaded before granted."""


class PolicyParamsError(NpuManagerError, ValueError):
    """Parameters that the chosen policy does not accept."""


class NpuPermissionError(NpuManagerError, PermissionError):
    """The caller lacks the permission the call needs (the management permission)."""


class FeatureNotDeclaredError(NpuPermissionError):
    """A client that did not declare the NPU feature, on a service that blocks such clients."""


class FeatureWarning(UserWarning):
    """A client used the NPU without declaring the feature (the platform's uses-feature)."""


class DaemonUnavailableError(NpuManagerError, ConnectionError):
    """No daemon answers on the socket, or it closed the connection."""


class DaemonError(NpuManagerError):
    """The daemon refused a frame or failed a call for a reason no other error names."""


class QuotaExceededError(NpuManagerError, PermissionError):
    """A daemon client is at one of its uid's limits (connections, requests, models)."""


class ExecutionError(NpuManagerError, RuntimeError):
    """The runtime failed an inference (the work ended FAILED); the runtime's message."""


class ModelHostError(NpuManagerError, RuntimeError):
    """The model host that ran this client's models died or did not answer: its models
    are gone (their work ended CANCELLED_SYSTEM); the message says why. Load again."""
