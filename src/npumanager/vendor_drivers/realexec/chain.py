"""A model built in code for real work of a chosen duration: a chain of matrix multiplications.

Input `x` is `[rows, width]` float32 with a dynamic row count, so the duration of one
inference grows with the rows; each layer is `tanh(x @ W)`, so values stay bounded and
a runtime can stop between layers when asked to cancel.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from npumanager.schemas.limits import CHAIN_LAYERS, CHAIN_WIDTH

INPUT = "x"
OUTPUT = "y"


def chain_model(layers: int = CHAIN_LAYERS, width: int = CHAIN_WIDTH, seed: int = 0) -> bytes:
    """The serialized ONNX model: `layers` of `tanh(x @ W_i)` on `[rows, width]`."""
    rng = np.random.default_rng(seed)
    weights = [
        numpy_helper.from_array(
            (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), f"w{i}"
        )
        for i in range(layers)
    ]
    nodes, current = [], INPUT
    for i in range(layers):
        out = OUTPUT if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [out]))
        current = out
    graph = helper.make_graph(
        nodes,
        "matmul_chain",
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["rows", width])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["rows", width])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data: bytes = model.SerializeToString()
    return data


def chain_inputs(rows: int, width: int = CHAIN_WIDTH) -> dict[str, np.ndarray]:
    """Inputs of `rows` rows for the chain model."""
    return {INPUT: np.full((rows, width), 0.5, dtype=np.float32)}
