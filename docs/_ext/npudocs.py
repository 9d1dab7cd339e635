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
- ``npu-importance``: each importance, the uid priority it gives and its default band.

What they read from the code is in `docsdata`, which the tests import without Sphinx.
"""

from __future__ import annotations

import enum
import inspect
import re
from typing import Any, ClassVar

from docsdata import (
    ALIASES,
    DATA_DOCS,
    INHERITED,
    PYDANTIC_NOISE,
    SECTIONS,
    _attr_doc,
    _md_table,
    _schema_type,
    builtin_plugins,
    cli_help,
    command_output,
    constants,
    docstring,
    field_rows,
    importance_rows,
    message_rows,
    params_rows,
    protocol_messages,
    transition_rows,
    unplaced,
)
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

LOG = logging.getLogger(__name__)


# The API reference: every name of `npumanager.__all__`, once, in the section it belongs to.
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
            lines += [
                f".. automodule:: {obj.__name__}",
                "   :members:",
                "",
                ".. currentmodule:: npumanager",
                "",
            ]
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
    for name, wire, kind, default in rows:
        lines += [f"      * - {_rst_cell(name)}", f"        - {_rst_cell(wire)}"]
        lines += [f"        - {_rst_cell(cell, model)}" for cell in (kind, default)]
    return [*lines, ""]


_CODE_SPAN = re.compile(r"`([^`]+)`")


def _rst_cell(text: str, model: type[Any] | None = None) -> str:
    """A generated cell's Markdown code spans as reStructuredText.

    A span that names a class of npumanager or one of its members (with ``model`` given: a
    field's type or default) becomes a link to its entry; any other span (a field's name, a
    value) becomes a literal, so that none is read as a cross-reference to nothing.
    """

    def span(match: re.Match[str]) -> str:
        code = match[1]
        target = _link_target(code, model) if model is not None else None
        return f"``{code}``" if target is None else f":py:obj:`{code} <{target}>`"

    return _CODE_SPAN.sub(span, text)


def _link_target(dotted: str, model: type[Any]) -> str | None:
    """The full name of what a dotted name in a model's table names, or None.

    The name's head is one of `npumanager.__all__` (linked under that name) or a class of
    npumanager that the model's module holds (linked under its own module's name, an entry
    of the types page); the rest must be its attributes.
    """
    import sys

    import npumanager

    head, *rest = dotted.split(".")
    obj: object
    if head in npumanager.__all__:
        obj, base = getattr(npumanager, head), f"npumanager.{head}"
    else:
        obj = getattr(sys.modules[model.__module__], head, None)
        if not (isinstance(obj, type) and obj.__module__.startswith("npumanager.")):
            return None
        base = f"{obj.__module__}.{obj.__qualname__}"
    for part in rest:
        if not hasattr(obj, part):
            return None
        obj = getattr(obj, part)
    return ".".join([base, *rest])


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


class TransitionsDirective(_Generated):
    """``npu-transitions``: the arbiter's table of request states and steps."""

    sources = ("npumanager.core.arbiter.states", "npumanager.core.arbiter.actions")

    def run(self) -> list[nodes.Node]:
        from npumanager.core.arbiter.actions import RequestState
        from npumanager.core.arbiter.states import Step

        lines = _md_table(["state", "steps allowed: step -> next state"], transition_rows())
        lines += ["The states:", ""]
        lines += [f"- `{s.value}`: {_attr_doc(RequestState, s.name)}" for s in RequestState]
        lines += ["", "The steps:", ""]
        lines += [f"- `{s.value}`: {_attr_doc(Step, s.name)}" for s in Step]
        return self.render([*lines, ""])


class ProtocolDirective(_Generated):
    """``npu-protocol``: every message of the wire protocol, from its JSON Schema."""

    sources = ("npumanager.daemon.wire.protocol", "npumanager.schemas.limits")

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
        return self.render(_md_table(["Rule", "Test", "Capability", "What a driver must do"], rows))


class CliDirective(_Generated):
    """``npu-cli``: the help of every command."""

    sources = ("npumanager.cli.program",)

    def has_title(self) -> bool:
        return True

    def run(self) -> list[nodes.Node]:
        lines: list[str] = []
        for command, text in cli_help():
            lines += [f"## `{command}`", "", "```text", *text.rstrip().splitlines(), "```", ""]
        return self.render(lines)


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


class PluginsDirective(_Generated):
    """``npu-plugins KIND``: the built-in drivers, policies, sinks or health sources."""

    required_arguments = 1
    sources = ("npumanager.plugins.policies.registration", "npumanager.plugins.sinks")

    def run(self) -> list[nodes.Node]:
        records = builtin_plugins(self.arguments[0])
        if self.arguments[0] == "driver":
            rows = [
                [f"`{r.name}`", ", ".join(sorted(r.capabilities)), r.description] for r in records
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


class ImportanceDirective(_Generated):
    """``npu-importance``: each importance, its uid priority and its band."""

    sources = ("npumanager.schemas.enums", "npumanager.schemas.device")

    def run(self) -> list[nodes.Node]:
        return self.render(
            _md_table(["importance", "uid priority", "band (default device)"], importance_rows())
        )


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the directives."""
    app.add_directive("npu-api", ApiDirective)
    app.add_directive("npu-transitions", TransitionsDirective)
    app.add_directive("npu-protocol", ProtocolDirective)
    app.add_directive("npu-vts-rules", VtsRulesDirective)
    app.add_directive("npu-cli", CliDirective)
    app.add_directive("npu-output", OutputDirective)
    app.add_directive("npu-plugins", PluginsDirective)
    app.add_directive("npu-importance", ImportanceDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
