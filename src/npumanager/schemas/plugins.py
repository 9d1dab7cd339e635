"""The typed records that plugins hand back from the registration hooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Strict, StringConstraints

from .enums import DriverCapability, PluginKind
from .limits import MAX_PLUGIN_NAME_LENGTH, PLUGIN_NAME_PATTERN

PluginName = Annotated[
    str, StringConstraints(pattern=PLUGIN_NAME_PATTERN, max_length=MAX_PLUGIN_NAME_LENGTH)
]


class PluginRecord(BaseModel):
    """What one registration contributes: a name, a factory, and what it is.

    ``version`` defaults to the providing distribution's version.
    """

    model_config = ConfigDict(
        frozen=True, strict=True, extra="forbid", revalidate_instances="always"
    )
    kind: ClassVar[PluginKind]

    name: PluginName
    factory: Callable[..., Any]
    version: str | None = None
    description: str = ""


class DriverRecord(PluginRecord):
    """A vendor driver: ``factory(devices, **options)`` returns the driver object."""

    kind: ClassVar[PluginKind] = PluginKind.DRIVER
    capabilities: Annotated[
        frozenset[Annotated[DriverCapability, Strict(False)]], Strict(False)
    ] = frozenset()


class PolicyRecord(PluginRecord):
    """A model-loading policy: ``factory(params)`` returns the policy object."""

    kind: ClassVar[PluginKind] = PluginKind.POLICY
    params_model: type[BaseModel] | None = None
    """The pydantic model that validates the policy's parameters, if it takes any."""


class SinkRecord(PluginRecord):
    """A telemetry sink: ``factory(**options)`` returns an object with ``handle(batch)``."""

    kind: ClassVar[PluginKind] = PluginKind.SINK


class HealthSourceRecord(PluginRecord):
    """A health source: ``factory(**options)`` returns an object with ``read()`` (see hookspecs)."""

    kind: ClassVar[PluginKind] = PluginKind.HEALTH_SOURCE


class ImportanceSourceRecord(PluginRecord):
    """An importance source: its factory returns an object that ranks apps (see hookspecs).

    With `options_model`, a source's options are validated against it first (an unknown or
    bad one is refused, naming the allowed ones) and the factory is called with the validated
    model; without it, the factory is called with the options as keyword arguments.
    """

    kind: ClassVar[PluginKind] = PluginKind.IMPORTANCE_SOURCE
    options_model: type[BaseModel] | None = None
    """The pydantic model of the source's options, if it declares them."""


RECORD_TYPES: dict[PluginKind, type[PluginRecord]] = {
    PluginKind.DRIVER: DriverRecord,
    PluginKind.POLICY: PolicyRecord,
    PluginKind.SINK: SinkRecord,
    PluginKind.HEALTH_SOURCE: HealthSourceRecord,
    PluginKind.IMPORTANCE_SOURCE: ImportanceSourceRecord,
}
