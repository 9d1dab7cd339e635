"""What an ONNX Runtime session says of its model, and how it checks a run's inputs, done in
the app's process from the model itself: the managed session answers `get_inputs` and
refuses a wrong name, dtype or shape with the same exception class and message as the
runtime, before anything reaches the daemon."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npumanager.daemon.wire.tensors import DTYPES
from npumanager.schemas.limits import INT64_MAX

_ELEMENT_TYPES = {
    1: ("float", np.float32),
    2: ("uint8", np.uint8),
    3: ("int8", np.int8),
    4: ("uint16", np.uint16),
    5: ("int16", np.int16),
    6: ("int32", np.int32),
    7: ("int64", np.int64),
    8: ("string", np.object_),
    9: ("bool", np.bool_),
    10: ("float16", np.float16),
    11: ("double", np.float64),
    12: ("uint32", np.uint32),
    13: ("uint64", np.uint64),
}
"""ONNX element types (`TensorProto.DataType`) as the runtime names them, and their numpy
dtypes."""
_NUMPY_NAMES = {np.dtype(dtype): name for name, dtype in _ELEMENT_TYPES.values()}
_PREFIX = {
    "Fail": "[ONNXRuntimeError] : 1 : FAIL : ",
    "InvalidArgument": "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ",
    "NoSuchFile": "[ONNXRuntimeError] : 3 : NO_SUCHFILE : ",
    "EngineError": "[ONNXRuntimeError] : 5 : ENGINE_ERROR : ",
    "InvalidProtobuf": "[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : ",
    "NotImplemented": "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : ",
}
"""How the runtime begins the message of each of its exception classes."""


@dataclass(frozen=True)
class NodeArg:
    """An input or output of the model as `onnxruntime.NodeArg` shows it."""

    name: str
    type: str
    shape: list[int | str | None]
    ranked: bool = True
    """False when the model gives no shape: then any shape is taken."""

    def __str__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"

    @property
    def dtype(self) -> Any:
        """The numpy dtype of a tensor of this type, or None for other types."""
        for name, dtype in _ELEMENT_TYPES.values():
            if self.type == f"tensor({name})":
                return np.dtype(dtype)
        return None


@dataclass(frozen=True)
class ModelMetadata:
    """The model's metadata as `onnxruntime.ModelMetadata` shows it."""

    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Signature:
    """A model's inputs (those without a default), outputs and metadata."""

    inputs: list[NodeArg]
    outputs: list[NodeArg]
    overridable: list[NodeArg]
    meta: ModelMetadata


def _type_name(proto: Any) -> str:
    kind = proto.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({_ELEMENT_TYPES.get(proto.tensor_type.elem_type, ('undefined',))[0]})"
    if kind == "sequence_type":
        return f"seq({_type_name(proto.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({_type_name(proto.optional_type.elem_type)})"
    if kind == "map_type":
        key = _ELEMENT_TYPES.get(proto.map_type.key_type, ("undefined",))[0]
        return f"map({key},{_type_name(proto.map_type.value_type)})"
    return "undefined"


def _arg(value_info: Any) -> NodeArg:
    proto = value_info.type
    shape: list[int | str | None] | None = None
    if proto.WhichOneof("value") == "tensor_type" and proto.tensor_type.HasField("shape"):
        shape = [
            d.dim_value if d.HasField("dim_value") else d.dim_param if d.dim_param else None
            for d in proto.tensor_type.shape.dim
        ]
    return NodeArg(value_info.name, _type_name(proto), shape or [], shape is not None)


def signature(model: Any) -> Signature:
    """The signature of an `onnx.ModelProto`."""
    graph = model.graph
    initialized = {tensor.name for tensor in graph.initializer}
    meta = ModelMetadata(
        producer_name=model.producer_name,
        graph_name=graph.name,
        domain=model.domain,
        description=model.doc_string,
        graph_description=graph.doc_string,
        version=model.model_version if model.HasField("model_version") else INT64_MAX,
        custom_metadata_map={entry.key: entry.value for entry in model.metadata_props},
    )
    return Signature(
        inputs=[_arg(v) for v in graph.input if v.name not in initialized],
        outputs=[_arg(v) for v in graph.output],
        overridable=[_arg(v) for v in graph.input if v.name in initialized],
        meta=meta,
    )


_CARRIED = frozenset(
    f"tensor({name})" for name, dtype in _ELEMENT_TYPES.values() if np.dtype(dtype).name in DTYPES
)
"""The types the manager's data plane carries (`daemon.wire.tensors.DTYPES`): tensors of
numbers and booleans."""


def uncarried(model: Signature) -> str | None:
    """The first input or output of a model that the manager's data plane cannot carry
    (strings, sequences, maps, optionals: a classifier's ``ZipMap``), said as
    ``output 'probs' (seq(map(int64,tensor(float))))``; None when it carries them all."""
    for role, args in (("input", model.inputs), ("output", model.outputs)):
        for arg in args:
            if arg.type not in _CARRIED:
                return f"{role} {arg.name!r} ({arg.type})"
    return None


def runtime_error(errors: Any, kind: str, message: str) -> BaseException:
    """The runtime's own exception `kind` (`InvalidArgument`, `Fail`, ...) with its prefix."""
    error: BaseException = getattr(errors, kind)(_PREFIX.get(kind, "") + message)
    return error


def _tensor_type(array: np.ndarray) -> str:
    name = _NUMPY_NAMES.get(array.dtype.newbyteorder("="))
    if name is None and array.dtype.kind in "US":
        name = "string"
    return f"tensor({name or array.dtype.name})"


def _converted(name: str, value: Any, arg: NodeArg | None) -> np.ndarray:
    if isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, list | tuple):
        array = np.asarray(value, dtype=None if arg is None else arg.dtype)
    elif isinstance(value, str):
        raise RuntimeError(
            f"Input must be a list of dictionaries or a single numpy array for input '{name}'."
        )
    else:
        raise RuntimeError(f"Unable to handle object of type {type(value)}")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array if array.flags.c_contiguous else array.copy(order="C")


def check_feed(
    signature: Signature, output_names: Sequence[str] | None, feed: Mapping[str, Any], errors: Any
) -> dict[str, np.ndarray]:
    """The feed as contiguous arrays, checked as the runtime checks it: missing inputs
    (`ValueError`), values it cannot take (`RuntimeError`), then every input's name, each
    input's type and shape, and each output's name (`errors.InvalidArgument`)."""
    given = list(feed.keys())
    missing = [arg.name for arg in signature.inputs if arg.name not in feed]
    if missing:
        raise ValueError(f"Required inputs ({missing}) are missing from input feed ({given}).")
    args = {arg.name: arg for arg in signature.inputs}
    args.update((arg.name, arg) for arg in signature.overridable)
    arrays = {name: _converted(name, feed[name], args.get(name)) for name in given}
    for name in arrays:
        if name not in args:
            raise runtime_error(errors, "InvalidArgument", f"Invalid input name: {name}")
    for name, array in arrays.items():
        _check_input(args[name], name, array, errors)
    known = {arg.name for arg in signature.outputs}
    for wanted in output_names or ():
        if wanted not in known:
            raise runtime_error(errors, "InvalidArgument", f"Invalid output name:{wanted}")
    return arrays


def _check_input(arg: NodeArg, name: str, array: np.ndarray, errors: Any) -> None:
    actual = _tensor_type(array)
    if arg.type != actual:
        raise runtime_error(
            errors,
            "InvalidArgument",
            f"Unexpected input data type. Actual: ({actual}) , expected: ({arg.type})",
        )
    if not arg.ranked:
        return
    if len(arg.shape) != array.ndim:
        raise runtime_error(
            errors,
            "InvalidArgument",
            f"Invalid rank for input: {name} Got: {array.ndim} Expected: {len(arg.shape)} "
            "Please fix either the inputs/outputs or the model.",
        )
    wrong = [
        f" index: {index} Got: {got} Expected: {want}\n"
        for index, (got, want) in enumerate(zip(array.shape, arg.shape, strict=True))
        if isinstance(want, int) and want != got
    ]
    if wrong:
        raise runtime_error(
            errors,
            "InvalidArgument",
            f"Got invalid dimensions for input: {name} for the following indices\n"
            f"{''.join(wrong)} Please fix either the inputs/outputs or the model.",
        )
