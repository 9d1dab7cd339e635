"""Bounded integer types: AIDL `int` and `long`, priorities, uids.

Each carries its range into validation (a message that names the range) and into
JSON Schema (`minimum`/`maximum`), so drivers in other languages see the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from .limits import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    MAX_EFFECTIVE_PRIORITY,
    MAX_PRIORITY,
    MIN_PRIORITY,
)


@dataclass(frozen=True)
class Range:
    """An inclusive integer range, usable as pydantic `Annotated` metadata."""

    low: int
    high: int
    what: str

    def check(self, value: int) -> int:
        """Return `value` if it lies in the range, else raise a pydantic error naming it."""
        if not self.low <= value <= self.high:
            raise PydanticCustomError(
                "out_of_range",
                "must be {what}, within {low}..{high}; got {value}",
                {"what": self.what, "low": self.low, "high": self.high, "value": value},
            )
        return value

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema.update(minimum=self.low, maximum=self.high)
        return json_schema


INT32 = Range(INT32_MIN, INT32_MAX, "a 32-bit signed integer (AIDL int)")
INT64 = Range(INT64_MIN, INT64_MAX, "a 64-bit signed integer (AIDL long)")
PRIORITY = Range(MIN_PRIORITY, MAX_PRIORITY, "a priority (0 is the most important)")
EFFECTIVE_PRIORITY = Range(
    MIN_PRIORITY, MAX_EFFECTIVE_PRIORITY, "an effective priority (app plus job priority)"
)
NON_NEGATIVE_INT32 = Range(0, INT32_MAX, "a non-negative 32-bit integer")
NON_NEGATIVE_INT64 = Range(0, INT64_MAX, "a non-negative 64-bit integer")

Int32 = Annotated[int, INT32]
Int64 = Annotated[int, INT64]
Priority = Annotated[int, PRIORITY]
EffectivePriority = Annotated[int, EFFECTIVE_PRIORITY]
Uid = Annotated[int, NON_NEGATIVE_INT32]
"""A Linux uid as the HAL carries it: an AIDL int that is never negative."""
NonNegativeInt32 = Annotated[int, NON_NEGATIVE_INT32]
NonNegativeInt64 = Annotated[int, NON_NEGATIVE_INT64]
