"""`RealDriver`: the `Driver` protocol over a real runtime, with no simulated engine.

Work waits in a `DeviceScheduler` per device (bands, fair share, floor) and runs on the
device's worker threads (`Channels`): REQUESTED when queued, STARTED when the runtime
call begins, ENDED(COMPLETED) when it returns (outputs kept for the caller), FAILED on a
runtime error, CANCELLED_USER on `cancel`, CANCELLED_SYSTEM on unload. Queued work that
ends never runs; running work is stopped with the runtime's own cancel. Nothing running
is paused (no PREEMPTION): a more important job takes the next free channel, and when
there is none, a running job of a less important band is stopped with the runtime's
cancel and requeued to start over (RESTART_PREEMPTION: ENDED(PAUSED), later
STARTED(RESUMED); `restart_preemption=False` turns it off). Time is the monotonic clock.
A subclass opens models into `Session`s (`_open`).
"""

from __future__ import annotations

import math
import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from npumanager.checks import check_int, check_runtime_options, check_threads
from npumanager.core.driver.contract import Asked, Tuned
from npumanager.errors import CapacityError, IllegalArgumentError, UnknownModelError
from npumanager.modelfiles import open_model_files
from npumanager.schemas import EndReason, SchedulingConfig
from npumanager.schemas.device import DeviceDescription, DeviceSpec, DeviceStatus
from npumanager.schemas.limits import (
    DEFAULT_MAX_MODEL_FILE_BYTES,
    INT32_MAX,
    INT64_MAX,
    MAX_RUNTIME_DEVICES,
    MAX_TIMED_ROWS,
    TIMED_CALIBRATION_ROWS,
)
from npumanager.vendor_drivers.realexec.channels import ExecutionError
from npumanager.vendor_drivers.realexec.session import Call, Counted, InHost, Session
from npumanager.vendor_drivers.realexec.submission import Submission
from npumanager.vendor_drivers.realexec.work import Model, Work, effective_priority

ModelSource = bytes | Any | None
"""A model as a runtime takes it: bytes, or the runtime's own model object."""


def checked(asked: Asked) -> Asked:
    """``asked`` with its thread count and options checked (`IllegalArgumentError`)."""
    options = check_runtime_options(dict(asked.options)) or {}
    return Asked(check_threads(asked.threads), options)


def _untuned(model: Any, path: Any) -> tuple[Any, Any, Asked]:
    """The model and path without their ``Tuned`` wrapping, and what it asked (checked)."""
    asked = Asked()
    if isinstance(model, Tuned):
        model, asked = model.source, model.asked
    if isinstance(path, Tuned):
        path, asked = path.source, path.asked
    return model, path, checked(asked)


def real_specs(
    devices: int | Sequence[DeviceSpec | Mapping[str, Any]], channels: int, capacity: int
) -> list[DeviceSpec]:
    """`devices` devices of `channels` channels and `capacity` weight bytes, or the specs
    given."""
    if isinstance(devices, int):
        count = check_int("devices", devices, 1, MAX_RUNTIME_DEVICES)
        return [DeviceSpec(channels=channels, weight_memory_bytes=capacity) for _ in range(count)]
    specs = [d if isinstance(d, DeviceSpec) else DeviceSpec.model_validate(d) for d in devices]
    check_int("number of devices", len(specs), 1, MAX_RUNTIME_DEVICES)
    return specs


class RealDriver(Submission):
    """Models opened in a runtime and inferences submitted to the device's channels."""

    takes_tuned = True
    """``load_model`` takes a ``Tuned`` model or path (`takes_tuned`)."""

    # For subclasses ---------------------------------------------------------------------

    @abstractmethod
    def _count(self, model: ModelSource, sidecars: Mapping[str, int]) -> Counted:
        """Parse a model (bytes or the runtime's own object) and count its weight bytes,
        allocating nothing for them yet; a bad model raises `IllegalArgumentError`.
        `sidecars` are the files it keeps weights in, by name, as descriptors."""

    @abstractmethod
    def _open(self, device: int, counted: Counted, band: int, asked: Asked) -> Session:
        """Open a counted model on a device's runtime (reading its weights files now), as
        its app ``asked`` (checked): its threads (``realexec.threads.run_threads``) and the
        runtime options of ``core.driver.contract.Asked``."""

    def count_model(self, model: ModelSource, sidecars: Mapping[str, int]) -> Counted:
        """Parse and count a model as `load_model` does (for a model host)."""
        return self._count(model, sidecars)

    def open_counted(
        self, device: int, counted: Counted, band: int, asked: Asked | None = None
    ) -> Session:
        """Open a counted model as `load_model` does (for a model host)."""
        return self._open(self._device(device), counted, band, checked(asked or Asked()))

    def _band_changed(self, session: Session, device: int, uid: int) -> None:
        """Relay the band of the model's uid to the runtime (`Session.set_band`)."""
        session.set_band(self._band(device, uid), len(self.specs[device].bands))

    # Description --------------------------------------------------------------------------

    @property
    def device_count(self) -> int:
        """How many devices, numbered 0..device_count-1."""
        return len(self.specs)

    def describe_devices(self) -> list[DeviceDescription]:
        """What each device offers: channels (worker threads) and weight memory."""
        return [
            DeviceDescription(
                number=n, channels=s.channels, weight_memory_bytes=s.weight_memory_bytes
            )
            for n, s in enumerate(self.specs)
        ]

    def device_state(self, device: int = 0) -> DeviceStatus:
        """A reading of one device now (no thermal model: always ambient)."""
        with self._lock:
            self._check_open()
            d = self._device(device)
            sched, spec = self._scheds[d], self.specs[d]
            return DeviceStatus(
                number=d,
                now_us=self.now_us,
                weight_memory_bytes=spec.weight_memory_bytes,
                weight_memory_used_bytes=self._used[d],
                sram_used_bytes=0,
                models_loaded=sum(1 for m in self._models.values() if m.device == d),
                queue_depth=sched.depth,
                running=tuple(w.id if w is not None else -1 for w in sched.running),
                temperature_mc=spec.thermal.ambient_mc,
                peak_temperature_mc=spec.thermal.ambient_mc,
                severity=0,
                throttled_us=0,
                shutdown=False,
            )

    # The HAL ------------------------------------------------------------------------------

    def _apply_configs(self, configs: Mapping[int, SchedulingConfig]) -> None:
        with self._lock:
            self._check_open()
            t = self.now_us
            for sched in self._scheds:
                sched.rerank(
                    t,
                    lambda w: effective_priority(configs, w.uid, w.original_uid, w.job_priority),
                )
            for model in self._models.values():
                if model.session is not None and model.uid is not None:
                    band = self._band(model.device, model.uid, configs)
                    model.session.set_band(band, len(self.specs[model.device].bands))
            self._wake()
            for device in range(len(self.specs)):
                self._preempt(device)

    # Models -------------------------------------------------------------------------------

    def load_model(
        self,
        device: int = 0,
        *,
        model: ModelSource = None,
        path: str | Path | None = None,
        weight_bytes: int | None = None,
        sram_bytes: int = 0,
        uid: int | None = None,
        sidecars: Mapping[str, int] | None = None,
        max_weight_bytes: int | None = None,
    ) -> int:
        """Open a model (`model=` bytes or a runtime model object, or `path=`) and account
        its real weight bytes; with only `weight_bytes`, account bytes without a session.
        A model `InHost` is parsed, opened and run in its host, not in this process.
        A model or path given as a ``Tuned`` runs on the threads its app asked
        (``realexec.threads.run_threads``) with the runtime options it asked; otherwise on
        the driver's settings.

        The weights are counted from the model before anything is allocated for them: a
        model over `max_weight_bytes` (what its grant allows) or the device's free memory
        is refused first. `sidecars` are the files the model keeps weights in (ONNX
        external data, an IR's `.bin`) as descriptors by name; with `path=` they are opened
        beside the model file. No runtime is ever given a path. A model that is not valid
        or does not fit raises, and nothing is loaded.
        """
        self._check_open()
        d = self._device(device)
        sram = check_int("sram_bytes", sram_bytes, 0, INT64_MAX)
        if sram > self.specs[d].sram_bytes:
            raise CapacityError(
                f"sram_bytes {sram} exceeds device {d}'s SRAM of {self.specs[d].sram_bytes} bytes"
            )
        if max_weight_bytes is not None:
            check_int("max_weight_bytes", max_weight_bytes, 0, INT64_MAX)
        model, path, asked = _untuned(model, path)
        if model is None and path is None:
            if weight_bytes is None:
                raise IllegalArgumentError("give model=, path= or weight_bytes=")
            weight = check_int("weight_bytes", weight_bytes, 0, INT64_MAX)
            self._check_room(d, weight, max_weight_bytes)
            return self._account(d, weight, None)
        if model is not None and path is not None:
            raise IllegalArgumentError("give exactly one of model= and path=")
        last = len(self.specs[d].bands) - 1
        band = last if uid is None else self._band(d, check_int("uid", uid, 0, INT32_MAX))
        if path is not None:
            self._check_path(path)
            with open_model_files(path, DEFAULT_MAX_MODEL_FILE_BYTES) as files:
                counted = self._count(files.data, files.sidecars)
                self._check_counted(d, counted, weight_bytes, max_weight_bytes)
                session = self._open(d, counted, band, asked)
        elif isinstance(model, InHost):
            host = model.host
            counted = host.count(model.source, sidecars or {}, max_weight_bytes)
            try:
                self._check_counted(d, counted, weight_bytes, max_weight_bytes)
            except BaseException:
                host.discard(counted)
                raise
            session = host.open(d, counted, band, asked)
        else:
            counted = self._count(model, sidecars or {})
            self._check_counted(d, counted, weight_bytes, max_weight_bytes)
            session = self._open(d, counted, band, asked)
        try:
            handle = self._account(d, counted.weight_bytes, session)
        except Exception:
            session.close()
            raise
        if uid is not None:
            with self._lock:
                entry = self._models[handle]
                entry.uid = check_int("uid", uid, 0, INT32_MAX)
                self._band_changed(session, d, uid)
        return handle

    def _check_path(self, path: str | Path) -> None:
        """Refuse a `path=` this runtime cannot take (by its suffix); any by default."""

    def _check_counted(
        self, device: int, counted: Counted, weight_bytes: int | None, allowed: int | None
    ) -> None:
        if weight_bytes is not None and weight_bytes != counted.weight_bytes:
            raise IllegalArgumentError(
                f"weight_bytes={weight_bytes} but the model's weights hold "
                f"{counted.weight_bytes} bytes"
            )
        self._check_room(device, counted.weight_bytes, allowed)

    def _check_room(self, device: int, weight: int, allowed: int | None) -> None:
        """Refuse weights over what the grant allows or the device has free, before any
        memory is taken for them."""
        if allowed is not None and weight > allowed:
            raise CapacityError(
                f"the model's weights hold {weight} bytes, more than the {allowed} its grant "
                "allows: ask for a larger size class or declare weight_bytes when requesting"
            )
        with self._lock:
            free = self.specs[device].weight_memory_bytes - self._used[device]
        if weight > free:
            raise CapacityError(
                f"the model's {weight} weight bytes do not fit on device {device}: "
                f"{free} of {self.specs[device].weight_memory_bytes} bytes free"
            )

    def _account(self, device: int, weight: int, session: Session | None) -> int:
        with self._lock:
            self._check_open()
            capacity = self.specs[device].weight_memory_bytes
            if len(self._models) >= self.max_models:
                raise CapacityError(f"the driver holds {self.max_models} models already")
            if weight > capacity - self._used[device]:
                raise CapacityError(
                    f"the model's {weight} weight bytes do not fit on device {device}: "
                    f"{capacity - self._used[device]} of {capacity} bytes free"
                )
            handle = self._next_model
            self._next_model += 1
            self._models[handle] = Model(handle, device, weight, session)
            self._used[device] += weight
            return handle

    def model_info(self, model: int) -> Session:
        """The session of a loaded model (`UnknownModelError` if it has none)."""
        with self._lock:
            entry = self._models.get(model)
            if entry is None or entry.session is None:
                raise UnknownModelError(f"model {model} is not loaded with a runtime session")
            return entry.session

    def model_bytes(self, model: int) -> int:
        """The weight bytes accounted for a loaded model."""
        with self._lock:
            entry = self._models.get(model)
            if entry is None:
                raise UnknownModelError(f"model {model} is not loaded")
            return entry.weight_bytes

    def unload_model(self, model: int) -> None:
        """Free a model; its queued and running work ends CANCELLED_SYSTEM (running work is
        stopped with the runtime's cancel)."""
        with self._lock:
            self._check_open()
            entry = self._models.pop(check_int("model", model, 0, INT32_MAX), None)
            if entry is None:
                raise UnknownModelError(f"model {model} is not loaded")
            for work in sorted(self._work.values(), key=lambda w: w.id):
                if work.model == model:
                    self._end(work, EndReason.CANCELLED_SYSTEM)
            self._used[entry.device] -= entry.weight_bytes
        if entry.session is not None:
            entry.session.close()

    # Timed work: the conformance hook ------------------------------------------------------
    # Its model's module imports onnx, so it is imported on first use: a daemon that runs
    # no model (a simulated driver's, whose `can_host` imports this class) and a plain
    # install without the extras do without onnx.

    def timed_model(self) -> bytes:
        """The model built in code (ONNX): a chain of matrix multiplications."""
        from npumanager.vendor_drivers.realexec.chain import chain_model

        return chain_model()

    def load_timed_model(self, device: int = 0) -> int:
        """Load the driver's model built in code (a chain of matrix multiplications) and
        measure its cost per input row; `timed_inputs` then sizes real work by duration."""
        from npumanager.vendor_drivers.realexec.chain import chain_inputs, chain_model

        handle = self.load_model(device, model=chain_model())
        session = self.model_info(handle)
        feeds = chain_inputs(TIMED_CALIBRATION_ROWS)
        session.run(feeds, Call(False))
        times = []
        for _ in range(5):
            start = time.perf_counter_ns()
            session.run(feeds, Call(False))
            times.append(time.perf_counter_ns() - start)
        with self._lock:
            # the fastest run: on a loaded machine work then lasts at least what was asked
            self._models[handle].row_us = min(times) / 1000 / TIMED_CALIBRATION_ROWS
        return handle

    def timed_inputs(self, model: int, ms: float) -> dict[str, np.ndarray]:
        """Inputs of the timed model for one inference of about `ms` milliseconds here."""
        with self._lock:
            entry = self._models.get(model)
            if entry is None or entry.row_us <= 0:
                raise UnknownModelError(f"model {model} is not a timed model")
            rows = math.ceil(ms * 1000 / entry.row_us)
        from npumanager.vendor_drivers.realexec.chain import chain_inputs

        return chain_inputs(max(1, min(MAX_TIMED_ROWS, rows)))


__all__ = ["ExecutionError", "ModelSource", "RealDriver", "Work"]
