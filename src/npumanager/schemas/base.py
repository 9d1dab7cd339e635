"""The base of every schema model: frozen, strict, no extra keys, camelCase on the wire."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class SchemaModel(BaseModel):
    """Frozen and strict; snake_case in Python, the AIDL's camelCase as the alias.

    Input is accepted in either spelling; output (`model_dump(mode="json")`, JSON,
    JSON Schema) uses the alias, exactly as the HAL text spells it.
    """

    model_config = ConfigDict(
        frozen=True,
        strict=True,
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_enum_values=False,
    )
