"""OpenVINO under the manager: `Core.compile_model` of a model file (or of a `Model` that
`Core.read_model` read from one) gives a managed compiled model, loaded into the app's model
host through the daemon, with the calls apps make of a compiled model and its infer
requests. Failures are `RuntimeError`s, as OpenVINO's are."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import weakref
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from npumanager.errors import NpuManagerError
from npumanager.run._boot.npumanager_run_boot import WARNING_PREFIX
from npumanager.run.managed import PROCESS, ManagedModel, Source, asked_threads, run_unmanaged
from npumanager.run.settings import Settings
from npumanager.runtime_options import OPENVINO, OPENVINO_PROPERTIES

_PATH_ATTRIBUTE = "_npu_manager_path"


@contextlib.contextmanager
def _as_runtime_errors() -> Iterator[None]:
    try:
        yield
    except NpuManagerError as error:
        raise RuntimeError(f"npu-manager: {error}") from None


def _source(path: Path) -> Source:
    if not path.is_file():
        raise RuntimeError(f"Model file {path} cannot be opened!")
    nbytes = path.stat().st_size
    weights = path.with_suffix(".bin")
    if path.suffix == ".xml" and weights.is_file():
        nbytes += weights.stat().st_size
    return Source(path=path, data=None, nbytes=nbytes)


def _options_of(config: Any) -> dict[str, str]:
    """What a compile's config asks that changes what a run computes: as
    ``load_model(options=)`` takes it (a value given as OpenVINO's own type or enum is
    named as a string; one the manager does not take is left out)."""
    asked = {}
    for name, allowed in OPENVINO_PROPERTIES.items():
        try:
            value = (config or {}).get(name)
        except AttributeError:
            return {}
        if value is None:
            continue
        if isinstance(value, str):
            named = value
        elif hasattr(value, "get_type_name"):  # an ov.Type
            named = value.get_type_name()
        else:  # an enum of openvino.properties.hint
            named = getattr(value, "name", str(value))
        if named in allowed:
            asked[OPENVINO + name] = named
    return asked


_CARRIED = frozenset(
    ("boolean", "f16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")
)
"""The element types the manager's data plane carries, as OpenVINO names them."""


def _uncarried(model: Any) -> str | None:
    """The first input or output of a read model that the data plane cannot carry (a
    string tensor, say), as ``input 's' (string)``; None when it carries them all."""
    for role, ports in (("input", model.inputs), ("output", model.outputs)):
        for port in ports:
            kind = port.get_element_type().get_type_name()
            if kind not in _CARRIED:
                return f"{role} {_name(port)!r} ({kind})"
    return None


def _threads_of(config: Any) -> int:
    """The threads a compile's config asks (``INFERENCE_NUM_THREADS``; 0, OpenVINO's default:
    one per CPU)."""
    try:
        asked = (config or {}).get("INFERENCE_NUM_THREADS", 0)
    except AttributeError:
        return 0
    return asked_threads(asked)


def _name(port: Any) -> str:
    return str(port.get_any_name())


Results = Mapping[Any, np.ndarray]
"""A run's outputs: an `OVDict`, OpenVINO's own class (`_results_of`)."""


@functools.cache
def _results_class() -> type:
    """OpenVINO's `OVDict`, looking up a port of the model read or of the compiled model
    alike. Made on first use, as OpenVINO is imported (this module is, for one, by the hook
    that runs once OpenVINO is: it must not import OpenVINO itself)."""
    try:  # where OpenVINO keeps it from 2025 on, and before
        from openvino.utils.data_helpers import OVDict
    except ImportError:  # pragma: no cover - an OpenVINO older than 2025
        from openvino.runtime.utils.data_helpers import OVDict

    class ManagedResults(OVDict):  # type: ignore[misc]  # OpenVINO is untyped
        def __getitem__(self, key: Any) -> np.ndarray:
            if isinstance(key, int | str) or not hasattr(key, "get_any_name"):
                return super().__getitem__(key)  # type: ignore[no-any-return]
            return super().__getitem__(_name(key))  # type: ignore[no-any-return]

    return ManagedResults


def _results_of(ports: list[Any], arrays: list[np.ndarray]) -> Results:
    """A run's outputs by port, as OpenVINO gives them."""
    made: Results = _results_class()(dict(zip(ports, arrays, strict=True)))
    return made


class ManagedCompiledModel:
    """A compiled model whose inferences run in the app's model host."""

    def __init__(self, model: Any, managed: ManagedModel) -> None:
        self._model = model
        self._managed = managed
        weakref.finalize(self, managed.close).atexit = False

    @property
    def inputs(self) -> list[Any]:
        return list(self._model.inputs)

    @property
    def outputs(self) -> list[Any]:
        return list(self._model.outputs)

    def input(self, key: Any = None) -> Any:
        return self._model.input() if key is None else self._model.input(key)

    def output(self, key: Any = None) -> Any:
        return self._model.output() if key is None else self._model.output(key)

    def _feed(self, inputs: Any) -> dict[str, np.ndarray]:
        ports = self.inputs
        if inputs is None:
            return {}
        if not isinstance(inputs, Mapping):
            inputs = dict(enumerate(inputs if isinstance(inputs, list | tuple) else [inputs]))
        feed = {}
        for key, value in inputs.items():
            port = ports[key] if isinstance(key, int) else key
            name = port if isinstance(port, str) else _name(port)
            data = getattr(value, "data", value) if not isinstance(value, np.ndarray) else value
            feed[name] = np.ascontiguousarray(data)
        return feed

    def infer(self, inputs: Any) -> Results:
        """Run once and return the outputs."""
        with _as_runtime_errors():
            return _results_of(self.outputs, self._managed.run(self._feed(inputs)))

    def submit(self, inputs: Any) -> Future[list[Any]]:
        with _as_runtime_errors():
            return self._managed.submit(self._feed(inputs))

    def __call__(self, inputs: Any = None, *args: Any, **kwargs: Any) -> Results:
        return self.infer(inputs)

    def infer_new_request(self, inputs: Any = None) -> Results:
        return self.infer(inputs)

    def create_infer_request(self) -> ManagedInferRequest:
        return ManagedInferRequest(self)

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(
            f"CompiledModel.{name} is not available under npu-manager run: the model runs in "
            "the manager's model host"
        )


class ManagedInferRequest:
    """An infer request of a managed compiled model: sync and async runs, tensors by port."""

    def __init__(self, compiled: ManagedCompiledModel) -> None:
        self._compiled = compiled
        self._inputs: dict[Any, Any] = {}
        self._results: Results | None = None
        self._future: Future[list[Any]] | None = None
        self._callback: Any = None
        self.userdata: Any = None
        self._done = threading.Event()
        self._done.set()

    def get_compiled_model(self) -> ManagedCompiledModel:
        return self._compiled

    @property
    def model_inputs(self) -> list[Any]:
        return self._compiled.inputs

    @property
    def model_outputs(self) -> list[Any]:
        return self._compiled.outputs

    def set_tensor(self, key: Any, tensor: Any) -> None:
        self._inputs[key] = tensor

    def set_input_tensor(self, *args: Any) -> None:
        index, tensor = (0, args[0]) if len(args) == 1 else args
        self._inputs[index] = tensor

    def infer(self, inputs: Any = None, *args: Any, **kwargs: Any) -> Results:
        self._results = self._compiled.infer(self._inputs if inputs is None else inputs)
        return self._results

    def start_async(self, inputs: Any = None, userdata: Any = None, *args: Any) -> None:
        self.userdata = userdata
        self._done.clear()
        future = self._compiled.submit(self._inputs if inputs is None else inputs)
        self._future = future
        future.add_done_callback(self._finished)

    def _finished(self, future: Future[list[Any]]) -> None:
        if future.exception() is None:
            self._results = _results_of(self._compiled.outputs, future.result())
        self._done.set()
        if self._callback is not None:
            self._callback(self.userdata)

    def set_callback(self, callback: Any, userdata: Any = None) -> None:
        self._callback = callback
        self.userdata = userdata

    def wait(self) -> None:
        self._done.wait()
        self._raise_failure()

    def wait_for(self, timeout_ms: int) -> bool:
        done = self._done.wait(None if timeout_ms < 0 else timeout_ms / 1000)
        if done:
            self._raise_failure()
        return done

    def _raise_failure(self) -> None:
        future = self._future
        if future is not None and future.done() and not future.cancelled():
            error = future.exception()
            if error is not None:
                raise RuntimeError(f"npu-manager: {error}")

    def cancel(self) -> None:
        if self._future is not None:
            self._future.cancel()

    @property
    def results(self) -> Results:
        if self._results is None:
            raise RuntimeError("the infer request has not run yet")
        return self._results

    def get_output_tensor(self, index: int = 0) -> Any:
        import openvino

        return openvino.Tensor(self.results[index])

    def get_tensor(self, key: Any) -> Any:
        import openvino

        if key in self._inputs:
            return self._inputs[key]
        return openvino.Tensor(self.results[key])


def manage_core(module: ModuleType, settings: Settings) -> None:
    """Patch `module.Core` so that compiling a model file gives a managed compiled model."""
    core = module.Core
    original_compile = core.compile_model
    original_read = core.read_model

    def read_model(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_read(self, model, *args, **kwargs)
        if isinstance(model, str | os.PathLike) and not args and not kwargs:
            with contextlib.suppress(AttributeError, TypeError):
                setattr(result, _PATH_ATTRIBUTE, Path(os.fspath(model)))
        return result

    def compile_model(
        self: Any, model: Any, device_name: Any = None, config: Any = None, **kwargs: Any
    ) -> Any:
        path = (
            Path(os.fspath(model))
            if isinstance(model, str | os.PathLike)
            else getattr(model, _PATH_ATTRIBUTE, None)
        )
        if path is None or kwargs:
            sys.stderr.write(
                f"{WARNING_PREFIX} a model that was not read from a file runs unmanaged\n"
            )
            return original_compile(self, model, device_name, config, **kwargs)
        with _as_runtime_errors():
            manager = PROCESS.connect(settings)
        if manager is None:
            return original_compile(self, model, device_name, config, **kwargs)
        source = _source(path)
        read = model if not isinstance(model, str | os.PathLike) else original_read(self, model)
        foreign = _uncarried(read)
        if foreign is not None:
            refusal = run_unmanaged(settings, foreign)
            if refusal is not None:
                raise RuntimeError(refusal)
            return original_compile(self, model, device_name, config, **kwargs)
        with _as_runtime_errors():
            managed = ManagedModel(
                source,
                settings,
                manager,
                threads=_threads_of(config),
                options=_options_of(config),
            )
        return ManagedCompiledModel(read, managed)

    read_model.__doc__ = original_read.__doc__
    compile_model.__doc__ = original_compile.__doc__
    core.read_model = read_model
    core.compile_model = compile_model
