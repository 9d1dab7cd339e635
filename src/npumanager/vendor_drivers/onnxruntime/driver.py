"""The `onnxruntime` driver: ONNX models in `InferenceSession`s, run for real on worker
threads (`RealDriver`), ordered by the fair device scheduler.

Models come from bytes, a `ModelProto` or a path; their weight bytes are every byte of
data they hold (`onnx_weights`), counted before the session opens, against
`capacity_bytes` per device. External data is read from the descriptors sent with the
model and put into it: the runtime never opens a file. Execution providers are configurable
(`providers=`, default CPU); after opening a session the driver checks
`get_providers()`, logs a provider that fell back (the OpenVINO EP runs on CPU when no
NPU is present) and reports the one really used as the session's `target`. A running
inference is stopped with `RunOptions.terminate`. A model of a uid in a background band
(`is_background`) is marked `ep.dynamic.workload_type = Efficient` where the provider takes it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]

from npumanager.checks import check_int
from npumanager.core.driver.contract import Asked
from npumanager.errors import IllegalArgumentError
from npumanager.schemas.device import DeviceSpec
from npumanager.schemas.limits import (
    INT64_MAX,
    MAX_INTRA_OP_THREADS,
    REAL_DEFAULT_CAPACITY_BYTES,
    REAL_DEFAULT_CHANNELS,
)
from npumanager.vendor_drivers.onnxruntime.options import apply_options
from npumanager.vendor_drivers.realexec.base import ModelSource, RealDriver, real_specs
from npumanager.vendor_drivers.realexec.onnx_weights import (
    OnnxWeights,
    count,
    counted_model,
    inlined,
)
from npumanager.vendor_drivers.realexec.session import Call, Counted, InputSpec, is_background
from npumanager.vendor_drivers.realexec.threads import run_threads

log = logging.getLogger(__name__)

DEFAULT_PROVIDERS = ("CPUExecutionProvider",)
WORKLOAD_TYPE = "ep.dynamic.workload_type"

_DTYPES: dict[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def weight_bytes_of(model: onnx.ModelProto) -> int:
    """The bytes of every piece of data the model holds (its weights; `onnx_weights`)."""
    return count(model).weight_bytes


class OrtSession:
    """One ONNX model in an `InferenceSession`."""

    def __init__(
        self,
        counted: OnnxWeights,
        providers: Sequence[Any],
        threads: int,
        device: int,
        asked: Mapping[str, str] | None = None,
    ) -> None:
        options = ort.SessionOptions()
        apply_options(options, asked or {})  # a bad option is refused before any work
        proto = inlined(counted)
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # The pool threads spin within a run, as by default, but stop at its end: their
        # spinning between runs would be CPU time no grant covers, for which the audit
        # would stop and kill an honest model host.
        options.add_session_config_entry("session.force_spinning_stop", "1")
        try:
            self.session = ort.InferenceSession(
                proto.SerializeToString(), sess_options=options, providers=list(providers)
            )
        except Exception as exc:
            raise IllegalArgumentError(f"onnxruntime cannot open the model: {exc}") from None
        self.weight_bytes = counted.weight_bytes
        wanted = [p if isinstance(p, str) else p[0] for p in providers]
        used = list(self.session.get_providers())
        self.target = used[0] if used else "none"
        if wanted and self.target != wanted[0]:
            log.warning(
                "device %d: onnxruntime asked for %s but runs on %s", device, wanted[0], used
            )
        inputs = []
        for arg in self.session.get_inputs():
            dtype = _DTYPES.get(arg.type)
            if dtype is None:
                raise IllegalArgumentError(f"input {arg.name!r} has unsupported type {arg.type}")
            shape = tuple(d if isinstance(d, int) and d > 0 else None for d in arg.shape)
            inputs.append(InputSpec(arg.name, shape, np.dtype(dtype)))
        self.inputs = tuple(inputs)
        self.background: bool | None = None
        self._warned = False

    def run(self, feeds: dict[str, np.ndarray], call: Call) -> list[np.ndarray]:
        """One inference; `call.cancel()` sets `RunOptions.terminate`."""
        options = ort.RunOptions()

        def stop() -> None:
            options.terminate = True

        call.arm(stop)
        return list(self.session.run(None, feeds, options))

    def set_band(self, band: int, bands: int) -> None:
        """Mark the workload Efficient for a background band (`is_background`), else Default."""
        background = is_background(band, bands)
        if background == self.background:
            return
        self.background = background
        setter = getattr(self.session, "set_ep_dynamic_options", None)
        try:
            if setter is None:
                raise NotImplementedError("this onnxruntime has no set_ep_dynamic_options")
            setter({WORKLOAD_TYPE: "Efficient" if background else "Default"})
        except Exception as exc:
            if not self._warned:
                self._warned = True
                log.info(
                    "%s does not take %s (%s); the driver's queue orders the work",
                    self.target,
                    WORKLOAD_TYPE,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                )

    def close(self) -> None:
        """Drop the session."""
        self.session = None


class OnnxRuntimeDriver(RealDriver):
    """ONNX models run for real on `channels` worker threads per device."""

    def __init__(
        self,
        devices: int | Sequence[DeviceSpec | Mapping[str, Any]] = 1,
        *,
        providers: Sequence[Any] = DEFAULT_PROVIDERS,
        capacity_bytes: int = REAL_DEFAULT_CAPACITY_BYTES,
        channels: int = REAL_DEFAULT_CHANNELS,
        intra_op_threads: int = 1,
        **options: Any,
    ) -> None:
        capacity = check_int("capacity_bytes", capacity_bytes, 1, INT64_MAX)
        specs = real_specs(devices, channels, capacity)
        available = set(ort.get_available_providers())
        names = [p if isinstance(p, str) else p[0] for p in providers]
        unknown = [n for n in names if n not in available]
        if not names or unknown:
            raise IllegalArgumentError(
                f"providers {unknown or names} are not available; available: {sorted(available)}"
            )
        self.providers = list(providers)
        self.intra_op_threads = check_int(
            "intra_op_threads", intra_op_threads, 1, MAX_INTRA_OP_THREADS
        )
        super().__init__(specs, **options)

    def _count(self, model: ModelSource, sidecars: Mapping[str, int]) -> OnnxWeights:
        return counted_model(model, sidecars)

    def _open(self, device: int, counted: Counted, band: int, asked: Asked) -> OrtSession:
        assert isinstance(counted, OnnxWeights)
        background = is_background(band, len(self.specs[device].bands))
        count = run_threads(asked.threads, self.intra_op_threads, background)
        return OrtSession(counted, self.providers, count, device, asked.options)
