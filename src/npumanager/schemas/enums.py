"""The enumerations of the framework and the HAL, with the platform's values."""

from __future__ import annotations

from enum import IntEnum, StrEnum


class ModelLoadStatus(IntEnum):
    """What `~npumanager.ModelLoadRequestCallback.on_can_load_model` tells a client it may do
    now."""

    CAN_LOAD_NOW = 0
    WAIT_FOR_UNLOAD = 1
    NOT_PRIORITIZED = 2


class ModelLoadRequestStatus(IntEnum):
    """How a model-load request ended, given to
    `~npumanager.ModelLoadRequestCallback.on_model_load_request_complete`."""

    CANCELLED = 3
    COMPLETE = 4


class ModelSize(IntEnum):
    """A client's estimate of its model's size class."""

    LESS_THAN_1GB = 0
    BETWEEN_1GB_AND_2GB = 1
    GREATER_THAN_2G = 2


class ModelPriority(IntEnum):
    """The priority a client intends for its model; lower is more important."""

    NORMAL = 0
    BACKGROUND = 1000
    OPPORTUNISTIC = 2000


class ModelPolicy(IntEnum):
    """The platform's model-loading policies."""

    STATUS_QUO = 0
    TURN_TAKING = 1
    BUDGET = 2


class StartReason(IntEnum):
    """Why work started executing (HAL `StartReason`)."""

    INITIAL = 0
    RESUMED = 1


class EndReason(IntEnum):
    """Why work stopped executing (HAL `EndReason`)."""

    CANCELLED_USER = 0
    CANCELLED_SYSTEM = 1
    PAUSED = 2
    FAILED = 3
    COMPLETED = 4


class UnloadReason(IntEnum):
    """Why the service asks a client to unload its model (our extension)."""

    HIGHER_PRIORITY_REQUEST = 0
    THERMAL = 1
    MEMORY_PRESSURE = 2
    POLICY_CHANGE = 3
    TURN_TAKING = 4
    CLIENT_UNRESPONSIVE = 5
    MODEL_HOST_ENDED = 6
    """The model's host died (a crash, its memory limit): the daemon took the model back."""
    OVER_GRANT = 7
    """The model's host used more CPU time than the daemon granted it, as the kernel counts
    it, and was killed."""


class Importance(IntEnum):
    """A process's importance, as the platform's activity manager ranks it."""

    FOREGROUND = 100
    FOREGROUND_SERVICE = 125
    VISIBLE = 200
    PERCEPTIBLE = 230
    SERVICE = 300
    TOP_SLEEPING = 325
    CANT_SAVE_STATE = 350
    CACHED = 400
    GONE = 1000


class ThermalSeverity(IntEnum):
    """The platform's thermal throttling severities, NONE to SHUTDOWN."""

    NONE = 0
    LIGHT = 1
    MODERATE = 2
    SEVERE = 3
    CRITICAL = 4
    EMERGENCY = 5
    SHUTDOWN = 6


class PluginKind(StrEnum):
    """The kinds of thing a plugin can register."""

    DRIVER = "driver"
    POLICY = "policy"
    SINK = "sink"
    HEALTH_SOURCE = "health_source"
    IMPORTANCE_SOURCE = "importance_source"


class PluginStatus(StrEnum):
    """What became of a plugin found at discovery."""

    LOADED = "loaded"
    EMPTY = "registered nothing"
    BROKEN = "broken"
    DISABLED = "disabled"
    UNAVAILABLE = "unavailable"


class DriverCapability(StrEnum):
    """Optional abilities a vendor driver may claim; the conformance suite tests only these."""

    PREEMPTION = "preemption"
    THERMAL_MODEL = "thermal_model"
    VIRTUAL_TIME = "virtual_time"
    REAL_TIME = "real_time"
    MULTI_DEVICE = "multi_device"
    FAIR_SHARE = "fair_share"
    """Bands with fair share between uids and a floor for lower bands (`DeviceSpec`)."""
    RESTART_PREEMPTION = "restart_preemption"
    """A running job of a less important band is stopped with the runtime's own cancel to
    make room for a more important one, and requeued: ENDED(PAUSED), later STARTED(RESUMED)
    from the beginning (its progress is lost). Not ``preemption``, which resumes where it
    paused."""
