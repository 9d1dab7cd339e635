"""The parts of the site that are read from the code at build time, so they cannot drift.

Directives (each renders generated Markdown or reStructuredText into the page that uses it):

- ``npu-api SECTION``: the API reference entries of one section of `npumanager.__all__`
  (in an ``.rst`` page: it emits autodoc directives); `SECTIONS` says which name goes where,
  and a name of `npumanager.__all__` in no section is a build warning (an error under -W).
- ``npu-transitions``: the request states and their steps, from `core.states.TRANSITIONS`.
- ``npu-protocol``: every message of the daemon's wire protocol, from the pydantic models'
  JSON Schema (`daemon.protocol.ClientMessage` and `DaemonMessage`).
- ``npu-vts-rules``: the conformance suite's rule table, from `testing.rules.RULES`.
- ``npu-cli``: ``npu-manager --help`` and every command's ``--help``, from the CLI's parser.
- ``npu-output``: the output of one ``npu-manager`` command line, run at build time.
- ``npu-plugins KIND``: the built-in plugins of a kind (a policy's parameters with them).

The test suite imports this module too (`tests/test_docs_site.py`).
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
from typing import Any, ClassVar, get_args

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

LOG = logging.getLogger(__name__)

# The API reference: every name of `npumanager.__all__`, once, in the section it belongs to.
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
    "named after a hook of `npumanager.core.hookspecs`.",
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
    try:
        analyzer = ModuleAnalyzer.for_module(module)
    except Exception:
        return {}
    return {
        f"{owner}.{name}" if owner else name: " ".join(lines).strip()
        for (owner, name), lines in analyzer.find_attr_docs().items()
    }


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


def _api_rst(section: str) -> list[str]:
    import npumanager

    lines: list[str] = []
    if section == "constants":
        for name in constants():
            value = getattr(npumanager, name)
            lines += [
                f".. py:data:: {name}",
                f"   :value: {int(value)}",
                "",
                f"   {docstring(name)}",
                "",
            ]
        return lines
    for name in SECTIONS[section]:
        obj = getattr(npumanager, name)
        if name in ALIASES:
            lines += [
                f".. py:class:: {name}",
                "",
                f"   The older name of `{ALIASES[name]}`; it still works.",
                "",
            ]
        elif name in DATA_DOCS:
            lines += [f".. py:data:: {name}", "", f"   {DATA_DOCS[name]}", ""]
        elif inspect.ismodule(obj):
            lines += [f".. automodule:: {obj.__name__}", "   :members:", "", ".. currentmodule:: npumanager", ""]
        elif inspect.isfunction(obj):
            lines += [f".. autofunction:: npumanager.{name}", ""]
        elif isinstance(obj, type) and issubclass(obj, BaseException):
            lines += [f".. autoexception:: npumanager.{name}", "   :show-inheritance:", ""]
        elif isinstance(obj, type) and hasattr(obj, "model_fields"):
            lines += [
                f".. autoclass:: npumanager.{name}",
                "   :members:",
                f"   :exclude-members: {', '.join(PYDANTIC_NOISE)}",
                "",
                *_fields_table(obj),
            ]
        else:
            lines += [f".. autoclass:: npumanager.{name}", "   :members:"]
            if name in INHERITED:
                lines += ["   :inherited-members:"]
            if isinstance(obj, type) and issubclass(obj, enum.Enum):
                lines += ["   :undoc-members:"]
            lines += [""]
    return lines


PYDANTIC_NOISE = ("model_config", "model_fields", "model_computed_fields", "Builder")
"""Pydantic's own class attributes, which every model has and the fields table replaces."""

INHERITED = frozenset({"Lease", "AsyncLease"})
"""Classes whose public members live on a private base."""


def field_rows(model: type[Any]) -> list[list[str]]:
    """A model's fields: Python name, wire name, JSON type, default (or 'required')."""
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
        else:
            default = f"`{field.default!r}`"
        kind = _schema_type(prop, {}) if prop is not None else _python_type(field.annotation)
        rows.append([f"`{name}`", f"`{wire}`", kind, default])
    return rows


def _python_type(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) or repr(annotation)
    return f"`{text.replace('typing.', '').replace('collections.abc.', '')}` (Python)"


def _fields_table(model: type[Any]) -> list[str]:
    rows = field_rows(model)
    if not rows:
        return []
    lines = [
        "   .. list-table:: Fields",
        "      :header-rows: 1",
        "",
        "      * - field",
        "        - on the wire",
        "        - type",
        "        - default",
    ]
    for row in rows:
        lines += [f"      * - {row[0]}", *(f"        - {cell}" for cell in row[1:])]
    return [*lines, ""]


class _Generated(SphinxDirective):
    """Renders generated lines in the page's own markup."""

    sources: ClassVar[tuple[str, ...]] = ()
    """Modules the output is read from: a change to one rebuilds the page."""

    def render(self, lines: list[str]) -> list[nodes.Node]:
        import importlib

        for name in (__name__, *self.sources):
            self.env.note_dependency(inspect.getfile(importlib.import_module(name)))
        container = nodes.section() if self.has_title() else nodes.container()
        self.state.nested_parse(StringList(lines, source=self.get_source_info()[0]), 0, container)
        return list(container.children)

    def has_title(self) -> bool:
        return False


class ApiDirective(_Generated):
    """``npu-api SECTION``: autodoc entries for one section of `npumanager.__all__`."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        section = self.arguments[0]
        if section != "constants" and section not in SECTIONS:
            raise self.error(f"unknown API section {section!r}; known: {', '.join(SECTIONS)}")
        missing = unplaced()
        if missing and section == "package":
            LOG.warning("public names in no section of the API reference: %s", ", ".join(missing))
        for name in (*SECTIONS.get(section, ()), *(constants() if section == "constants" else ())):
            if not docstring(name):
                LOG.warning("npumanager.%s has no docstring", name)
        return self.render(_api_rst(section))


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def transition_rows() -> list[list[str]]:
    """One row per state: each step allowed there and where it leads."""
    from npumanager.core.states import TRANSITIONS

    rows = []
    for state, row in TRANSITIONS.items():
        steps = ", ".join(
            f"`{step.value}` -> {'ended' if target is None else f'`{target.value}`'}"
            for step, target in row.items()
        )
        rows.append([f"`{state.value}`", steps])
    return rows


class TransitionsDirective(_Generated):
    """``npu-transitions``: the arbiter's table of request states and steps."""

    sources = ("npumanager.core.states", "npumanager.core.actions")

    def run(self) -> list[nodes.Node]:
        from npumanager.core.actions import RequestState
        from npumanager.core.states import Step

        lines = _md_table(["state", "steps allowed: step -> next state"], transition_rows())
        lines += ["The states:", ""]
        lines += [f"- `{s.value}`: {_attr_doc(RequestState, s.name)}" for s in RequestState]
        lines += ["", "The steps:", ""]
        lines += [f"- `{s.value}`: {_attr_doc(Step, s.name)}" for s in Step]
        return self.render([*lines, ""])


def _attr_doc(owner: type, attribute: str) -> str:
    return _attribute_docs(owner.__module__).get(f"{owner.__name__}.{attribute}", "")


def protocol_messages() -> dict[str, list[type[Any]]]:
    """The wire protocol's messages by direction, read from its discriminated unions."""
    from npumanager.daemon import protocol

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
    kind = prop.get("type", "any")
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


class ProtocolDirective(_Generated):
    """``npu-protocol``: every message of the wire protocol, from its JSON Schema."""

    sources = ("npumanager.daemon.protocol", "npumanager.schemas.limits")

    def has_title(self) -> bool:
        return True

    def run(self) -> list[nodes.Node]:
        from npumanager.schemas.limits import MAX_FRAME_BYTES, PROTOCOL_VERSION

        lines = [
            f"Protocol version {PROTOCOL_VERSION}; a frame body is at most "
            f"{MAX_FRAME_BYTES:,} bytes.",
            "",
        ]
        nested: dict[str, type[Any]] = {}
        for direction, models in protocol_messages().items():
            lines += [f"### {direction.capitalize()}", ""]
            for model in models:
                op = model.model_fields["op"].default
                doc = inspect.cleandoc(model.__doc__ or "")
                lines += [f"#### `{op}` ({model.__name__})", "", doc, ""]
                lines += _md_table(["field", "type", ""], message_rows(model))
                for ref in model.model_json_schema(by_alias=True).get("$defs", {}):
                    nested.setdefault(ref, model)
        if nested:
            lines += ["### Nested types", ""]
            for ref, model in sorted(nested.items()):
                schema = model.model_json_schema(by_alias=True)["$defs"][ref]
                lines += [f"#### `{ref}`", "", inspect.cleandoc(schema.get("description", "")), ""]
                if "properties" in schema:
                    rows = []
                    need = set(schema.get("required", ()))
                    for name, prop in schema["properties"].items():
                        rows.append(
                            [
                                f"`{name}`",
                                _schema_type(prop, {}),
                                "required" if name in need else "optional",
                            ]
                        )
                    lines += _md_table(["field", "type", ""], rows)
                else:
                    lines += [f"JSON type: {_schema_type(schema, {})}", ""]
        return self.render(lines)


class VtsRulesDirective(_Generated):
    """``npu-vts-rules``: the conformance suite's rules, their tests and capabilities."""

    sources = ("npumanager.testing.rules",)

    def run(self) -> list[nodes.Node]:
        from npumanager.testing.rules import RULES

        rows = [[r.rule, f"`{r.test}`", r.capability, r.must] for r in RULES]
        return self.render(
            _md_table(["Rule", "Test", "Capability", "What a driver must do"], rows)
        )


def cli_help() -> Iterator[tuple[str, str]]:
    """(command, its --help text) for `npu-manager` and each of its commands."""
    import argparse

    from npumanager.cli import build_parser

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


class CliDirective(_Generated):
    """``npu-cli``: the help of every command."""

    sources = ("npumanager.cli",)

    def has_title(self) -> bool:
        return True

    def run(self) -> list[nodes.Node]:
        lines: list[str] = []
        for command, text in cli_help():
            lines += [f"## `{command}`", "", "```text", *text.rstrip().splitlines(), "```", ""]
        return self.render(lines)


def command_output(command: str) -> str:
    """Stdout of one `npu-manager ...` command line, run in this process."""
    from npumanager.cli import main

    argv = shlex.split(command)
    if argv[0] != "npu-manager":
        raise ValueError(f"npu-output runs npu-manager commands only, not {argv[0]!r}")
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = main(argv[1:])
    if code not in (0, None):
        raise RuntimeError(f"{command!r} exited {code}")
    return buffer.getvalue()


class OutputDirective(_Generated):
    """``npu-output COMMAND``: the command line and its output, run while the site builds."""

    required_arguments = 1
    final_argument_whitespace = True
    option_spec: ClassVar[dict[str, Any]] = {"language": str}

    def run(self) -> list[nodes.Node]:
        command = self.arguments[0]
        try:
            text = command_output(command)
        except Exception as exc:
            raise self.error(f"npu-output {command!r} failed: {exc}") from exc
        language = self.options.get("language", "text")
        block = nodes.literal_block(text, text, language=language)
        caption = nodes.paragraph()
        caption += nodes.literal(command, f"$ {command}")
        return [caption, block]


def builtin_plugins(kind: str) -> list[Any]:
    """The records npu-manager itself registers of one kind (third parties' are left out)."""
    from npumanager import load_plugins
    from npumanager.schemas import PluginKind

    registry = load_plugins()
    return [
        reg.record for reg in registry.registrations(PluginKind(kind)) if reg.source.builtin
    ]


def params_rows(model: type[Any]) -> list[list[str]]:
    """One row per parameter of a policy's params model: name, what it is (with default)."""
    return [
        [f"`{name}`", field.description or ""] for name, field in model.model_fields.items()
    ]


class PluginsDirective(_Generated):
    """``npu-plugins KIND``: the built-in drivers, policies, sinks or health sources."""

    required_arguments = 1
    sources = ("npumanager.plugins.policies.registration", "npumanager.plugins.sinks")

    def run(self) -> list[nodes.Node]:
        records = builtin_plugins(self.arguments[0])
        if self.arguments[0] == "driver":
            rows = [
                [f"`{r.name}`", ", ".join(sorted(r.capabilities)), r.description]
                for r in records
            ]
            return self.render(_md_table(["driver", "capabilities", ""], rows))
        lines = _md_table(
            ["name", "what it does"], [[f"`{r.name}`", r.description] for r in records]
        )
        for record in records:
            model = getattr(record, "params_model", None)
            if model is not None:
                lines += [f"Parameters of `{record.name}`:", ""]
                lines += _md_table(["parameter", "meaning"], params_rows(model))
        return self.render(lines)


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the directives."""
    app.add_directive("npu-api", ApiDirective)
    app.add_directive("npu-transitions", TransitionsDirective)
    app.add_directive("npu-protocol", ProtocolDirective)
    app.add_directive("npu-vts-rules", VtsRulesDirective)
    app.add_directive("npu-cli", CliDirective)
    app.add_directive("npu-output", OutputDirective)
    app.add_directive("npu-plugins", PluginsDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
