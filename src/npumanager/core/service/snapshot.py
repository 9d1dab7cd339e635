"""A service's state as plain JSON-ready data, for `npu-manager info` and for tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from npumanager.core.arbiter.actions import RequestKey, RequestState
from npumanager.core.arbiter.arbiter import Arbiter
from npumanager.core.arbiter.uids import PINNED
from npumanager.core.driver.contract import Driver
from npumanager.core.plugins.health import HealthBoard
from npumanager.schemas import Importance
from npumanager.telemetry import SinkStats


def build_snapshot(
    arbiter: Arbiter,
    driver: Driver,
    *,
    policy_name: str,
    sinks: Mapping[str, SinkStats],
    callback_errors: int,
    model_devices: Mapping[RequestKey, int] | None = None,
    health: HealthBoard | None = None,
    outside_bytes: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Policy and parameters, configs by uid (with the importance's name), live requests by
    state (with the device a loaded one's model is on), every device, and the health
    sources' readings with what they combine to."""
    placed = model_devices or {}
    outside = outside_bytes or (0,) * driver.device_count
    health = health or HealthBoard()
    policy = arbiter.policy
    params = policy.params.model_dump(mode="json") if policy.params is not None else {}
    by_state: dict[str, list[dict[str, Any]]] = {state.value: [] for state in RequestState}
    for info in arbiter.requests():
        by_state[info.state.value].append(
            {
                "client": info.key.client,
                "uid": info.uid,
                "id": info.request.id,
                "size": info.request.size.name,
                "priority": info.request.priority.name,
                "weight": info.weight,
                "weight_bytes": info.weight_bytes,
                "device": info.device if info.device is not None else placed.get(info.key),
            }
        )
    return {
        "policy": {"name": policy_name, "params": params},
        "priorities": [
            {
                "uid": config.uid,
                "priority": config.app_priority,
                "importance": _importance_name(config.uid, config.app_priority),
                "min_priority": config.min_priority,
                "max_priority": config.max_priority,
                "has_direct_access": config.has_direct_access,
                "can_attribute_other_uid": config.can_attribute_other_uid,
            }
            for config in arbiter.scheduling_configs()
        ],
        "requests": by_state,
        "devices": [
            _device(driver, device, health, outside[device])
            for device in range(driver.device_count)
        ],
        "sinks": {name: stats._asdict() for name, stats in sinks.items()},
        "memory_pressure": arbiter.memory_pressure,
        "health": health.describe(range(driver.device_count)),
        "callback_errors": callback_errors,
    }


def _importance_name(uid: int, priority: int) -> str | None:
    """The importance a uid's priority stands for; "PINNED" for root and system."""
    if uid in PINNED:
        return "PINNED"
    try:
        return Importance(priority).name
    except ValueError:
        return None


def _device(driver: Driver, number: int, health: HealthBoard, outside: int) -> dict[str, Any]:
    status = driver.device_state(number)
    severity = max(status.severity, health.severity(number))
    return {
        "device": number,
        "weight_memory_bytes": status.weight_memory_bytes,
        "weight_memory_used_bytes": status.weight_memory_used_bytes,
        "weight_memory_outside_bytes": outside,
        "models_loaded": status.models_loaded,
        "queue_depth": status.queue_depth,
        "running": sum(work >= 0 for work in status.running),
        "channels": len(status.running),
        "temperature_c": status.temperature_mc / 1000,
        "severity": severity.name,
        "driver_severity": status.severity.name,
        "shutdown": status.shutdown,
    }
