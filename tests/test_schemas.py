"""Every schema rule, valid and invalid, and the JSON round trip by alias."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError

import npumanager
from npumanager import (
    ModelLoadRequest,
    ModelPriority,
    ModelSize,
    NpuUuid,
    SchedulingConfig,
    SchedulingConfigV1,
    WorkInfo,
)
from npumanager.schemas.limits import INT32_MAX, INT64_MAX
from npumanager.schemas.types import Int32, Int64

priorities = st.integers(0, 1000)
uids = st.integers(0, INT32_MAX)


@st.composite
def scheduling_configs(draw: st.DrawFn) -> SchedulingConfig:
    low = draw(priorities)
    return SchedulingConfig(
        min_priority=low,
        max_priority=draw(st.integers(low, 1000)),
        uid=draw(uids),
        app_priority=draw(priorities),
        has_direct_access=draw(st.booleans()),
        can_attribute_other_uid=draw(st.booleans()),
    )


def work_info(**overrides: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "id": 7,
        "groupId": "12345678-90ab-cdef-1122-334455667788",
        "uid": 10001,
        "debugPid": 4242,
        "originalUid": 10001,
        "debugFeatureId": "camera.detect",
        "jobPriority": 250,
        "effectivePriority": 350,
        "timestampMs": 123456789,
        "deviceNumber": 0,
    }
    fields.update(overrides)
    return fields


def error_of(model: type[BaseModel], data: dict[str, object]) -> str:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return str(info.value)


# SchedulingConfig -------------------------------------------------------------------


@pytest.mark.parametrize(
    "field", ["minPriority", "maxPriority", "appPriority", "min_priority", "app_priority"]
)
@pytest.mark.parametrize("value", [-1, 1001])
def test_priority_out_of_range_names_the_field_and_the_range(field: str, value: int) -> None:
    data: dict[str, object] = {"uid": 1, field: value}
    if field.lower() != "apppriority" and field != "app_priority":
        data["appPriority"] = 5
    message = error_of(SchedulingConfig, data)
    assert field in message
    assert "within 0..1000" in message
    assert f"got {value}" in message


@pytest.mark.parametrize("value", [0, 1000])
def test_priority_bounds_are_inclusive(value: int) -> None:
    config = SchedulingConfig(uid=1, app_priority=value, min_priority=value, max_priority=value)
    assert config.app_priority == value


def test_min_above_max_is_rejected() -> None:
    message = error_of(
        SchedulingConfig, {"uid": 1, "appPriority": 0, "minPriority": 600, "maxPriority": 500}
    )
    assert "minPriority (600) must not exceed maxPriority (500)" in message


@pytest.mark.parametrize("uid", [2**31, -1])
def test_uid_must_be_a_non_negative_int32(uid: int) -> None:
    message = error_of(SchedulingConfig, {"uid": uid, "appPriority": 0})
    assert "uid" in message
    assert "0..2147483647" in message


def test_uid_upper_bound_is_accepted() -> None:
    assert SchedulingConfig(uid=INT32_MAX, app_priority=0).uid == INT32_MAX


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("uid", "10"),
        ("appPriority", "5"),
        ("appPriority", 5.0),
        ("hasDirectAccess", 1),
        ("uid", True),
    ],
)
def test_strict_types_refuse_coercion(field: str, value: object) -> None:
    message = error_of(SchedulingConfig, {"uid": 1, "appPriority": 5, field: value})
    assert field in message


def test_unknown_key_is_rejected() -> None:
    message = error_of(SchedulingConfig, {"uid": 1, "appPriority": 5, "priority": 3})
    assert "priority" in message
    assert "Extra inputs are not permitted" in message


def test_both_spellings_accepted_and_alias_used_on_output() -> None:
    by_alias = SchedulingConfig.model_validate(
        {"uid": 3, "appPriority": 200, "hasDirectAccess": False}
    )
    by_name = SchedulingConfig(uid=3, app_priority=200, has_direct_access=False)
    assert by_alias == by_name
    assert json.loads(by_name.model_dump_json()) == {
        "minPriority": 0,
        "maxPriority": 1000,
        "uid": 3,
        "appPriority": 200,
        "hasDirectAccess": False,
        "canAttributeOtherUid": False,
    }


def test_models_are_frozen() -> None:
    config = SchedulingConfig(uid=3, app_priority=200)
    with pytest.raises(ValidationError, match="frozen"):
        config.uid = 4  # type: ignore[misc]


@given(scheduling_configs())
def test_scheduling_config_json_round_trip(config: SchedulingConfig) -> None:
    assert SchedulingConfig.model_validate_json(config.model_dump_json()) == config


@given(scheduling_configs(), priorities)
def test_effective_priority_is_app_plus_clamped_job(config: SchedulingConfig, job: int) -> None:
    effective = config.effective_priority(job)
    assert effective == config.app_priority + min(
        max(job, config.min_priority), config.max_priority
    )
    assert config.app_priority + config.min_priority <= effective
    assert effective <= config.app_priority + config.max_priority


def test_background_app_high_priority_job_is_pulled_down() -> None:
    background = SchedulingConfig(uid=10, app_priority=400, min_priority=300, max_priority=1000)
    assert background.effective_priority(0) == 700
    assert background.effective_priority(900) == 1300


def test_full_range_config_is_exactly_the_platform_rule() -> None:
    config = SchedulingConfig(uid=10, app_priority=300)
    assert [config.effective_priority(j) for j in (0, 250, 1000)] == [300, 550, 1300]


@pytest.mark.parametrize("job", [-1, 1001])
def test_effective_priority_rejects_a_job_priority_out_of_range(job: int) -> None:
    with pytest.raises(ValueError, match=r"job_priority must be within 0\.\.1000"):
        SchedulingConfig(uid=1, app_priority=0).effective_priority(job)


@given(uids, priorities, st.booleans(), st.booleans())
def test_v1_round_trip_is_lossless(uid: int, priority: int, direct: bool, attr: bool) -> None:
    v1 = SchedulingConfigV1(
        uid=uid, priority=priority, has_direct_access=direct, can_attribute_other_uid=attr
    )
    config = SchedulingConfig.from_v1(v1)
    assert config.to_v1() == v1
    assert SchedulingConfig.from_v1(config.to_v1()) == config
    assert config.effective_priority(500) == priority + 500


def test_v1_refuses_a_narrowed_config() -> None:
    narrowed = SchedulingConfig(uid=1, app_priority=0, min_priority=10)
    assert not narrowed.is_v1_representable
    with pytest.raises(ValueError, match=r"v1 form only carries the full range 0\.\.1000"):
        narrowed.to_v1()


def test_v1_validates_its_priority() -> None:
    assert "within 0..1000" in error_of(SchedulingConfigV1, {"uid": 1, "priority": 1001})


# WorkInfo and NpuUuid ---------------------------------------------------------------


def test_work_info_json_round_trip_by_alias() -> None:
    info = WorkInfo.model_validate(work_info())
    dumped = json.loads(info.model_dump_json())
    assert dumped == work_info()
    assert list(dumped) == list(work_info()), "field order is the AIDL's"
    assert WorkInfo.model_validate_json(info.model_dump_json()) == info


work_infos = st.fixed_dictionaries(
    {
        "id": st.integers(0, INT32_MAX),
        "group_id": st.none() | st.uuids().map(lambda u: NpuUuid(value=u.bytes)),
        "uid": uids,
        "debug_pid": st.integers(-(2**31), INT32_MAX),
        "original_uid": uids,
        "debug_feature_id": st.none() | st.text(),
        "job_priority": priorities,
        "effective_priority": st.integers(0, 2000),
        "timestamp_ms": st.integers(0, INT64_MAX),
        "device_number": st.integers(0, INT32_MAX),
    }
).map(lambda fields: WorkInfo(**fields))


@given(work_infos)
def test_work_info_round_trip_property(info: WorkInfo) -> None:
    assert WorkInfo.model_validate_json(info.model_dump_json()) == info
    assert WorkInfo.model_validate(info.model_dump()) == info


def test_nullable_fields_accept_null() -> None:
    info = WorkInfo.model_validate(work_info(groupId=None, debugFeatureId=None))
    assert info.group_id is None
    assert info.debug_feature_id is None


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("timestampMs", 2**63, "within 0..9223372036854775807"),
        ("timestampMs", -1, "non-negative 64-bit"),
        ("id", 2**31, "0..2147483647"),
        ("debugPid", 2**31, "32-bit signed integer"),
        ("debugPid", -(2**31) - 1, "32-bit signed integer"),
        ("effectivePriority", 2001, "within 0..2000"),
        ("jobPriority", -1, "within 0..1000"),
        ("groupId", "not-a-uuid", "UUID string"),
        ("groupId", b"short", "at least 16"),
        ("uid", "10001", "uid"),
        ("unexpected", 1, "Extra inputs are not permitted"),
    ],
)
def test_work_info_rules(field: str, value: object, expected: str) -> None:
    assert expected in error_of(WorkInfo, work_info(**{field: value}))


def test_timestamp_accepts_the_int64_maximum() -> None:
    assert WorkInfo.model_validate(work_info(timestampMs=INT64_MAX)).timestamp_ms == INT64_MAX


def test_int64_bound_is_enforced_in_the_shared_type() -> None:
    assert TypeAdapter(Int64).validate_python(-(2**63)) == -(2**63)
    with pytest.raises(ValidationError, match="64-bit"):
        TypeAdapter(Int64).validate_python(2**63)
    with pytest.raises(ValidationError, match="32-bit"):
        TypeAdapter(Int32).validate_python(-(2**31) - 1)


def test_npu_uuid_forms() -> None:
    text = "12345678-90ab-cdef-1122-334455667788"
    parsed = NpuUuid.parse(text)
    assert str(parsed) == text
    assert parsed.value == bytes.fromhex("1234567890abcdef1122334455667788")
    assert NpuUuid.model_validate(uuid.UUID(text)) == parsed
    assert NpuUuid(value=parsed.value) == parsed
    assert parsed.model_dump(mode="json") == text
    assert NpuUuid.random() != NpuUuid.random()
    assert NpuUuid.model_json_schema() == {
        "title": "NpuUuid",
        "description": "A 128-bit identifier, as a standard UUID string.",
        "type": "string",
        "format": "uuid",
    }


# ModelLoadRequest -------------------------------------------------------------------


def test_builder_defaults_and_setters() -> None:
    default = ModelLoadRequest.Builder(1).build()
    assert (default.size, default.priority) == (ModelSize.LESS_THAN_1GB, ModelPriority.NORMAL)
    built = (
        ModelLoadRequest.Builder(42)
        .set_size(npumanager.NPU_MODEL_SIZE_GREATER_THAN_2G)
        .set_priority(npumanager.NPU_MODEL_PRIORITY_BACKGROUND)
        .build()
    )
    assert built == ModelLoadRequest(
        id=42, size=ModelSize.GREATER_THAN_2G, priority=ModelPriority.BACKGROUND
    )
    assert ModelLoadRequest.Builder(42).set_size(2).set_priority(1000).build() == built


def test_request_equality_and_hash_follow_id_size_priority() -> None:
    a = ModelLoadRequest.Builder(1).set_size(1).build()
    assert a == ModelLoadRequest.Builder(1).set_size(1).build()
    assert hash(a) == hash(ModelLoadRequest.Builder(1).set_size(1).build())
    assert a != ModelLoadRequest.Builder(2).set_size(1).build()
    assert a != ModelLoadRequest.Builder(1).set_size(2).build()
    assert a != ModelLoadRequest.Builder(1).set_size(1).set_priority(1000).build()
    assert len({a, ModelLoadRequest.Builder(1).set_size(1).build()}) == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda b: b.set_size(7), "size must be one of LESS_THAN_1GB=0"),
        (lambda b: b.set_priority(5), "priority must be one of NORMAL=0, BACKGROUND=1000"),
        (lambda b: b.set_size("big"), "size must be a ModelSize or its int value"),
        (lambda b: b.set_size(True), "size must be a ModelSize"),
    ],
)
def test_builder_rejects_bad_values(call: object, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        call(ModelLoadRequest.Builder(1))  # type: ignore[operator]


def test_request_id_must_be_a_non_negative_int64() -> None:
    with pytest.raises(ValidationError, match="non-negative 64-bit"):
        ModelLoadRequest.Builder(-1).build()


def test_request_json_round_trip() -> None:
    request = ModelLoadRequest.Builder(9).set_size(1).set_priority(2000).build()
    assert json.loads(request.model_dump_json()) == {"id": 9, "size": 1, "priority": 2000}
    assert ModelLoadRequest.model_validate_json(request.model_dump_json()) == request
    assert "size" in error_of(ModelLoadRequest, {"id": 9, "size": 3})
