"""The pydantic models can never drift from the AIDL text shipped in the package."""

from __future__ import annotations

from enum import IntEnum
from typing import Annotated

import pytest
from pydantic import BaseModel, Field

from npumanager import EndReason, NpuUuid, SchedulingConfig, StartReason, WorkInfo
from npumanager.schemas import limits
from npumanager.schemas.aidl_text import load_hal, model_parity, parse_aidl
from npumanager.schemas.base import SchemaModel
from npumanager.schemas.types import Int32, Int64, Priority

HAL = load_hal()


def test_every_hal_file_is_shipped() -> None:
    assert set(HAL) == {
        "SchedulingConfig",
        "WorkInfo",
        "NpuUuid",
        "StartReason",
        "EndReason",
        "IScheduling",
        "ISchedulingCallback",
    }
    assert all(decl.package == "android.hardware.npu" for decl in HAL.values())


@pytest.mark.parametrize(
    ("name", "model"),
    [("SchedulingConfig", SchedulingConfig), ("WorkInfo", WorkInfo), ("NpuUuid", NpuUuid)],
)
def test_parcelables_match_their_models(name: str, model: type[BaseModel]) -> None:
    assert HAL[name].kind == "parcelable"
    assert model_parity(HAL[name], model) == []


def test_seed_fields_are_present_in_order() -> None:
    assert [f.name for f in HAL["WorkInfo"].fields] == [
        "id",
        "groupId",
        "uid",
        "debugPid",
        "originalUid",
        "debugFeatureId",
        "jobPriority",
        "effectivePriority",
        "timestampMs",
        "deviceNumber",
    ]
    assert [f.name for f in HAL["SchedulingConfig"].fields] == [
        "minPriority",
        "maxPriority",
        "uid",
        "appPriority",
        "hasDirectAccess",
        "canAttributeOtherUid",
    ]


@pytest.mark.parametrize(("name", "enum"), [("StartReason", StartReason), ("EndReason", EndReason)])
def test_enums_match(name: str, enum: type[IntEnum]) -> None:
    assert HAL[name].members == {member.name: member.value for member in enum}


def test_interface_constants_match_the_limits() -> None:
    assert HAL["IScheduling"].constants == {
        "MIN_PRIORITY": limits.MIN_PRIORITY,
        "MAX_PRIORITY": limits.MAX_PRIORITY,
    }
    assert HAL["ISchedulingCallback"].constants == {
        "DEBOUNCE_DURATION_MS": limits.DEBOUNCE_DURATION_MS
    }
    callback = HAL["ISchedulingCallback"]
    assert callback.oneway
    assert [m.name for m in callback.methods] == ["onWorkRequested", "onWorkStarted", "onWorkEnded"]
    assert [m.name for m in HAL["IScheduling"].methods] == [
        "setSchedulingConfigs",
        "updateSchedulingConfigs",
        "setCallback",
    ]


# The checker itself must catch each kind of drift.


class _Swapped(SchemaModel):
    max_priority: Priority = 1000
    min_priority: Priority = 0
    uid: Int32
    app_priority: Priority
    has_direct_access: bool = True
    can_attribute_other_uid: bool = False


class _WrongType(SchemaModel):
    min_priority: Priority = 0
    max_priority: Priority = 1000
    uid: Int64
    app_priority: str
    has_direct_access: bool = True
    can_attribute_other_uid: int = 0


class _WrongNullability(SchemaModel):
    id: Int32
    group_id: NpuUuid
    uid: Int32
    debug_pid: Int32
    original_uid: Int32 | None
    debug_feature_id: str | None
    job_priority: Int32
    effective_priority: Int32
    timestamp_ms: Int32
    device_number: Int32


class _ShortUuid(SchemaModel):
    value: Annotated[bytes, Field(min_length=8, max_length=8)]


def test_checker_reports_order() -> None:
    (problem,) = model_parity(HAL["SchedulingConfig"], _Swapped)
    assert "fields are ['maxPriority', 'minPriority'" in problem


def test_checker_reports_types() -> None:
    problems = model_parity(HAL["SchedulingConfig"], _WrongType)
    assert any("uid allows" in p and "wider than AIDL int" in p for p in problems)
    assert any("appPriority is <class 'str'>" in p for p in problems)
    assert any("canAttributeOtherUid is <class 'int'>, expected bool" in p for p in problems)


def test_checker_reports_nullability_and_long() -> None:
    problems = model_parity(HAL["WorkInfo"], _WrongNullability)
    assert "_WrongNullability.groupId must be nullable" in problems
    assert "_WrongNullability.originalUid must be not nullable" in problems
    assert any("timestampMs allows" in p and "not an AIDL long" in p for p in problems)


def test_checker_reports_byte_array_size() -> None:
    (problem,) = model_parity(HAL["NpuUuid"], _ShortUuid)
    assert "expected exactly 16 bytes" in problem


def test_checker_reports_a_missing_field() -> None:
    decl = parse_aidl("package a.b; parcelable SchedulingConfig { int uid; int extra; }")
    problems = model_parity(decl, SchedulingConfig)
    assert any("the AIDL has ['uid', 'extra']" in p for p in problems)


@pytest.mark.parametrize(
    "text",
    [
        "package a; parcelable X { int x }",
        "package a; struct X { }",
        "package a; enum E { A = 1, } trailing",
        "package a; parcelable X { int x; } $",
    ],
)
def test_parser_rejects_malformed_text(text: str) -> None:
    with pytest.raises(SyntaxError):
        parse_aidl(text)
