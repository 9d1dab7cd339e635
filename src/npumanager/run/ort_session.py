"""`onnxruntime.InferenceSession` under the manager: the same class name, constructor and
calls, with the model loaded into the app's model host through the daemon instead of this
process. Built from the runtime's own module (`managed_session_class`), so that it is a
subclass of the runtime's session and raises the runtime's own exception classes."""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from npumanager.errors import (
    DaemonUnavailableError,
    ExecutionError,
    IllegalArgumentError,
    NpuManagerError,
)
from npumanager.run.managed import (
    PROCESS,
    HostLostError,
    ManagedModel,
    NotGrantedError,
    RunCancelledError,
    Source,
    asked_threads,
    run_unmanaged,
)
from npumanager.run.ort_inputs import Signature, check_feed, runtime_error, signature, uncarried
from npumanager.run.ort_iobinding import ManagedIOBinding
from npumanager.run.settings import Settings
from npumanager.runtime_options import ONNXRUNTIME, ONNXRUNTIME_CONFIG_ENTRIES
from npumanager.schemas.limits import RUN_TERMINATE_POLL_S

_TERMINATED = "Exiting due to terminate flag being set to true."


@contextlib.contextmanager
def translated(errors: Any) -> Iterator[None]:
    """The manager's errors as the runtime's own exception classes, the reason kept."""
    try:
        yield
    except (NotGrantedError, DaemonUnavailableError) as error:
        raise runtime_error(errors, "Fail", f"npu-manager refused the model: {error}") from None
    except RunCancelledError as error:
        raise runtime_error(errors, "Fail", str(error)) from None
    except HostLostError as error:
        raise runtime_error(errors, "EngineError", str(error)) from None
    except IllegalArgumentError as error:
        raise runtime_error(errors, "InvalidArgument", f"npu-manager: {error}") from None
    except ExecutionError as error:
        raise runtime_error(errors, "Fail", f"npu-manager: {error}") from None
    except NpuManagerError as error:
        raise runtime_error(
            errors, "Fail", f"npu-manager: {type(error).__name__}: {error}"
        ) from None


def read_source(errors: Any, path_or_bytes: Any) -> tuple[Source, Any]:
    """The model to load and its parsed proto; the runtime's errors for a missing file or
    bytes that are no model."""
    import onnx

    if isinstance(path_or_bytes, str | os.PathLike):
        path = Path(os.fspath(path_or_bytes))
        if not path.is_file():
            raise runtime_error(
                errors,
                "NoSuchFile",
                f"Load model from {path} failed:Load model {path} failed. File doesn't exist",
            )
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception:
            raise runtime_error(
                errors, "InvalidProtobuf", f"Load model from {path} failed:Protobuf parsing failed."
            ) from None
        nbytes = path.stat().st_size + _external_bytes(path, proto)
        return Source(path=path, data=None, nbytes=nbytes), proto
    if hasattr(path_or_bytes, "SerializeToString"):
        path_or_bytes = path_or_bytes.SerializeToString()
    if not isinstance(path_or_bytes, bytes | bytearray | memoryview):
        raise TypeError(f"Unable to load from type '{type(path_or_bytes)}'")
    data = bytes(path_or_bytes)
    try:
        proto = onnx.load_from_string(data)
    except Exception:
        raise runtime_error(
            errors, "InvalidProtobuf", "Failed to load model because protobuf parsing failed."
        ) from None
    return Source(path=None, data=data, nbytes=len(data)), proto


def _external_bytes(path: Path, proto: Any) -> int:
    """The bytes of the files beside `path` that the model keeps weights in."""
    from npumanager.modelfiles import external_location, external_tensors

    names = {external_location(tensor) for _where, tensor in external_tensors(proto)}
    total = 0
    for name in filter(None, names):
        with contextlib.suppress(OSError):
            total += (path.parent / name).stat().st_size
    return total


def _output_names(names: Any) -> list[str] | None:
    if names is None:
        return None
    if isinstance(names, str | bytes) or not isinstance(names, Sequence):
        raise TypeError(
            "run(): incompatible function arguments: output_names must be a list of str or None"
        )
    return list(names)


def managed_session_class(ort: ModuleType, settings: Settings) -> type:
    """A subclass of `ort.InferenceSession` whose models run through the manager; where no
    daemon answers (and the settings allow it), constructing it gives the runtime's own."""
    original: type = ort.InferenceSession
    errors = ort.capi.onnxruntime_pybind11_state

    class InferenceSession(original):  # type: ignore[misc]
        __doc__ = original.__doc__

        def __new__(cls, path_or_bytes: Any = None, *args: Any, **kwargs: Any) -> Any:
            with translated(errors):
                manager = PROCESS.connect(settings)
            if manager is None:
                return original(path_or_bytes, *args, **kwargs)
            source, proto = read_source(errors, path_or_bytes)
            model = signature(proto)
            del proto
            foreign = uncarried(model)
            if foreign is not None:
                refusal = run_unmanaged(settings, foreign)
                if refusal is not None:
                    raise runtime_error(errors, "Fail", refusal)
                return original(path_or_bytes, *args, **kwargs)
            session = object.__new__(cls)
            session._npu_manager = manager
            session._npu_read = (source, model)
            return session

        def __init__(
            self,
            path_or_bytes: Any,
            sess_options: Any = None,
            providers: Any = None,
            provider_options: Any = None,
            **kwargs: Any,
        ) -> None:
            self._sess = None
            self._enable_fallback = False
            self._model_path = (
                os.fspath(path_or_bytes) if isinstance(path_or_bytes, str | os.PathLike) else None
            )
            self._model_bytes = None
            self._sess_options = sess_options if sess_options is not None else ort.SessionOptions()
            self._providers = [p if isinstance(p, str) else p[0] for p in providers or ()]
            self._provider_options = list(provider_options or ())
            source, model = self.__dict__.pop("_npu_read")
            self._signature: Signature = model
            with translated(errors):
                self._npu_model = ManagedModel(
                    source,
                    settings,
                    self.__dict__.pop("_npu_manager"),
                    threads=_threads_of(self._sess_options),
                    options=_options_of(self._sess_options),
                )
            weakref.finalize(self, self._npu_model.close).atexit = False

        # What the model is ----------------------------------------------------------------

        def get_inputs(self) -> list[Any]:
            return list(self._signature.inputs)

        def get_outputs(self) -> list[Any]:
            return list(self._signature.outputs)

        def get_overridable_initializers(self) -> list[Any]:
            return list(self._signature.overridable)

        def get_modelmeta(self) -> Any:
            return self._signature.meta

        def get_providers(self) -> list[str]:
            return self._providers or ["CPUExecutionProvider"]

        def get_provider_options(self) -> dict[str, dict[str, str]]:
            return {name: {} for name in self.get_providers()}

        def get_session_options(self) -> Any:
            return self._sess_options

        def set_providers(self, providers: Any = None, provider_options: Any = None) -> None:
            self._providers = [p if isinstance(p, str) else p[0] for p in providers or ()]

        def disable_fallback(self) -> None:
            self._enable_fallback = False

        def enable_fallback(self) -> None:
            self._enable_fallback = True

        def end_profiling(self) -> str:
            return ""

        def get_profiling_start_time_ns(self) -> int:
            return 0

        # Running --------------------------------------------------------------------------

        def run(self, output_names: Any, input_feed: Any, run_options: Any = None) -> list[Any]:
            names = _output_names(output_names)
            if run_options is not None and not isinstance(run_options, ort.RunOptions):
                raise TypeError(
                    "run(): incompatible function arguments: run_options must be a "
                    "RunOptions or None"
                )
            arrays = check_feed(self._signature, names, input_feed, errors)
            with translated(errors):
                outputs = self._outputs(arrays, run_options)
            return self._select(names, outputs)

        def _outputs(self, arrays: dict[str, Any], run_options: Any) -> list[Any]:
            if run_options is None:
                return self._npu_model.run(arrays)
            if run_options.terminate:
                raise runtime_error(errors, "Fail", _TERMINATED)
            future = self._npu_model.submit(arrays)
            while True:
                with contextlib.suppress(TimeoutError):
                    return _result(future, RUN_TERMINATE_POLL_S)
                if run_options.terminate:
                    future.cancel()
                    raise runtime_error(errors, "Fail", _TERMINATED)

        def _select(self, names: list[str] | None, outputs: list[Any]) -> list[Any]:
            if not names:
                return outputs
            where = {arg.name: i for i, arg in enumerate(self._signature.outputs)}
            return [outputs[where[name]] for name in names]

        def run_with_ort_values(
            self, output_names: Any, input_dict_ort_values: Any, run_options: Any = None
        ) -> list[Any]:
            feed = {name: value.numpy() for name, value in input_dict_ort_values.items()}
            outputs = self.run(output_names, feed, run_options)
            return [ort.OrtValue.ortvalue_from_numpy(array) for array in outputs]

        def run_async(
            self,
            output_names: Any,
            input_feed: Any,
            callback: Callable[..., Any],
            user_data: Any,
            run_options: Any = None,
        ) -> None:
            names = _output_names(output_names)
            arrays = check_feed(self._signature, names, input_feed, errors)
            with translated(errors):
                future = self._npu_model.submit(arrays)

            def done(_: Any) -> None:
                try:
                    with translated(errors):
                        outputs = _result(future, None)
                except Exception as error:  # the runtime hands the callback its error text
                    callback([], user_data, str(error))
                    return
                callback(self._select(names, outputs), user_data, "")

            future.add_done_callback(done)

        def io_binding(self) -> ManagedIOBinding:
            return ManagedIOBinding(self, ort, errors)

        def run_with_iobinding(self, iobinding: Any, run_options: Any = None) -> None:
            if not isinstance(iobinding, ManagedIOBinding):
                raise TypeError("run_with_iobinding(): the binding is not this session's")
            iobinding.run(run_options)

    for name in dir(original):
        if name.startswith("_") or name in InferenceSession.__dict__:
            continue
        if callable(getattr(original, name)):
            setattr(InferenceSession, name, _not_implemented(name, errors))
    InferenceSession.__module__ = original.__module__
    InferenceSession.__qualname__ = original.__qualname__
    return InferenceSession


def _threads_of(options: Any) -> int:
    """The intra-op threads a session's options ask (0, the runtime's default: one per CPU)."""
    return asked_threads(getattr(options, "intra_op_num_threads", 0))


_DEFAULT_LEVEL = 99
"""ONNX Runtime's default graph optimisation level, ``ORT_ENABLE_ALL``."""


def _options_of(options: Any) -> dict[str, str]:
    """What a session's options set, away from the runtime's defaults, that changes what a
    run computes: as ``load_model(options=)`` takes it (not ``execution_mode``: the host
    runs a model's nodes in turn, on the threads granted)."""
    asked = {}
    level = getattr(options, "graph_optimization_level", _DEFAULT_LEVEL)
    if int(level) != _DEFAULT_LEVEL:
        asked[f"{ONNXRUNTIME}graph_optimization_level"] = str(int(level))
    for entry in ONNXRUNTIME_CONFIG_ENTRIES:
        try:
            value = options.get_session_config_entry(entry)
        except Exception:  # the runtime raises for an entry never set
            continue
        asked[ONNXRUNTIME + entry] = "1" if value == "1" else "0"  # on only as "1", as read
    return asked


def _result(future: Any, timeout: float | None) -> list[Any]:
    """A future's outputs; a cancelled one is the manager's cancel, told as such."""
    from concurrent.futures import CancelledError

    try:
        outputs: list[Any] = future.result(timeout)
    except CancelledError as error:
        raise RunCancelledError(f"npu-manager cancelled the run: {error}") from None
    return outputs


def _not_implemented(name: str, errors: Any) -> Callable[..., Any]:
    def unavailable(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise runtime_error(
            errors,
            "NotImplemented",
            f"InferenceSession.{name} is not available under npu-manager run: the model runs "
            "in the manager's model host, not in this process",
        )

    unavailable.__name__ = name
    return unavailable
