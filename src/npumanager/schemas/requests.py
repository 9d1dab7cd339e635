"""`ModelLoadRequest`: what a client asks before it loads a model."""

from __future__ import annotations

from typing import ClassVar, TypeVar

from .base import SchemaModel
from .enums import ModelPriority, ModelSize
from .types import NonNegativeInt64


class _Builder:
    """`ModelLoadRequest.Builder(id).set_size(...).set_priority(...).build()`."""

    def __init__(self, request_id: int) -> None:
        self._id = request_id
        self._size = ModelSize.LESS_THAN_1GB
        self._priority = ModelPriority.NORMAL

    def set_size(self, size: ModelSize | int) -> _Builder:
        """Set the estimated size class (a `ModelSize` or its int value)."""
        self._size = _coerce(ModelSize, size, "size")
        return self

    def set_priority(self, priority: ModelPriority | int) -> _Builder:
        """Set the intended priority (a `ModelPriority` or its int value)."""
        self._priority = _coerce(ModelPriority, priority, "priority")
        return self

    def build(self) -> ModelLoadRequest:
        """The validated, immutable request."""
        return ModelLoadRequest(id=self._id, size=self._size, priority=self._priority)


_E = TypeVar("_E", ModelSize, ModelPriority)


def _coerce(enum: type[_E], value: _E | int, what: str) -> _E:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be a {enum.__name__} or its int value; got {value!r}")
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(f"{m.name}={m.value}" for m in enum)
        raise ValueError(f"{what} must be one of {allowed}; got {value}") from None


class ModelLoadRequest(SchemaModel):
    """A unique id, an estimated size class and an intended priority.

    Equal (and hashing equal) exactly when id, size and priority are equal.
    """

    Builder: ClassVar[type[_Builder]] = _Builder

    id: NonNegativeInt64
    size: ModelSize = ModelSize.LESS_THAN_1GB
    priority: ModelPriority = ModelPriority.NORMAL
