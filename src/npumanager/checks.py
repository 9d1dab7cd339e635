"""Argument checks shared by the core, the drivers, telemetry and the daemon client.

A leaf module: it imports only the schemas and the errors, so anything may use it without
depending on a driver.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from npumanager.errors import IllegalArgumentError, UnknownDeviceError
from npumanager.schemas import NpuUuid
from npumanager.schemas.limits import (
    INT32_MAX,
    MAX_INTRA_OP_THREADS,
    MAX_RUNTIME_OPTION_KEY,
    MAX_RUNTIME_OPTION_VALUE,
    MAX_RUNTIME_OPTIONS,
    RUNTIME_OPTION_KEY_PATTERN,
)

GroupId = NpuUuid | uuid.UUID | bytes | str
"""The forms a work item's group id may be given in."""


Options = TypeVar("Options", bound=BaseModel)


def check_int(name: str, value: Any, low: int, high: int) -> int:
    """`value` if it is an int within low..high, else an `IllegalArgumentError` naming it."""
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise IllegalArgumentError(f"{name} must be an int within {low}..{high}; got {value!r}")
        value = int(value)
    number: int = value
    if not low <= number <= high:
        raise IllegalArgumentError(f"{name} must be within {low}..{high}; got {number}")
    return number


def check_threads(threads: Any) -> int | None:
    """A model's ``threads`` as a load takes it: None (the driver's setting), 0 (one per
    CPU) or a count up to ``MAX_INTRA_OP_THREADS``."""
    if threads is None:
        return None
    if type(threads) is not int or not 0 <= threads <= MAX_INTRA_OP_THREADS:
        raise IllegalArgumentError(
            f"threads must be None (the driver's setting), 0 (one per CPU) or 1.."
            f"{MAX_INTRA_OP_THREADS}; got {threads!r}"
        )
    return threads


_OPTION_KEY = re.compile(RUNTIME_OPTION_KEY_PATTERN)


def check_runtime_options(options: Any) -> dict[str, str] | None:
    """A model's runtime ``options`` as a load takes them: None (or empty: the driver's
    settings), else at most ``MAX_RUNTIME_OPTIONS`` names of the form
    ``runtime.name`` (``onnxruntime.graph_optimization_level``) with string values."""
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise IllegalArgumentError(
            f"options must be a mapping of option name to value; got {type(options).__name__}"
        )
    if len(options) > MAX_RUNTIME_OPTIONS:
        raise IllegalArgumentError(
            f"options holds {len(options)} entries; a load takes at most {MAX_RUNTIME_OPTIONS}"
        )
    checked: dict[str, str] = {}
    for key, value in options.items():
        if (
            not isinstance(key, str)
            or len(key) > MAX_RUNTIME_OPTION_KEY
            or not _OPTION_KEY.match(key)
        ):
            raise IllegalArgumentError(
                f"option name {key!r} is not allowed: it is the runtime, a dot and the "
                f"runtime's own name (onnxruntime.graph_optimization_level), at most "
                f"{MAX_RUNTIME_OPTION_KEY} characters"
            )
        if not isinstance(value, str) or len(value) > MAX_RUNTIME_OPTION_VALUE:
            raise IllegalArgumentError(
                f"option {key}'s value must be a string of at most {MAX_RUNTIME_OPTION_VALUE} "
                f"characters; got {value!r:.80}"
            )
        checked[key] = value
    return checked or None


def check_device(device: Any, count: int) -> int:
    """`device` if it numbers one of `count` devices, else an error naming the range."""
    number = check_int("device", device, 0, INT32_MAX)
    if number >= count:
        raise UnknownDeviceError(f"device {number} does not exist; devices are 0..{count - 1}")
    return number


def group_bytes(group_id: GroupId | None) -> bytes | None:
    """A group id in any accepted form, as its 16 bytes."""
    if group_id is None:
        return None
    if isinstance(group_id, NpuUuid):
        return group_id.value
    if isinstance(group_id, uuid.UUID):
        return group_id.bytes
    if isinstance(group_id, bytes) and len(group_id) == 16:
        return group_id
    if isinstance(group_id, str):
        try:
            return uuid.UUID(group_id).bytes
        except ValueError:
            pass
    raise IllegalArgumentError(
        f"group_id must be an NpuUuid, a uuid.UUID, 16 bytes or a UUID string; got {group_id!r}"
    )


def validate_options(what: str, model: type[Options], options: Mapping[str, Any]) -> Options:
    """``options`` as ``model``, or `~npumanager.IllegalArgumentError` of one line: the unknown
    options and the allowed ones, or each bad value and why."""
    allowed = list(model.model_fields)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise IllegalArgumentError(
            f"{what}: unknown option {', '.join(map(repr, unknown))}; allowed: "
            f"{', '.join(allowed) or 'none'}"
        )
    try:
        return model.model_validate(dict(options))
    except ValidationError as exc:
        detail = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'options'}: {_reason(e)}" for e in exc.errors()
        )
        raise IllegalArgumentError(f"{what}: {detail}") from None


def _reason(error: Any) -> str:
    """A validation error's reason: a validator's own message as it raised it."""
    raised = error.get("ctx", {}).get("error")
    return str(raised) if isinstance(raised, ValueError) else str(error["msg"])
