"""An OpenVINO IR's weights, counted from its `.xml` before OpenVINO reads anything.

Each layer whose data names a span of the weights file (`offset`, `size`: the Const
layers, in any body) counts its size; a size that disagrees with the layer's shape and
element type is refused, and so is an XML document with a DTD (entities could expand).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from xml.etree import ElementTree

from npumanager.errors import IllegalArgumentError
from npumanager.schemas.limits import INT64_MAX

_BITS = {
    "f64": 64, "f32": 32, "f16": 16, "bf16": 16, "i64": 64, "i32": 32, "i16": 16, "i8": 8,
    "u64": 64, "u32": 32, "u16": 16, "u8": 8, "boolean": 8, "i4": 4, "u4": 4, "u1": 1,
    "f8e4m3": 8, "f8e5m2": 8, "nf4": 4, "f4e2m1": 4, "f8e8m0": 8,
}  # fmt: skip
"""Bits an element of each IR element type takes; other types are counted by size alone."""


@dataclass(frozen=True)
class IrWeights:
    """An IR's weight bytes, and how much of its weights file the layers reach."""

    weight_bytes: int
    reach: int


def is_ir(data: bytes) -> bool:
    """True when the bytes look like an IR's XML rather than an ONNX protobuf."""
    return data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"<")


def count_ir(xml: bytes) -> IrWeights:
    """Count the weights an IR's XML names; a malformed or lying IR is refused."""
    if b"<!DOCTYPE" in xml or b"<!ENTITY" in xml:
        raise IllegalArgumentError("the IR's XML has a DTD; an OpenVINO IR has none")
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as exc:
        raise IllegalArgumentError(f"not an OpenVINO IR: the XML does not parse ({exc})") from None
    if root.tag != "net":
        raise IllegalArgumentError(f"not an OpenVINO IR: its root is <{root.tag}>, not <net>")
    total = reach = 0
    for layer in root.iter("layer"):
        data = layer.find("data")
        if data is None or "offset" not in data.attrib or "size" not in data.attrib:
            continue
        where = f"layer {layer.get('name', layer.get('id', '?'))!r}"
        offset, size = _number(where, data, "offset"), _number(where, data, "size")
        bits = _BITS.get(data.get("element_type", ""))
        shape = data.get("shape")
        if bits is not None and shape is not None:
            dims = [_dim(where, d) for d in shape.split(",") if d.strip()]
            wanted = (math.prod(dims) * bits + 7) // 8
            if wanted != size:
                raise IllegalArgumentError(
                    f"{where}: its shape [{shape}] needs {wanted} bytes but it names {size}"
                )
        total += size
        reach = max(reach, offset + size)
        if total > INT64_MAX or reach > INT64_MAX:
            raise IllegalArgumentError("the IR's weights add up past 2^63 bytes")
    return IrWeights(total, reach)


def _number(where: str, data: ElementTree.Element, name: str) -> int:
    text = data.get(name, "")
    if not text.isdigit() or len(text) > 19:
        raise IllegalArgumentError(f"{where}: {name} {text!r:.40} is not a number")
    return int(text)


def _dim(where: str, text: str) -> int:
    text = text.strip()
    if not text.isdigit() or len(text) > 19:
        raise IllegalArgumentError(f"{where}: a constant's dimension {text!r:.40} is not a number")
    return int(text)
