"""The platform's constant names carry the platform's values, as attributes of npumanager."""

from __future__ import annotations

import subprocess
import sys

import pytest

import npumanager
from npumanager.schemas import constants

PLATFORM_VALUES = {
    "NPU_MODEL_LOAD_STATUS_CAN_LOAD_NOW": 0,
    "NPU_MODEL_LOAD_STATUS_WAIT_FOR_UNLOAD": 1,
    "NPU_MODEL_LOAD_STATUS_NOT_PRIORITIZED": 2,
    "NPU_MODEL_LOAD_REQUEST_STATUS_CANCELLED": 3,
    "NPU_MODEL_LOAD_REQUEST_STATUS_COMPLETE": 4,
    "NPU_MODEL_SIZE_LESS_THAN_1GB": 0,
    "NPU_MODEL_SIZE_BETWEEN_1GB_AND_2GB": 1,
    "NPU_MODEL_SIZE_GREATER_THAN_2G": 2,
    "NPU_MODEL_PRIORITY_NORMAL": 0,
    "NPU_MODEL_PRIORITY_BACKGROUND": 1000,
    "NPU_MODEL_PRIORITY_OPPORTUNISTIC": 2000,
    "NPU_MODEL_POLICY_STATUS_QUO": 0,
    "NPU_MODEL_POLICY_TURN_TAKING": 1,
    "NPU_MODEL_POLICY_BUDGET": 2,
    "NPU_START_REASON_INITIAL": 0,
    "NPU_START_REASON_RESUMED": 1,
    "NPU_END_REASON_CANCELLED_USER": 0,
    "NPU_END_REASON_CANCELLED_SYSTEM": 1,
    "NPU_END_REASON_PAUSED": 2,
    "NPU_END_REASON_FAILED": 3,
    "NPU_END_REASON_COMPLETED": 4,
    "DEBOUNCE_DURATION_MS": 50,
    "MIN_PRIORITY": 0,
    "MAX_PRIORITY": 1000,
    "IMPORTANCE_FOREGROUND": 100,
    "IMPORTANCE_FOREGROUND_SERVICE": 125,
    "IMPORTANCE_VISIBLE": 200,
    "IMPORTANCE_PERCEPTIBLE": 230,
    "IMPORTANCE_SERVICE": 300,
    "IMPORTANCE_TOP_SLEEPING": 325,
    "IMPORTANCE_CANT_SAVE_STATE": 350,
    "IMPORTANCE_CACHED": 400,
    "IMPORTANCE_GONE": 1000,
    "THERMAL_STATUS_NONE": 0,
    "THERMAL_STATUS_LIGHT": 1,
    "THERMAL_STATUS_MODERATE": 2,
    "THERMAL_STATUS_SEVERE": 3,
    "THERMAL_STATUS_CRITICAL": 4,
    "THERMAL_STATUS_EMERGENCY": 5,
    "THERMAL_STATUS_SHUTDOWN": 6,
}


@pytest.mark.parametrize(("name", "value"), sorted(PLATFORM_VALUES.items()))
def test_platform_constant(name: str, value: int) -> None:
    assert getattr(npumanager, name) == value
    assert name in npumanager.__all__


def test_every_exported_constant_is_checked_or_ours() -> None:
    ours = {n for n in constants.__all__ if n.startswith("NPU_UNLOAD_REASON_")}
    assert set(constants.__all__) - ours == set(PLATFORM_VALUES)
    assert sorted(getattr(npumanager, n) for n in ours) == list(range(len(ours)))


def test_constants_are_typed_enum_members() -> None:
    assert npumanager.NPU_MODEL_SIZE_GREATER_THAN_2G is npumanager.ModelSize.GREATER_THAN_2G
    assert npumanager.IMPORTANCE_CACHED is npumanager.Importance.CACHED


def test_printing_a_constant_prints_its_value() -> None:
    output = subprocess.run(
        [
            sys.executable,
            "-c",
            "import npumanager; print(npumanager.NPU_MODEL_SIZE_GREATER_THAN_2G)",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert output == "2\n"
