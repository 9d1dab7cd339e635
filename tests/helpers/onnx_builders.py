"""Small ONNX models for the weight-counting and external-data tests: each holds its data
in one of the places a model can (initializers, Constant nodes, attributes, subgraphs,
functions, sparse tensors, another file), and some lie about it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]
WIDTH = 16


def _model(
    nodes: list[onnx.NodeProto],
    initializers: list[onnx.TensorProto] = (),  # type: ignore[assignment]
    **kw: object,
) -> onnx.ModelProto:
    """y = x + c, where the nodes make `c` (float32[WIDTH])."""
    graph = helper.make_graph(
        [*nodes, helper.make_node("Add", ["x", "c"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, WIDTH])],
        initializer=list(initializers),
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8, **kw)  # type: ignore[arg-type]


def values(count: int = WIDTH, start: float = 0.0) -> np.ndarray:
    return np.arange(start, start + count, dtype=np.float32)


def initializer_model(c: np.ndarray | None = None) -> onnx.ModelProto:
    return _model([], [numpy_helper.from_array(values() if c is None else c, "c")])


def constant_model(nbytes: int = WIDTH * 4) -> onnx.ModelProto:
    """`c` from a Constant node's tensor, `nbytes` of float32 in all (the first WIDTH used)."""
    big = np.zeros(nbytes // 4, np.float32)
    big[:WIDTH] = values()
    nodes = [
        helper.make_node("Constant", [], ["big"], value=numpy_helper.from_array(big)),
        helper.make_node(
            "Slice",
            ["big", "zero", "width"],
            ["c"],
        ),
    ]
    limits = [
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([WIDTH], np.int64), "width"),
    ]
    return _model(nodes, limits)


def constant_floats_model() -> onnx.ModelProto:
    """`c` from a Constant node's `value_floats` list."""
    return _model([helper.make_node("Constant", [], ["c"], value_floats=values().tolist())])


def subgraph_model() -> onnx.ModelProto:
    """`c` from an If node whose branches each hold a Constant."""

    def branch(name: str, c: np.ndarray) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("Constant", [], [f"{name}_c"], value=numpy_helper.from_array(c))],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_c", TensorProto.FLOAT, [WIDTH])],
        )

    nodes = [
        helper.make_node(
            "If",
            ["flag"],
            ["c"],
            then_branch=branch("then", values()),
            else_branch=branch("else", values(start=100)),
        )
    ]
    flag = numpy_helper.from_array(np.array(True), "flag")
    return _model(nodes, [flag])


def function_model() -> onnx.ModelProto:
    """`c` from a local function whose body is a Constant."""
    body = helper.make_function(
        "local",
        "MakeC",
        [],
        ["out"],
        [helper.make_node("Constant", [], ["out"], value=numpy_helper.from_array(values()))],
        OPSET,
    )
    opsets = [*OPSET, helper.make_opsetid("local", 1)]
    graph_nodes = [helper.make_node("MakeC", [], ["c"], domain="local")]
    graph = helper.make_graph(
        [*graph_nodes, helper.make_node("Add", ["x", "c"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, WIDTH])],
    )
    return helper.make_model(graph, opset_imports=opsets, ir_version=8, functions=[body])


def sparse_constant_model() -> onnx.ModelProto:
    """`c` from a Constant node's sparse tensor: WIDTH values, all present."""
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(values(), "c_values"),
        numpy_helper.from_array(np.arange(WIDTH, dtype=np.int64), "c_indices"),
        [WIDTH],
    )
    return _model([helper.make_node("Constant", [], ["c"], sparse_value=sparse)])


def bare_tensor(name: str, dims: list[int]) -> onnx.TensorProto:
    """A float32 tensor of a shape, with no data yet."""
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT)
    tensor.dims.extend(dims)
    return tensor


def external_model(location: str, offset: int = 0) -> onnx.ModelProto:
    """`c` as an initializer whose WIDTH float32 lie in the file `location` at `offset`."""
    tensor = bare_tensor("c", [WIDTH])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", "64")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return _model([], [tensor])


def save_external(folder: Path, c: np.ndarray | None = None, name: str = "m.onnx") -> Path:
    """An external-data model beside its weights file (`weights.bin`) in `folder`."""
    (folder / "weights.bin").write_bytes((values() if c is None else c).tobytes())
    path = folder / name
    path.write_bytes(external_model("weights.bin").SerializeToString())
    return path


def lying_raw_model(declared: int, present: int) -> onnx.ModelProto:
    """An initializer whose shape says `declared` float32 but whose raw data has `present`."""
    tensor = bare_tensor("c", [declared])
    tensor.raw_data = np.zeros(present, np.float32).tobytes()
    return _model([], [tensor])


def lying_typed_model(declared: int, present: int) -> onnx.ModelProto:
    """An initializer whose shape says `declared` float32 but that lists `present` floats."""
    tensor = bare_tensor("c", [declared])
    tensor.float_data.extend([0.0] * present)
    return _model([], [tensor])


def conv_batchnorm_model(channels: int = 8, seed: int = 0) -> onnx.ModelProto:
    """y = BatchNormalization(Conv(x)), x float32[1, 3, 16, 16]: ONNX Runtime's graph
    optimisations fold the normalisation into the convolution's weights, so its output
    differs in the last bits with them and without them."""
    rng = np.random.default_rng(seed)
    arrays = {
        "W": rng.standard_normal((channels, 3, 3, 3)).astype(np.float32),
        "B": rng.standard_normal(channels).astype(np.float32),
        "scale": rng.uniform(0.5, 2, channels).astype(np.float32),
        "bias": rng.standard_normal(channels).astype(np.float32),
        "mean": rng.standard_normal(channels).astype(np.float32),
        "var": rng.uniform(0.5, 2, channels).astype(np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"]),
        ],
        "conv_batchnorm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 16, 16])],
        initializer=[numpy_helper.from_array(a, name) for name, a in arrays.items()],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8)


def zipmap_model() -> onnx.ModelProto:
    """A classifier's tail: the probabilities of x float32[N, 3] as a tensor and as a
    sequence of maps from class to probability (``ZipMap``, as converted scikit-learn
    classifiers give them)."""
    graph = helper.make_graph(
        [
            helper.make_node("Softmax", ["x"], ["p"], axis=1),
            helper.make_node(
                "ZipMap", ["p"], ["probs"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2]
            ),
        ],
        "zipmap",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
        [
            helper.make_tensor_value_info("p", TensorProto.FLOAT, [None, 3]),
            helper.make_value_info(
                "probs",
                helper.make_sequence_type_proto(
                    helper.make_map_type_proto(
                        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])
                    )
                ),
            ),
        ],
    )
    return helper.make_model(
        graph, opset_imports=[*OPSET, helper.make_opsetid("ai.onnx.ml", 3)], ir_version=8
    )


def strings_model() -> onnx.ModelProto:
    """t = s, for s a string tensor of any length."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["t"])],
        "strings",
        [helper.make_tensor_value_info("s", TensorProto.STRING, [None])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, [None])],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8)
