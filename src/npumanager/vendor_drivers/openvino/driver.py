"""The `openvino` driver: models compiled by OpenVINO on NPU, GPU, CPU or AUTO, run for real
on worker threads (`RealDriver`) with async inference requests.

`device` defaults to NPU when `Core().available_devices` has one, else CPU. Models come
from ONNX (bytes or a `.onnx` path), OpenVINO IR (a `.xml` path with its `.bin`) or an
`ov.Model`; weight bytes are counted from the model before OpenVINO reads it (every byte
of an ONNX model's data, an IR's spans of its `.bin`; an `ov.Model`'s constants), and
weights files come as descriptors, never by a name in the model. A model is compiled with
one stream per channel (`NUM_STREAMS`, and `INFERENCE_NUM_THREADS` per stream times streams), so the
channels' requests really run side by side; a device that grants fewer streams (the CPU: at
most its cores) is logged. On the CPU the channels share its cores, and the OS shares them
out evenly between a foreground and a background request, so the driver runs with
`shared_cores`: a foreground request stops the running background one (restart preemption:
it starts over later) and no background request starts beside it, unless the background
band is owed its floor share (`benchmarks/real_inference.py` measures it). Streams are not
pinned to cores (`ENABLE_CPU_PINNING` off): every app's model has its own, and pinned ones
put two apps' requests on one core. The computing happens on OpenVINO's stream threads,
which a lowered worker priority would not reach, so `background_nice` defaults to 0 here.
On an NPU the capacity is what the device reports free (`NPU_DEVICE_TOTAL_MEM_SIZE -
NPU_DEVICE_ALLOC_MEM_SIZE`), elsewhere `capacity_bytes`. A request runs with `start_async`
on the caller's arrays (shared, not copied, as ONNX Runtime reads them) and is waited for
with `wait()`, which releases the GIL; a Python completion callback is not used (it runs on
OpenVINO's thread and needs the GIL, and it does not fire on cancel). A running request is
stopped with `InferRequest.cancel()`, which ends the wait with an error. The uid's band is
relayed as `MODEL_PRIORITY` (HIGH above the last two bands, MEDIUM next to last, LOW last)
and `WORKLOAD_TYPE` (EFFICIENT for MEDIUM and LOW): at compile time where the device lists
the property, afterwards with `set_property`; where the device takes neither (the CPU
plugin) one log line says so and the driver's own queue does the ordering.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov  # type: ignore[import-untyped,unused-ignore]

from npumanager.checks import check_int
from npumanager.core.driver.contract import Asked
from npumanager.errors import IllegalArgumentError, UnknownDeviceError
from npumanager.modelfiles import read_span
from npumanager.schemas.device import DeviceSpec
from npumanager.schemas.limits import (
    INT64_MAX,
    MAX_INTRA_OP_THREADS,
    OPENVINO_DEVICES,
    REAL_DEFAULT_CAPACITY_BYTES,
    REAL_DEFAULT_CHANNELS,
)
from npumanager.vendor_drivers.openvino.ir import count_ir, is_ir
from npumanager.vendor_drivers.openvino.options import compile_options
from npumanager.vendor_drivers.realexec.base import ModelSource, RealDriver, real_specs
from npumanager.vendor_drivers.realexec.onnx_weights import OnnxWeights, counted_model, inlined
from npumanager.vendor_drivers.realexec.session import Call, Counted, InputSpec, is_background
from npumanager.vendor_drivers.realexec.threads import run_threads

log = logging.getLogger(__name__)

PRIORITY, WORKLOAD = "MODEL_PRIORITY", "WORKLOAD_TYPE"


def default_device(core: Any) -> str:
    """NPU if the machine has one, else CPU."""
    return "NPU" if any(d.startswith("NPU") for d in core.available_devices) else "CPU"


def band_properties(band: int, bands: int) -> dict[str, str]:
    """`MODEL_PRIORITY` and `WORKLOAD_TYPE` for band `band` of `bands` (0 most important)."""
    if bands == 1:
        priority = "MEDIUM"
    elif band == bands - 1:
        priority = "LOW"
    elif band == bands - 2 and bands >= 3:
        priority = "MEDIUM"
    else:
        priority = "HIGH"
    workload = "EFFICIENT" if is_background(band, bands) else "DEFAULT"
    return {PRIORITY: priority, WORKLOAD: workload}


def supported(core: Any, device: str) -> set[str]:
    """The properties a device lists."""
    try:
        return {str(p) for p in core.get_property(device, "SUPPORTED_PROPERTIES")}
    except Exception:
        return set()


_ADVICE = (
    "not an ONNX or OpenVINO IR model ({}); give ONNX bytes, an openvino.Model, or a .onnx / "
    ".xml path"
)


@dataclass
class OvCounted:
    """A model counted for OpenVINO: an `ov.Model` the app built, an ONNX model, or an IR's
    XML with the descriptor of its weights file."""

    weight_bytes: int
    model: Any = None
    onnx: OnnxWeights | None = None
    ir: bytes | None = None
    reach: int = 0
    weights: int | None = None
    """The IR's weights file (a descriptor sent with it), if any."""


def count_for_openvino(model: ModelSource, sidecars: Mapping[str, int]) -> OvCounted:
    """Parse and count a model (an `ov.Model`, ONNX bytes, or an IR's XML bytes whose
    `.bin` came as the one sidecar), reading no weights yet."""
    if isinstance(model, ov.Model):
        return OvCounted(_constant_bytes(model), model=model)
    if not isinstance(model, bytes | bytearray) or not model:
        raise IllegalArgumentError(
            f"model must be ONNX bytes or an openvino.Model (IR: path=); got {model!r:.60}"
        )
    if not is_ir(bytes(model)):
        onnx = counted_model(bytes(model), sidecars, _ADVICE)
        return OvCounted(onnx.weight_bytes, onnx=onnx)
    ir = count_ir(bytes(model))
    if len(sidecars) > 1:
        raise IllegalArgumentError(
            f"an IR keeps its weights in one .bin file; {len(sidecars)} files came with it"
        )
    weights = next(iter(sidecars.values()), None)
    if weights is None and ir.reach:
        raise IllegalArgumentError(
            "the IR's weights file (.bin) did not come with it: load an IR with path= to "
            "its .xml, its .bin beside it"
        )
    return OvCounted(ir.weight_bytes, ir=bytes(model), reach=ir.reach, weights=weights)


def _constant_bytes(model: Any) -> int:
    return sum(
        int(op.get_byte_size())
        for op in model.get_ordered_ops()
        if op.get_type_name() == "Constant"
    )


def _read(core: Any, counted: OvCounted) -> Any:
    """The `ov.Model` to compile: weights read now, from the descriptors sent."""
    if counted.model is not None:
        return counted.model
    try:
        if counted.onnx is not None:
            return core.read_model(inlined(counted.onnx).SerializeToString())
        weights = b""
        if counted.weights is not None and counted.reach:
            weights = read_span(counted.weights, 0, counted.reach, "the IR's weights file")
        return core.read_model(counted.ir, weights)
    except IllegalArgumentError:
        raise
    except Exception as exc:
        raise IllegalArgumentError(_ADVICE.format(str(exc).strip().splitlines()[-1])) from None


def _nothing() -> None:
    """A stop for a call whose request is back in the pool."""


class OvSession:
    """One model compiled for a device, with a pool of infer requests."""

    def __init__(
        self,
        core: Any,
        model: Any,
        device: str,
        threads: int,
        props: dict[str, str],
        streams: int = 1,
        wanted: Mapping[str, str] | None = None,
    ) -> None:
        self.weight_bytes = _constant_bytes(model)
        self.target = device
        self._listed = supported(core, device)
        config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
        if "NUM_STREAMS" in self._listed:
            # One stream per channel: with one, the plugin runs the channels' requests in
            # turn, so a later urgent inference would wait for a running one. A stream
            # needs threads of its own: the thread count is per stream times streams.
            config["NUM_STREAMS"] = streams
        if "INFERENCE_NUM_THREADS" in self._listed:
            config["INFERENCE_NUM_THREADS"] = threads * (streams if "NUM_STREAMS" in config else 1)
        if "ENABLE_CPU_PINNING" in self._listed:
            # Each app's model has streams of its own; pinned, every model's first stream
            # runs on the same core, so two apps' requests shared one core while the
            # other idled. Unpinned, the OS spreads them.
            config["ENABLE_CPU_PINNING"] = False
        config.update({k: v for k, v in props.items() if k in self._listed})
        wanted = wanted or {}
        config.update({k: v for k, v in wanted.items() if k in self._listed})
        if set(wanted) - set(self._listed):
            log.info(
                "%s takes no %s; the app's option is not applied",
                device,
                " / ".join(sorted(set(wanted) - set(self._listed))),
            )
        try:
            self.compiled = core.compile_model(model, device, config)
        except Exception as exc:
            raise IllegalArgumentError(
                f"OpenVINO cannot compile the model for {device}: "
                f"{str(exc).strip().splitlines()[-1]}"
            ) from None
        executing = self._get("EXECUTION_DEVICES")
        if executing:
            self.target = ",".join(map(str, executing))
        self.streams = int(self._get("NUM_STREAMS") or streams) if "NUM_STREAMS" in config else 0
        """Requests the compiled model runs at once (0: the device does not say)."""
        if 0 < self.streams < streams:
            log.info(
                "%s runs %d requests of a model at once, fewer than the %d channels (cores)",
                self.target,
                self.streams,
                streams,
            )
        self.relayed = dict(config.items() & props.items())
        self._warned = not (set(props) - set(self.relayed))
        if not self._warned:
            self._warned = True
            log.info(
                "%s takes no %s; the driver's own queue orders the work",
                device,
                " / ".join(sorted(set(props) - set(self.relayed))),
            )
        inputs = []
        for port in self.compiled.inputs:
            shape = tuple(
                None if d.is_dynamic else d.get_length() for d in port.get_partial_shape()
            )
            inputs.append(
                InputSpec(port.get_any_name(), shape, np.dtype(port.get_element_type().to_dtype()))
            )
        self.inputs = tuple(inputs)
        self._pool: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def _get(self, name: str) -> Any:
        try:
            return self.compiled.get_property(name)
        except Exception:
            return None

    def run(self, feeds: dict[str, np.ndarray], call: Call) -> list[np.ndarray]:
        """One async inference, waited for with the GIL released; `call.cancel()` cancels
        the request (`InferRequest.cancel()`), which ends the wait with an error."""
        try:
            request = self._pool.get_nowait()
        except queue.Empty:
            request = self.compiled.create_infer_request()
        try:
            # share_inputs: no copy of the inputs under the GIL (it held it for ms, and a
            # foreground thread returning from its own wait had to wait for it)
            request.start_async(feeds, share_inputs=True)
            call.arm(request.cancel)
            request.wait()  # raises if cancelled or failed
            count = len(self.compiled.outputs)
            outputs = [request.get_output_tensor(i).data.copy() for i in range(count)]
        finally:
            call.arm(_nothing)
            self._pool.put(request)
        if call.cancelled:
            raise RuntimeError("the inference was cancelled")
        return outputs

    def set_band(self, band: int, bands: int) -> None:
        """Relay the band as MODEL_PRIORITY / WORKLOAD_TYPE where the compiled model takes it."""
        wanted = band_properties(band, bands)
        for name, value in wanted.items():
            if self.relayed.get(name) == value:
                continue
            try:
                self.compiled.set_property({name: value})
                self.relayed[name] = value
            except Exception as exc:
                if not self._warned:
                    self._warned = True
                    log.info(
                        "%s does not take %s=%s (%s); the driver's own queue orders the work",
                        self.target,
                        name,
                        value,
                        str(exc).strip().splitlines()[-1],
                    )

    def close(self) -> None:
        """Drop the compiled model and its requests now (their threads end with them)."""
        self._pool = queue.SimpleQueue()
        self.compiled = None


class OpenVinoDriver(RealDriver):
    """Models compiled by OpenVINO, run on `channels` worker threads per device."""

    def __init__(
        self,
        devices: int | Sequence[DeviceSpec | Mapping[str, Any]] = 1,
        *,
        device: str | None = None,
        capacity_bytes: int | None = None,
        channels: int = REAL_DEFAULT_CHANNELS,
        inference_threads: int = 1,
        background_nice: int = 0,
        **options: Any,
    ) -> None:
        self.core = ov.Core()
        available = list(self.core.available_devices)
        name = default_device(self.core) if device is None else device
        if (
            not isinstance(name, str)
            or name.split(".")[0] not in OPENVINO_DEVICES
            or (name != "AUTO" and name not in available)
        ):
            raise UnknownDeviceError(
                f"OpenVINO device {name!r} is not available; this machine has "
                f"{[*available, 'AUTO']} (the driver takes {', '.join(OPENVINO_DEVICES)})"
            )
        self.device = name
        capacity = self._capacity(capacity_bytes)
        specs = real_specs(devices, channels, capacity)
        self.inference_threads = check_int(
            "inference_threads", inference_threads, 1, MAX_INTRA_OP_THREADS
        )
        # OpenVINO computes on its own stream threads: a lowered worker would only wait
        # there, and be slow to hand the GIL back to a foreground thread (measured here).
        options.setdefault("shared_cores", name == "CPU")
        super().__init__(specs, background_nice=background_nice, **options)

    def _capacity(self, configured: int | None) -> int:
        if configured is not None:
            return check_int("capacity_bytes", configured, 1, INT64_MAX)
        if self.device.startswith("NPU"):
            try:
                total = int(self.core.get_property(self.device, "NPU_DEVICE_TOTAL_MEM_SIZE"))
                used = int(self.core.get_property(self.device, "NPU_DEVICE_ALLOC_MEM_SIZE"))
                return max(1, total - used)
            except Exception as exc:
                log.info("%s reports no memory size (%s); using the default", self.device, exc)
        return REAL_DEFAULT_CAPACITY_BYTES

    def _check_path(self, path: str | Path) -> None:
        if Path(path).suffix not in (".onnx", ".xml"):
            raise IllegalArgumentError(
                f"path must be an ONNX (.onnx) or IR (.xml) file; got {path}"
            )

    def _count(self, model: ModelSource, sidecars: Mapping[str, int]) -> OvCounted:
        return count_for_openvino(model, sidecars)

    def _open(self, device: int, counted: Counted, band: int, asked: Asked) -> OvSession:
        assert isinstance(counted, OvCounted)
        wanted = compile_options(asked.options)  # a bad option is refused before any work
        bands = len(self.specs[device].bands)
        props = band_properties(band, bands)
        session = OvSession(
            self.core,
            _read(self.core, counted),
            self.device,
            run_threads(asked.threads, self.inference_threads, is_background(band, bands)),
            props,
            streams=self.specs[device].channels,
            wanted=wanted,
        )
        session.weight_bytes = counted.weight_bytes
        return session
