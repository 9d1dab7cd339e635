"""A small reader for the AIDL text shipped in `aidl/`, so tests can hold the models to it.

It understands the subset the NPU HAL uses: parcelables with (nullable) fields, int-backed
enums, and interfaces with constants and methods. Anything else is a `SyntaxError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, get_args

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from .limits import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN
from .types import Range

HAL_PACKAGE = "android.hardware.npu"

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<number>-?\d+)
  | (?P<string>"[^"]*")
  | (?P<punct>\[\d*\]|[{}();,=@<>])
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True)
class AidlField:
    """One parcelable field: its AIDL type (e.g. `int`, `byte[16]`) and nullability."""

    name: str
    type: str
    nullable: bool


@dataclass(frozen=True)
class AidlParam:
    """One method parameter."""

    name: str
    type: str
    nullable: bool
    direction: str | None


@dataclass(frozen=True)
class AidlMethod:
    """One interface method."""

    name: str
    return_type: str
    params: tuple[AidlParam, ...]
    oneway: bool


@dataclass
class AidlDecl:
    """A parcelable, enum or interface declaration."""

    kind: str
    name: str
    package: str
    annotations: tuple[str, ...] = ()
    fields: list[AidlField] = field(default_factory=list)
    members: dict[str, int] = field(default_factory=dict)
    constants: dict[str, int] = field(default_factory=dict)
    methods: list[AidlMethod] = field(default_factory=list)
    oneway: bool = False


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            line = text.count("\n", 0, pos) + 1
            raise SyntaxError(f"unexpected character {text[pos]!r} on line {line}")
        if match.lastgroup != "ws":
            out.append(match.group())
        pos = match.end()
    return out


class _Reader:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None:
            raise SyntaxError(f"unexpected end of file, expected {expected or 'more'}")
        if expected is not None and token != expected:
            raise SyntaxError(f"expected {expected!r}, found {token!r}")
        self.pos += 1
        return token

    def annotations(self) -> list[str]:
        found = []
        while self.peek() == "@":
            self.take("@")
            name = self.take()
            if self.peek() == "(":
                while self.take() != ")":
                    pass
            found.append(name)
        return found

    def type_name(self) -> str:
        name = self.take()
        if self.peek() == "<":
            depth = 0
            while True:
                token = self.take()
                name += token
                depth += {"<": 1, ">": -1}.get(token, 0)
                if depth == 0:
                    break
        while (following := self.peek()) is not None and following.startswith("["):
            name += self.take()
        return name


def parse_aidl(text: str) -> AidlDecl:
    """Parse one AIDL file holding one declaration."""
    reader = _Reader(_tokens(text))
    reader.take("package")
    package = reader.take()
    reader.take(";")
    while reader.peek() == "import":
        reader.take()
        reader.take()
        reader.take(";")
    annotations = reader.annotations()
    oneway = reader.peek() == "oneway"
    if oneway:
        reader.take()
    kind = reader.take()
    if kind not in {"parcelable", "enum", "interface"}:
        raise SyntaxError(f"expected parcelable, enum or interface, found {kind!r}")
    decl = AidlDecl(kind, reader.take(), package, tuple(annotations), oneway=oneway)
    reader.take("{")
    while reader.peek() != "}":
        if kind == "parcelable":
            _parcelable_field(reader, decl)
        elif kind == "enum":
            _enum_member(reader, decl)
        else:
            _interface_item(reader, decl)
    reader.take("}")
    if reader.peek() is not None:
        raise SyntaxError(f"unexpected {reader.peek()!r} after the declaration")
    return decl


def _parcelable_field(reader: _Reader, decl: AidlDecl) -> None:
    nullable = "nullable" in reader.annotations()
    type_name = reader.type_name()
    name = reader.take()
    reader.take(";")
    decl.fields.append(AidlField(name, type_name, nullable))


def _enum_member(reader: _Reader, decl: AidlDecl) -> None:
    name = reader.take()
    reader.take("=")
    decl.members[name] = int(reader.take())
    if reader.peek() == ",":
        reader.take()


def _interface_item(reader: _Reader, decl: AidlDecl) -> None:
    if reader.peek() == "const":
        reader.take()
        reader.type_name()
        name = reader.take()
        reader.take("=")
        decl.constants[name] = int(reader.take())
        reader.take(";")
        return
    reader.annotations()
    oneway = decl.oneway or reader.peek() == "oneway"
    if reader.peek() == "oneway":
        reader.take()
    return_type = reader.type_name()
    name = reader.take()
    reader.take("(")
    params: list[AidlParam] = []
    while reader.peek() != ")":
        direction = reader.take() if reader.peek() in {"in", "out", "inout"} else None
        nullable = "nullable" in reader.annotations()
        type_name = reader.type_name()
        params.append(AidlParam(reader.take(), type_name, nullable, direction))
        if reader.peek() == ",":
            reader.take()
    reader.take(")")
    reader.take(";")
    decl.methods.append(AidlMethod(name, return_type, tuple(params), oneway))


def hal_sources() -> dict[str, str]:
    """The shipped AIDL files of the HAL, by declaration name."""
    folder = resources.files(__package__).joinpath("aidl", *HAL_PACKAGE.split("."))
    return {
        entry.name.removesuffix(".aidl"): entry.read_text(encoding="utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".aidl")
    }


def load_hal() -> dict[str, AidlDecl]:
    """Every shipped HAL declaration, parsed, by name."""
    return {name: parse_aidl(text) for name, text in hal_sources().items()}


def _field_bounds(metadata: list[Any]) -> tuple[int, int] | None:
    ranges = [m for m in metadata if isinstance(m, Range)]
    return (ranges[0].low, ranges[0].high) if ranges else None


def _type_problem(aidl_type: str, info: FieldInfo) -> str | None:
    """Why a pydantic field cannot carry an AIDL type, or None if it can."""
    annotation = info.annotation
    args = get_args(annotation)
    base = next((a for a in args if a is not type(None)), annotation) if args else annotation
    if aidl_type in {"int", "long"}:
        bounds = _field_bounds(info.metadata)
        if base is not int or bounds is None:
            return f"is {annotation!r}, expected a bounded int for AIDL {aidl_type}"
        low, high = bounds
        if aidl_type == "int" and not (low >= INT32_MIN and high <= INT32_MAX):
            return f"allows {low}..{high}, wider than AIDL int"
        if aidl_type == "long" and not (low >= INT64_MIN and INT32_MAX < high <= INT64_MAX):
            return f"allows {low}..{high}, which is not an AIDL long range"
        return None
    expected = {"boolean": bool, "String": str}.get(aidl_type)
    if expected is not None:
        return None if base is expected else f"is {annotation!r}, expected {expected.__name__}"
    if match := re.fullmatch(r"byte\[(\d+)\]", aidl_type):
        size = int(match.group(1))
        shortest = [m.min_length for m in info.metadata if hasattr(m, "min_length")]
        longest = [m.max_length for m in info.metadata if hasattr(m, "max_length")]
        if base is not bytes or shortest != [size] or longest != [size]:
            return f"is {annotation!r}, expected exactly {size} bytes"
        return None
    if not (isinstance(base, type) and base.__name__ == aidl_type):
        return f"is {annotation!r}, expected {aidl_type}"
    return None


def model_parity(decl: AidlDecl, model: type[BaseModel]) -> list[str]:
    """Every way `model` differs from the parcelable `decl`: names, order, types, nullability."""
    problems: list[str] = []
    fields = list(model.model_fields.items())
    aliases = [info.alias or name for name, info in fields]
    expected = [f.name for f in decl.fields]
    if aliases != expected:
        problems.append(f"{model.__name__} fields are {aliases}, the AIDL has {expected}")
    by_alias = {info.alias or name: info for name, info in fields}
    for aidl_field in decl.fields:
        info = by_alias.get(aidl_field.name)
        if info is None:
            continue
        nullable = type(None) in get_args(info.annotation)
        if nullable != aidl_field.nullable:
            state = "nullable" if aidl_field.nullable else "not nullable"
            problems.append(f"{model.__name__}.{aidl_field.name} must be {state}")
        if problem := _type_problem(aidl_field.type, info):
            problems.append(f"{model.__name__}.{aidl_field.name} {problem}")
    return problems
