"""`InferenceSession.io_binding()` under the manager: inputs and outputs bound on the CPU (as
numpy arrays or `OrtValue`s), run by `run_with_iobinding`. A model in the manager's host has
no device memory of the app's to bind, so binding a raw device pointer raises the runtime's
`NotImplemented`."""

from __future__ import annotations

from typing import Any

import numpy as np

from npumanager.run.ort_inputs import runtime_error

_NOT_ON_CPU = (
    "under npu-manager run only CPU memory can be bound (numpy arrays and OrtValues): the "
    "model runs in the manager's model host"
)


class ManagedIOBinding:
    """The inputs and outputs bound for one managed session's runs."""

    def __init__(self, session: Any, ort: Any, errors: Any) -> None:
        self._session = session
        self._ort = ort
        self._errors = errors
        self._inputs: dict[str, np.ndarray] = {}
        self._outputs: dict[str, Any] = {}
        """Each bound output name: the OrtValue to fill, or None (a new one each run)."""
        self._results: list[Any] = []

    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        self._inputs[name] = np.asarray(arr_on_cpu)

    def bind_ortvalue_input(self, name: str, ortvalue: Any) -> None:
        self._inputs[name] = ortvalue.numpy()

    def bind_input(self, name: str, device_type: str, *args: Any, **kwargs: Any) -> None:
        raise runtime_error(self._errors, "NotImplemented", _NOT_ON_CPU)

    def bind_output(self, name: str, device_type: str = "cpu", *args: Any, **kwargs: Any) -> None:
        if str(device_type).lower() != "cpu" or args or kwargs.get("buffer_ptr"):
            raise runtime_error(self._errors, "NotImplemented", _NOT_ON_CPU)
        self._outputs[name] = None

    def bind_ortvalue_output(self, name: str, ortvalue: Any) -> None:
        self._outputs[name] = ortvalue

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: bound inputs are copied when the run starts."""

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: outputs are in place when the run returns."""

    def get_outputs(self) -> list[Any]:
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        return [value.numpy() for value in self._results]

    def run(self, run_options: Any) -> None:
        """Run the session on the bound inputs; fill the bound outputs."""
        names = list(self._outputs)
        if not names:
            raise runtime_error(self._errors, "InvalidArgument", "no output is bound")
        arrays = self._session.run(names, self._inputs, run_options)
        results = []
        for name, array in zip(names, arrays, strict=True):
            bound = self._outputs[name]
            if bound is None:
                results.append(self._ort.OrtValue.ortvalue_from_numpy(array))
                continue
            view = bound.numpy()
            if view.shape != array.shape or view.dtype != array.dtype:
                raise runtime_error(
                    self._errors,
                    "InvalidArgument",
                    f"output {name!r} is "
                    f"{array.dtype}{list(array.shape)}; the bound OrtValue is "
                    f"{view.dtype}{list(view.shape)}",
                )
            bound.update_inplace(array)
            results.append(bound)
        self._results = results
