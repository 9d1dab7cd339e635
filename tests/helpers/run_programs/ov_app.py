"""A program that uses only OpenVINO's public API. Usage: ov_app.py MODEL; one line a step."""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np
import openvino as ov

try:
    from openvino.utils.data_helpers import OVDict
except ImportError:  # an OpenVINO older than 2025
    from openvino.runtime.utils.data_helpers import OVDict


def digest(arrays: list[np.ndarray]) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()[
        :16
    ]


def main(model: str) -> None:
    core = ov.Core()
    x = np.full((4, 256), 0.5, np.float32)
    compiled = core.compile_model(model, "CPU")
    print("managed", bool(getattr(ov, "__npu_manager_managed__", False)), flush=True)
    print("call", digest([compiled({"x": x})[0]]), flush=True)
    print("by_port", digest([compiled([x])[compiled.output(0)]]), flush=True)
    request = core.compile_model(core.read_model(model), "CPU").create_infer_request()
    request.infer({0: x})
    print("request", digest([request.get_output_tensor(0).data]), flush=True)
    request.start_async({"x": x})
    request.wait()
    print("async", digest([request.results[0]]), flush=True)
    results = compiled({"x": x})
    name = sorted(results.names()[0])[0]
    by_name, by_index, by_port = results[name], results[0], results[compiled.output(0)]
    print(
        "results",
        isinstance(results, OVDict),
        len(results),
        np.array_equal(by_name, by_index) and np.array_equal(by_index, by_port),
        digest(list(results.to_tuple())) == digest(list(results.values())) == digest([by_index]),
        [len(key.get_names()) > 0 for key in results],
        [type(error).__name__ for error in missing(results)],
        flush=True,
    )


def missing(results: OVDict) -> list[Exception]:
    """What looking up what a run's results do not hold raises."""
    raised = []
    for key in (7, "no such output", 1.5):
        try:
            results[key]
        except Exception as error:
            raised.append(error)
    return raised


def strings(model: str) -> None:
    """A model of string tensors, which the data plane does not carry."""
    try:
        compiled = ov.Core().compile_model(model, "CPU")
    except RuntimeError as error:
        print("refused", str(error).replace("\n", " "), flush=True)
        return
    print("managed_model", type(compiled).__name__ != "CompiledModel", flush=True)
    outputs = compiled({0: np.array(["a", "bc"])})
    print("outputs", [list(array.tolist()) for array in outputs.values()], flush=True)
    # This OpenVINO frees a string inference's results wrongly and aborts at teardown,
    # with or without the manager: end here, as the outputs are out.
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[2:] == ["strings"]:
        strings(sys.argv[1])
    else:
        main(sys.argv[1])
