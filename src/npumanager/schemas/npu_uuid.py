"""`NpuUuid`: the 128-bit identifier of a group of work, shown as a UUID string."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from pydantic import Field, GetJsonSchemaHandler, model_serializer, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from .base import SchemaModel

UUID_BYTES = 16


class NpuUuid(SchemaModel):
    """Sixteen bytes in RFC 4122 order; accepts and prints the standard UUID string.

    The AIDL parcelable holds one field, ``byte[16] value``; on the wire and in JSON
    the whole value is its UUID string, e.g. ``"12345678-90ab-cdef-1122-334455667788"``.
    """

    value: Annotated[bytes, Field(min_length=UUID_BYTES, max_length=UUID_BYTES)]

    @model_validator(mode="before")
    @classmethod
    def _from_uuid_forms(cls, data: Any) -> Any:
        if isinstance(data, NpuUuid):
            return data
        if isinstance(data, uuid.UUID):
            return {"value": data.bytes}
        if isinstance(data, str):
            try:
                return {"value": uuid.UUID(data).bytes}
            except ValueError:
                raise ValueError(
                    f"NpuUuid must be a UUID string like "
                    f"'12345678-90ab-cdef-1122-334455667788'; got {data!r}"
                ) from None
        if isinstance(data, bytes):
            return {"value": data}
        return data

    @model_serializer(mode="plain")
    def _as_string(self) -> str:
        return str(self.uuid)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "title": "NpuUuid",
            "description": "A 128-bit identifier, as a standard UUID string.",
            "type": "string",
            "format": "uuid",
        }

    @classmethod
    def parse(cls, text: str) -> NpuUuid:
        """Build from the standard UUID string form."""
        return cls.model_validate(text)

    @classmethod
    def random(cls) -> NpuUuid:
        """A fresh random (version 4) identifier."""
        return cls(value=uuid.uuid4().bytes)

    @property
    def uuid(self) -> uuid.UUID:
        """The value as a standard-library UUID."""
        return uuid.UUID(bytes=self.value)

    def __str__(self) -> str:
        return str(self.uuid)
