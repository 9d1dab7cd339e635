"""What the documentation site reads from the code, as plain data (no Sphinx needed).

`npudocs` (the Sphinx extension) renders it; `tests/test_docs_site.py` checks it, also
where Sphinx is not installed.
"""

from __future__ import annotations

import enum
import inspect
import io
import os
import shlex
import typing
from collections.abc import Iterator
from contextlib import redirect_stdout
from typing import Any, get_args

SECTIONS: dict[str, tuple[str, ...]] = {
    "package": ("__version__",),
    "service": (
        "Service",
        "NpuManager",
        "ModelLoadRequestCallback",
        "ModelLoadStatusListener",
        "LoadedModel",
        "Lease",
        "AsyncLease",
        "connect",
        "DaemonClient",
    ),
    "schemas": (
        "ModelLoadRequest",
        "SchedulingConfig",
        "SchedulingConfigV1",
        "WorkInfo",
        "NpuUuid",
        "SCHEMA_MODELS",
        "limits",
    ),
    "enums": (
        "Importance",
        "ModelLoadStatus",
        "ModelLoadRequestStatus",
        "ModelSize",
        "ModelPriority",
        "ModelPolicy",
        "StartReason",
        "EndReason",
        "UnloadReason",
        "ThermalSeverity",
        "DriverCapability",
        "PluginKind",
    ),
    "errors": (
        "NpuManagerError",
        "IllegalArgumentError",
        "CapacityError",
        "ConfigError",
        "DaemonError",
        "DaemonUnavailableError",
        "DuplicateRequestError",
        "ExecutionError",
        "LeaseEndedError",
        "ModelHostError",
        "NpuPermissionError",
        "PluginError",
        "PluginWarning",
        "PolicyParamsError",
        "RequestStateError",
        "UnknownDeviceError",
        "UnknownModelError",
        "UnknownPluginError",
        "UnknownRequestError",
        "UnknownWorkError",
    ),
    "drivers": (
        "Driver",
        "SchedulingCallback",
        "BatchCallback",
        "VirtualClock",
        "RealClock",
        "ThermalModel",
        "DriverBase",
        "EngineDriver",
        "SimulatedDriver",
        "Engine",
        "ReferenceEngine",
        "DeviceSpec",
        "ThermalSpec",
        "DeviceDescription",
        "DeviceStatus",
        "WorkEvent",
        "EventKind",
    ),
    "plugins": (
        "hookimpl",
        "load_plugins",
        "PluginRegistry",
        "PluginRecord",
        "DriverRecord",
        "PolicyRecord",
        "SinkRecord",
        "HealthSourceRecord",
        "ImportanceSourceRecord",
    ),
    "telemetry": (
        "EventSink",
        "Sink",
        "SinkHandle",
        "SinkStats",
        "TelemetryEvent",
        "DeviceSample",
        "ModelLoadRequested",
        "ModelLoadStateChanged",
        "ModelLoadState",
    ),
    "health": ("HealthSample", "MemoryReading", "ThermalReading", "DeviceReading"),
}
"""Section key -> names; the constants (ints and enum members) form a section of their own."""

ALIASES: dict[str, str] = {"SimulatedDriver": "EngineDriver"}
"""Names that are another public name under an older spelling."""

DATA_DOCS: dict[str, str] = {
    "hookimpl": "The pluggy marker of a hook implementation: ``@hookimpl`` on a function "
    "named after a hook of `npumanager.core.plugins.hookspecs`.",
    "TelemetryEvent": "What a sink's batch holds: a `WorkEvent`, `ModelLoadRequested`, "
    "`ModelLoadStateChanged` or `DeviceSample`.",
    "SCHEMA_MODELS": "Every HAL and API model by name, as ``npu-manager schema NAME`` prints "
    "their JSON Schema.",
    "__version__": "The installed distribution's version.",
}
"""Descriptions of the public names that are values without a docstring of their own."""


def public_api() -> list[str]:
    """`npumanager.__all__`, in its own order."""
    import npumanager

    return list(npumanager.__all__)


def constants() -> list[str]:
    """The names of `npumanager.__all__` that are plain values: ints and enum members."""
    import npumanager

    return [
        name
        for name in public_api()
        if isinstance(getattr(npumanager, name), int) and name not in DATA_DOCS
    ]


def unplaced() -> list[str]:
    """Public names that no section of the reference lists."""
    placed = {name for names in SECTIONS.values() for name in names} | set(constants())
    return [name for name in public_api() if name not in placed]


def _attribute_docs(module: str) -> dict[str, str]:
    """The docstrings written after assignments in a module: 'NAME' or 'Class.NAME' -> text."""
    import ast
    import importlib

    try:
        tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    except (OSError, TypeError, ImportError):
        return {}
    found: dict[str, str] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for stmt, after in zip(body, [*body[1:], None], strict=True):
            if isinstance(stmt, ast.ClassDef):
                walk(stmt.body, f"{prefix}{stmt.name}.")
                continue
            targets = (
                stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            )
            if not isinstance(stmt, ast.Assign | ast.AnnAssign):
                continue
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                text = after.value.value
                if isinstance(text, str):
                    for target in targets:
                        if isinstance(target, ast.Name):
                            found[prefix + target.id] = " ".join(inspect.cleandoc(text).split())

    walk(tree.body, "")
    return found


def docstring(name: str) -> str:
    """What the reference says about one public name; empty if nothing documents it."""
    import npumanager

    obj = getattr(npumanager, name)
    if name in DATA_DOCS:
        return DATA_DOCS[name]
    if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj):
        own = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
        return inspect.cleandoc(own) if isinstance(own, str) else ""
    if isinstance(obj, enum.Enum):
        owner = type(obj)
        member = _attribute_docs(owner.__module__).get(f"{owner.__name__}.{obj.name}", "")
        doc = inspect.cleandoc(owner.__doc__ or "")
        head = f"`{owner.__name__}.{obj.name}` ({obj.value}): {doc.splitlines()[0] if doc else ''}"
        return f"{head} {member}".strip()
    from npumanager.schemas import limits

    return _attribute_docs(limits.__name__).get(name, "")


PYDANTIC_NOISE = ("model_config", "model_fields", "model_computed_fields", "Builder")
"""Pydantic's own class attributes, which every model has and the fields table replaces."""

INHERITED = frozenset({"Lease", "AsyncLease"})
"""Classes whose public members live on a private base."""


def field_rows(model: type[Any]) -> list[list[str]]:
    """A model's fields: Python name, wire name, JSON type, default (or 'required').

    Code is in Markdown's backticks; an enum member default is written ``Enum.MEMBER``.
    """
    try:
        props = model.model_json_schema(by_alias=True).get("properties", {})
    except Exception:  # a field JSON cannot carry (a plugin record's factory)
        props = {}
    rows = []
    for name, field in model.model_fields.items():
        wire = field.alias or name
        prop = props.get(wire)
        if field.is_required():
            default = "required"
        elif field.default_factory is not None:
            default = "a fresh one"
        elif isinstance(field.default, enum.Enum):
            default = f"`{type(field.default).__name__}.{field.default.name}`"
        else:
            default = f"`{field.default!r}`"
        kind = _schema_type(prop, {}) if prop is not None else _python_type(field.annotation)
        rows.append([f"`{name}`", f"`{wire}`", kind, default])
    return rows


def _python_type(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) or repr(annotation)
    return f"`{text.replace('typing.', '').replace('collections.abc.', '')}` (Python)"


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def transition_rows() -> list[list[str]]:
    """One row per state: each step allowed there and where it leads."""
    from npumanager.core.arbiter.states import TRANSITIONS

    rows = []
    for state, row in TRANSITIONS.items():
        steps = ", ".join(
            f"`{step.value}` -> {'ended' if target is None else f'`{target.value}`'}"
            for step, target in row.items()
        )
        rows.append([f"`{state.value}`", steps])
    return rows


def _attr_doc(owner: type, attribute: str) -> str:
    return _attribute_docs(owner.__module__).get(f"{owner.__name__}.{attribute}", "")


def protocol_messages() -> dict[str, list[type[Any]]]:
    """The wire protocol's messages by direction, read from its discriminated unions."""
    from npumanager.daemon.wire import protocol

    def members(union: Any) -> list[type[Any]]:
        inner = get_args(union)[0] if typing.get_origin(union) is typing.Annotated else union
        return list(get_args(inner))

    return {
        "client to daemon": members(protocol.ClientMessage),
        "daemon to client": members(protocol.DaemonMessage),
    }


_POWERS = {(1 << n) - 1: f"2^{n}-1" for n in (31, 32, 63, 64)} | {-(1 << 31): "-2^31"}


def _schema_type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        return f"`{prop['$ref'].rsplit('/', 1)[-1]}`"
    if "anyOf" in prop:
        return " or ".join(_schema_type(p, defs) for p in prop["anyOf"])
    if "const" in prop:
        return f'`"{prop["const"]}"`'
    kind = str(prop.get("type", "any"))
    if "enum" in prop:
        return f"{kind}, one of {', '.join(_json(v) for v in prop['enum'])}"
    low, high = prop.get("minimum"), prop.get("maximum")
    if kind == "integer" and high in _POWERS:
        span = f"{_POWERS[low]}" if low in _POWERS else str(low)
        return f"integer, {span} .. {_POWERS[high]}"
    bounds = [
        f"{word} {prop[key]}"
        for key, word in (
            ("minimum", ">="),
            ("maximum", "<="),
            ("exclusiveMinimum", ">"),
            ("maxLength", "length <="),
        )
        if key in prop
    ]
    if kind == "array" and "items" in prop:
        kind = f"array of {_schema_type(prop['items'], defs)}"
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def message_rows(model: type[Any]) -> list[list[str]]:
    """One row per field of a message: wire name, JSON type, required or its default."""
    schema = model.model_json_schema(by_alias=True)
    required = set(schema.get("required", ()))
    defs = schema.get("$defs", {})
    rows = []
    for name, prop in schema["properties"].items():
        if name == "op":
            need = "the message's tag"
        elif name in required:
            need = "required"
        elif "default" in prop:
            need = f"default `{_json(prop['default'])}`"
        else:
            need = "optional"
        rows.append([f"`{name}`", _schema_type(prop, defs), need])
    return rows


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def cli_help() -> Iterator[tuple[str, str]]:
    """(command, its --help text) for `npu-manager` and each of its commands."""
    import argparse

    from npumanager.cli.program import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"
    try:
        parser = build_parser()
        parser.prog = "npu-manager"
        yield "npu-manager", parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield f"npu-manager {name}", sub.format_help()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def command_output(command: str) -> str:
    """Stdout of one `npu-manager ...` command line, run in this process."""
    from npumanager.cli.program import main

    argv = shlex.split(command)
    if argv[0] != "npu-manager":
        raise ValueError(f"npu-output runs npu-manager commands only, not {argv[0]!r}")
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = main(argv[1:])
    if code not in (0, None):
        raise RuntimeError(f"{command!r} exited {code}")
    return buffer.getvalue()


def builtin_plugins(kind: str) -> list[Any]:
    """The records npu-manager itself registers of one kind (third parties' are left out)."""
    from npumanager import load_plugins
    from npumanager.schemas import PluginKind

    registry = load_plugins()
    return [reg.record for reg in registry.registrations(PluginKind(kind)) if reg.source.builtin]


def params_rows(model: type[Any]) -> list[list[str]]:
    """One row per parameter of a policy's params model: name, what it is (with default)."""
    return [[f"`{name}`", field.description or ""] for name, field in model.model_fields.items()]


def importance_rows() -> list[list[str]]:
    """Each importance, the uid priority it gives, and its band on the default device."""
    from npumanager import DeviceSpec, Importance

    bands = DeviceSpec().bands
    rows = []
    for importance in Importance:
        band = [b for b in bands if b.first_priority <= importance.value][-1]
        rows.append([f"`{importance.name}`", str(importance.value), f"`{band.name}`"])
    return rows
