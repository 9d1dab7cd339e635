"""The `onnxruntime` driver: ONNX models run in CPU sessions under the HAL's scheduling.

Scheduling is the reference device's strict one (`ReferenceEngine`, `scheduler="strict"`,
so it claims no FAIR_SHARE): a priority queue across uids by
effective priority (app priority from `SchedulingConfig` plus the clamped job priority;
no direct access or attribution without permission end FAILED), FIFO among equals,
strictly increasing ids, monotonic timestamps, cancel (CANCELLED_USER) and unload
(CANCELLED_SYSTEM). A device has `DEFAULT_CHANNELS` (2) execution channels unless its
`DeviceSpec` says otherwise, and its slice is longer than any inference, so a more
important job runs *next* but nothing is paused mid-inference: the driver claims no
PREEMPTION. There is no thermal model.

Time: an inference lasts the wall time measured for its model at load (the median of a
few zero-input runs after a warm-up; `cost_cycles` overrides it, at 1000 cycles per us).
On the real clock (the default, and what the driver claims) the device time is the
monotonic wall clock since the driver opened, and every call (and `pump`, which the
service calls at least every 50 ms) first brings the devices up to it. The session
runs the inference when its work completes; its outputs are then kept for
`result(work_id)`. Work that is cancelled, fails or is revoked never runs. A virtual
clock (`clock="virtual"`: time moves only with `advance` / `run_until_idle`) is there
for deterministic tests; it is not claimed.

A model is loaded from ONNX (`model=` bytes or a `ModelProto`, or `path=`); its weight
bytes are those of its initializers, accounted against the device's capacity
(`capacity_bytes`, default 1 GiB). `load_model(device, weight_bytes=N)` with no ONNX model
accounts N bytes for a placeholder that has no session (what the conformance suite and
the service load); `bind(handle, model)` later gives such a handle its ONNX model.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]
from onnx import numpy_helper

from npumanager.checks import GroupId, check_int
from npumanager.core.events import EventKind, WorkEvent
from npumanager.errors import IllegalArgumentError, UnknownModelError
from npumanager.schemas import EndReason
from npumanager.schemas.device import (
    DeviceDescription,
    DeviceSpec,
    DeviceStatus,
    Scheduler,
    ThermalSpec,
)
from npumanager.schemas.limits import (
    INT64_MAX,
    MAX_CALIBRATION_RUNS,
    MAX_INTRA_OP_THREADS,
    MAX_RUNTIME_DEVICES,
    MIN_PRIORITY,
    SIMULATION_HORIZON_US,
)
from npumanager.vendor_drivers.reference.engine import ReferenceEngine
from npumanager.vendor_drivers.simulated import Engine, EngineDriver, device_specs

DEFAULT_CAPACITY_BYTES = 1 << 30
DEFAULT_CHANNELS = 2
"""Inferences a device runs at once (each on its own session call)."""
CLOCK_MHZ = 1000
"""Cycles per microsecond: `cost_cycles` are nanoseconds of inference."""
NO_SLICE_US = 1 << 40
"""A slice longer than any inference: running work is never paused."""
MAX_RESULTS = 1024
"""Outputs kept for `result` before the oldest are dropped."""
CLOCKS = ("virtual", "real")

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
    """The bytes of a model's initializers (its weights)."""
    total = sum(numpy_helper.to_array(init).nbytes for init in model.graph.initializer)
    for sparse in model.graph.sparse_initializer:
        total += numpy_helper.to_array(sparse.values).nbytes
        total += numpy_helper.to_array(sparse.indices).nbytes
    return int(total)


def _as_model(model: bytes | onnx.ModelProto | None, path: str | Path | None) -> onnx.ModelProto:
    if (model is None) == (path is None):
        raise IllegalArgumentError("give exactly one of model= (bytes or ModelProto) and path=")
    try:
        if path is not None:
            return onnx.load_model(str(path))
        if isinstance(model, onnx.ModelProto):
            return model
        if isinstance(model, bytes | bytearray):
            return onnx.load_model_from_string(bytes(model))
    except Exception as exc:
        raise IllegalArgumentError(f"not an ONNX model: {exc}") from exc
    raise IllegalArgumentError(f"model must be bytes or an onnx.ModelProto; got {model!r}")


@dataclass
class _Session:
    session: Any
    inputs: list[tuple[str, tuple[int, ...], Any]]
    cost_cycles: int

    def zeros(self) -> dict[str, Any]:
        return {name: np.zeros(shape, dtype) for name, shape, dtype in self.inputs}

    def feeds(self, inputs: Mapping[str, Any] | None) -> dict[str, Any]:
        if inputs is None:
            return self.zeros()
        names = {name for name, _, _ in self.inputs}
        if set(inputs) != names:
            raise IllegalArgumentError(
                f"inputs must be exactly {sorted(names)}; got {sorted(map(str, inputs))}"
            )
        return {name: np.asarray(inputs[name], dtype=dtype) for name, _, dtype in self.inputs}


def _open_session(model: onnx.ModelProto, threads: int, runs: int) -> _Session:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:
        raise IllegalArgumentError(f"onnxruntime cannot open the model: {exc}") from exc
    inputs = []
    for arg in session.get_inputs():
        dtype = _DTYPES.get(arg.type)
        if dtype is None:
            raise IllegalArgumentError(f"input {arg.name!r} has unsupported type {arg.type}")
        shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in arg.shape)
        inputs.append((arg.name, shape, dtype))
    probe = _Session(session, inputs, 1)
    feeds = probe.zeros()
    session.run(None, feeds)  # warm-up
    times = []
    for _ in range(max(1, runs)):
        start = time.perf_counter_ns()
        session.run(None, feeds)
        times.append(time.perf_counter_ns() - start)
    probe.cost_cycles = max(1, int(statistics.median(times)) * CLOCK_MHZ // 1000)
    return probe


class OnnxRuntimeDriver(EngineDriver):
    """ONNX models on CPU sessions, scheduled by the reference engine without preemption."""

    def __init__(
        self,
        devices: int | Sequence[DeviceSpec | Mapping[str, Any]] = 1,
        *,
        capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
        clock: str = "real",
        intra_op_threads: int = 1,
        calibration_runs: int = 3,
        **options: Any,
    ) -> None:
        if clock not in CLOCKS:
            raise IllegalArgumentError(f"clock must be one of {', '.join(CLOCKS)}; got {clock!r}")
        capacity = check_int("capacity_bytes", capacity_bytes, 1, INT64_MAX)
        if isinstance(devices, int):
            count = check_int("devices", devices, 1, MAX_RUNTIME_DEVICES)
            devices = [
                DeviceSpec(channels=DEFAULT_CHANNELS, weight_memory_bytes=capacity)
                for _ in range(count)
            ]
        specs = [
            s.model_copy(
                update={
                    "clock_mhz": CLOCK_MHZ,
                    "slice_us": NO_SLICE_US,
                    "scheduler": Scheduler.STRICT,
                    "thermal": ThermalSpec(heat_per_busy_channel_mc=0),
                }
            )
            for s in device_specs(devices)
        ]
        self.clock = clock
        self.intra_op_threads = check_int(
            "intra_op_threads", intra_op_threads, 1, MAX_INTRA_OP_THREADS
        )
        self.calibration_runs = check_int(
            "calibration_runs", calibration_runs, 1, MAX_CALIBRATION_RUNS
        )
        self._lock = threading.RLock()
        self._sessions: dict[int, _Session] = {}
        self._pending: dict[int, tuple[_Session, dict[str, Any]]] = {}
        self._results: OrderedDict[int, list[Any]] = OrderedDict()
        self._t0_ns = time.monotonic_ns()
        super().__init__(specs, **options)

    def _make_engine(self) -> Engine:
        return ReferenceEngine(self.specs, self.max_live_work, self.max_models)

    @property
    def real_time(self) -> bool:
        """True on the real clock."""
        return self.clock == "real"

    # The clock --------------------------------------------------------------------------

    def _sync(self) -> None:
        """On the real clock, run the devices up to the wall clock."""
        if self.real_time and not self._closed:
            wall = (time.monotonic_ns() - self._t0_ns) // 1000
            target = min(wall, SIMULATION_HORIZON_US - 1)
            if target > self.engine.now_us():
                self.engine.advance_to(target)

    @property
    def now_us(self) -> int:
        """Device time in microseconds (on the real clock: wall time since opening)."""
        with self._lock:
            self._sync()
            return self.engine.now_us()

    def advance(self, us: int) -> None:
        """Run `us` microseconds of virtual time (virtual clock only)."""
        if self.real_time:
            raise IllegalArgumentError("advance() runs virtual time; this driver is real-time")
        with self._lock:
            super().advance(us)

    def run_until_idle(self, max_us: int | None = None) -> int:
        """Run until idle; on the real clock, wait (at most `max_us` of wall time) for it."""
        if not self.real_time:
            with self._lock:
                return super().run_until_idle(max_us)
        self._open()
        deadline = None if max_us is None else time.monotonic() + max_us / 1e6
        while True:
            with self._lock:
                self.pump()
                idle = self.engine.idle() and self._next_debounce_due_us() is None
                now = self.engine.now_us()
                due = self.engine.next_event_us()
            if idle or (deadline is not None and time.monotonic() >= deadline):
                return now
            wait = 0.001 if due >= SIMULATION_HORIZON_US else max(0.0, (due - now) / 1e6)
            time.sleep(min(max(wait, 0.0002), 0.01))

    # Models -----------------------------------------------------------------------------

    def load_model(
        self,
        device: int = 0,
        *,
        model: bytes | onnx.ModelProto | None = None,
        path: str | Path | None = None,
        weight_bytes: int | None = None,
        sram_bytes: int = 0,
    ) -> int:
        """Load an ONNX model (or, with only `weight_bytes`, a placeholder); its handle.

        A model that does not fit raises `CapacityError` and nothing is loaded.
        """
        self._open()
        if model is None and path is None:
            if weight_bytes is None:
                raise IllegalArgumentError("give model=, path= or weight_bytes=")
            with self._lock:
                self._sync()
                return super().load_model(device, weight_bytes=weight_bytes, sram_bytes=sram_bytes)
        proto = _as_model(model, path)
        weight = weight_bytes_of(proto)
        if weight_bytes is not None and weight_bytes != weight:
            raise IllegalArgumentError(
                f"weight_bytes={weight_bytes} but the model's initializers hold {weight} bytes"
            )
        self._device(device)
        session = _open_session(proto, self.intra_op_threads, self.calibration_runs)
        with self._lock:
            self._sync()
            handle = super().load_model(device, weight_bytes=weight, sram_bytes=sram_bytes)
            self._sessions[handle] = session
            return handle

    def bind(
        self, handle: int, model: bytes | onnx.ModelProto | None = None, *, path: str | None = None
    ) -> int:
        """Give a placeholder loaded with `weight_bytes` its ONNX model; its cost in cycles.

        The model's initializers must not exceed the bytes the placeholder accounted.
        """
        self._open()
        proto = _as_model(model, path)
        weight = weight_bytes_of(proto)
        session = _open_session(proto, self.intra_op_threads, self.calibration_runs)
        with self._lock:
            accounted = self.engine_model_bytes(handle)
            if weight > accounted:
                raise IllegalArgumentError(
                    f"the model's initializers hold {weight} bytes; handle {handle} "
                    f"accounted {accounted}"
                )
            self._sessions[handle] = session
            return session.cost_cycles

    def engine_model_bytes(self, handle: int) -> int:
        """The weight bytes accounted for a loaded model."""
        assert isinstance(self.engine, ReferenceEngine)
        entry = self.engine.models.get(handle)
        if entry is None:
            raise UnknownModelError(f"model {handle} is not loaded")
        return entry.weight_bytes

    def cost_cycles(self, handle: int) -> int:
        """The measured cost of one inference of a model with an ONNX session."""
        with self._lock:
            session = self._sessions.get(handle)
        if session is None:
            raise UnknownModelError(f"model {handle} has no ONNX session")
        return session.cost_cycles

    def unload_model(self, model: int) -> None:
        """Free a model; its queued and running work ends CANCELLED_SYSTEM and never runs."""
        with self._lock:
            self._sync()
            super().unload_model(model)
            self._sessions.pop(model, None)

    # Work -------------------------------------------------------------------------------

    def submit(
        self,
        model: int,
        *,
        uid: int,
        cost_cycles: int | None = None,
        inputs: Mapping[str, Any] | None = None,
        job_priority: int = MIN_PRIORITY,
        original_uid: int | None = None,
        group_id: GroupId | None = None,
        feature_id: str | None = None,
        debug_pid: int = 0,
    ) -> int:
        """Queue one inference (`inputs` by name, or zeros of the input shapes); its work id."""
        self._open()
        with self._lock:
            session = self._sessions.get(model) if type(model) is int else None
            if session is None and (cost_cycles is None or inputs is not None):
                raise IllegalArgumentError(
                    f"model {model!r} has no ONNX session: give cost_cycles and no inputs"
                )
            feeds = session.feeds(inputs) if session is not None else None
            cost = cost_cycles if cost_cycles is not None else session.cost_cycles  # type: ignore[union-attr]
            self._sync()
            work = super().submit(
                model,
                uid=uid,
                cost_cycles=cost,
                job_priority=job_priority,
                original_uid=original_uid,
                group_id=group_id,
                feature_id=feature_id,
                debug_pid=debug_pid,
            )
            if session is not None and feeds is not None:
                self._pending[work] = (session, feeds)
            return work

    def add_periodic(self, model: int, **kwargs: Any) -> None:
        """Device-generated arrivals (cost in cycles; no ONNX run is attached)."""
        with self._lock:
            self._sync()
            super().add_periodic(model, **kwargs)

    def cancel(self, work_id: int) -> None:
        """Cancel live work: it ends CANCELLED_USER now and never runs."""
        with self._lock:
            self._sync()
            super().cancel(work_id)

    def inject_fault(self, work_id: int) -> None:
        """Make live work fail now (ENDED FAILED)."""
        with self._lock:
            self._sync()
            super().inject_fault(work_id)

    def add_heat(self, device: int, millicelsius: int) -> None:
        """Not supported: the driver has no thermal model."""
        raise IllegalArgumentError("the onnxruntime driver has no thermal model")

    def result(self, work_id: int) -> list[Any]:
        """The outputs of a completed inference (once; `LookupError` if there are none)."""
        with self._lock:
            self.pump()
            try:
                return self._results.pop(work_id)
            except KeyError:
                raise LookupError(f"no outputs for work {work_id}") from None

    # Events -----------------------------------------------------------------------------

    def pump(self) -> None:
        """Bring the clock up, run the inferences that completed, deliver the events."""
        with self._lock:
            self._sync()
            events = self.engine.take_events()
            self._run_completed(events)
            self._hand_over(events, self.engine.now_us())

    def _run_completed(self, events: Sequence[WorkEvent]) -> None:
        for event in events:
            if event.kind != EventKind.ENDED or event.reason == EndReason.PAUSED:
                continue
            pending = self._pending.pop(event.id, None)
            if pending is None or event.reason != EndReason.COMPLETED:
                continue
            session, feeds = pending
            self._results[event.id] = list(session.session.run(None, feeds))
            while len(self._results) > MAX_RESULTS:
                self._results.popitem(last=False)

    def take_events(self) -> list[WorkEvent]:
        """Raw events kept while no callback was registered, oldest first; clears them."""
        with self._lock:
            return super().take_events()

    def device_state(self, device: int = 0) -> DeviceStatus:
        """A reading of one device now."""
        with self._lock:
            self._sync()
            return super().device_state(device)

    def describe_devices(self) -> list[DeviceDescription]:
        """What each device offers (one channel, 1000 cycles per us)."""
        return super().describe_devices()

    def close(self) -> None:
        """Stop the driver and drop its sessions."""
        with self._lock:
            super().close()
            self._sessions.clear()
            self._pending.clear()
