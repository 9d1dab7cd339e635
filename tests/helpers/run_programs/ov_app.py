"""A program that uses only OpenVINO's public API. Usage: ov_app.py MODEL; one line a step."""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import openvino as ov


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


if __name__ == "__main__":
    main(sys.argv[1])
