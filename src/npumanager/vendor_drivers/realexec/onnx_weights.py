"""An ONNX model's weights, counted from the model itself before a runtime sees it.

Every piece of data counts (`modelfiles.onnx_contents`): initializers, sparse tensors,
tensor attributes of any node in any graph, subgraph or function, and Constant nodes'
lists. Each tensor's data must agree with its shape and type, or the model is refused:
the count is of the bytes really there. Data in another file is read only from the
descriptors the client sent (`inline_external`), never by a name the model gives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx

from npumanager.errors import IllegalArgumentError
from npumanager.modelfiles import (
    external_location,
    onnx_contents,
    read_span,
    sidecar_key,
)
from npumanager.schemas.limits import INT64_MAX

_BITS = {
    "FLOAT": 32, "UINT8": 8, "INT8": 8, "UINT16": 16, "INT16": 16, "INT32": 32, "INT64": 64,
    "BOOL": 8, "FLOAT16": 16, "DOUBLE": 64, "UINT32": 32, "UINT64": 64, "COMPLEX64": 64,
    "COMPLEX128": 128, "BFLOAT16": 16, "FLOAT8E4M3FN": 8, "FLOAT8E4M3FNUZ": 8,
    "FLOAT8E5M2": 8, "FLOAT8E5M2FNUZ": 8, "FLOAT8E8M0": 8, "UINT4": 4, "INT4": 4,
    "FLOAT4E2M1": 4,
}  # fmt: skip
"""Bits an element of each ONNX tensor type takes (STRING has none: its strings count)."""
_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")


@dataclass
class OnnxWeights:
    """A parsed ONNX model, its weight bytes, and its tensors whose data lies elsewhere."""

    model: onnx.ModelProto
    weight_bytes: int
    external: list[tuple[str, onnx.TensorProto, int]] = field(default_factory=list)
    """(where, tensor, bytes) of each tensor whose data is in another file."""
    sidecars: Mapping[str, int] = field(default_factory=dict)
    """The files sent with the model (descriptors by name), for `inline_external`."""


ONNX_ADVICE = "not an ONNX model ({}); give ONNX bytes, an onnx.ModelProto or a .onnx path"


def parse(data: bytes, advice: str = ONNX_ADVICE) -> onnx.ModelProto:
    """An ONNX model from its bytes; anything else is an `IllegalArgumentError` whose
    message is `advice` with the reason filled in."""
    try:
        proto = onnx.load_model_from_string(data)
    except Exception as exc:
        raise IllegalArgumentError(advice.format(exc)) from None
    if not proto.graph.node:
        raise IllegalArgumentError(advice.format("the bytes hold no graph"))
    return proto


def counted_model(
    model: Any, sidecars: Mapping[str, int], advice: str = ONNX_ADVICE
) -> OnnxWeights:
    """An ONNX model from bytes or a `ModelProto`, counted, with the files sent with it;
    anything else is refused."""
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, bytes | bytearray):
        proto = parse(bytes(model), advice)
    else:
        raise IllegalArgumentError(
            f"model must be ONNX bytes or an onnx.ModelProto (a file: path=); got {model!r:.60}"
        )
    counted = count(proto)
    counted.sidecars = sidecars
    return counted


def inlined(counted: OnnxWeights) -> onnx.ModelProto:
    """The model with its external data read in from the files sent with it (a copy when
    there is any, so a caller's own `ModelProto` stays as it was)."""
    if not counted.external:
        return counted.model
    proto = onnx.ModelProto()
    proto.CopyFrom(counted.model)
    copy = count(proto)
    inline_external(copy, counted.sidecars)
    return proto


def count(model: onnx.ModelProto) -> OnnxWeights:
    """Count every byte of data the model holds; a tensor whose data disagrees with its
    shape, or a data type without a known size, is refused."""
    counted = OnnxWeights(model, 0)
    total = 0
    for held in onnx_contents(model):
        if held.kind == "tensor":
            total += _tensor(held.where, held.value, counted)
        elif held.kind == "sparse":
            total += _sparse(held.where, held.value, counted)
        else:
            attribute = held.value
            total += 4 * len(attribute.floats) + 8 * len(attribute.ints)
            total += sum(len(s) for s in attribute.strings)
        if total > INT64_MAX:
            raise IllegalArgumentError("the model's weights add up past 2^63 bytes")
    counted.weight_bytes = total
    return counted


def _elements(where: str, dims: Any) -> int:
    if any(d < 0 for d in dims):
        raise IllegalArgumentError(f"{where}: a tensor has a negative dimension {list(dims)}")
    elements = int(math.prod(dims))
    if elements > INT64_MAX:
        raise IllegalArgumentError(f"{where}: a tensor of {elements} elements is too large")
    return elements


def _tensor(where: str, tensor: onnx.TensorProto, counted: OnnxWeights) -> int:
    """The bytes of one tensor, checked against its shape and type."""
    where = f"{where} ({tensor.name!r})" if tensor.name and tensor.name not in where else where
    elements = _elements(where, tensor.dims)
    if tensor.HasField("segment"):
        raise IllegalArgumentError(f"{where}: segmented tensors are not taken")
    try:
        type_name = onnx.TensorProto.DataType.Name(tensor.data_type)
    except ValueError:
        type_name = str(tensor.data_type)
    if type_name == "STRING":
        if len(tensor.string_data) != elements or tensor.raw_data:
            raise IllegalArgumentError(
                f"{where}: a string tensor of {elements} elements holds "
                f"{len(tensor.string_data)} strings"
            )
        return sum(len(s) for s in tensor.string_data)
    bits = _BITS.get(type_name)
    if bits is None:
        raise IllegalArgumentError(f"{where}: tensor data type {type_name} is not taken")
    nbytes = (elements * bits + 7) // 8
    location = external_location(tensor)
    if location is not None:
        entries = {entry.key: entry.value for entry in tensor.external_data}
        length = entries.get("length")
        if length is not None and (not length.isdigit() or int(length) != nbytes):
            raise IllegalArgumentError(
                f"{where}: its shape needs {nbytes} bytes but its external data says "
                f"length {length}"
            )
        counted.external.append((where, tensor, nbytes))
        return nbytes
    if tensor.HasField("raw_data"):
        present = len(tensor.raw_data)
        if present != nbytes:
            raise IllegalArgumentError(
                f"{where}: its shape needs {nbytes} bytes but it holds {present}"
            )
        return nbytes
    values = sum(len(getattr(tensor, name)) for name in _TYPED_FIELDS)
    wanted = 2 * elements if type_name.startswith("COMPLEX") else elements
    if bits == 4:
        wanted = (elements + 1) // 2
    if values != wanted:
        raise IllegalArgumentError(
            f"{where}: its shape needs {wanted} values but it holds {values}"
        )
    return nbytes


def _sparse(where: str, sparse: onnx.SparseTensorProto, counted: OnnxWeights) -> int:
    dense = _elements(where, sparse.dims)
    values = _tensor(where, sparse.values, counted)
    if sparse.values.dims and sparse.values.dims[0] > dense:
        raise IllegalArgumentError(
            f"{where}: a sparse tensor of {dense} elements lists {sparse.values.dims[0]} values"
        )
    return values + _tensor(where, sparse.indices, counted)


def inline_external(counted: OnnxWeights, sidecars: Mapping[str, int]) -> None:
    """Read each external tensor's bytes from the file the client sent under its name, into
    the model (so the runtime reads no file); a name that did not come is refused."""
    for where, tensor, nbytes in counted.external:
        entries = {entry.key: entry.value for entry in tensor.external_data}
        name = sidecar_key(entries.get("location", ""))
        fd = sidecars.get(name)
        if fd is None:
            raise IllegalArgumentError(
                f"{where}: its data lies in {name!r}, which did not come with the model; "
                "a model's external data is read only from files sent with it: load it "
                "with path= (its weights files beside it), not as bytes; through the daemon "
                "the client finds them with the onnx package (install it beside npumanager)"
            )
        offset = entries.get("offset", "0")
        if not offset.isdigit():
            raise IllegalArgumentError(f"{where}: external data offset {offset!r} is not a number")
        data = read_span(fd, int(offset), nbytes, f"the weights file {name!r}")
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
        tensor.raw_data = data
    counted.external.clear()
