"""What a real driver needs of one opened model, and the checks on an inference's inputs.

A runtime adapter (`onnxruntime`, `openvino`) opens a model into a `Session`: its weight
bytes, its inputs, and `run`, which performs one inference on the caller's thread and
arms the `Call` with the runtime's own way to stop it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from npumanager.errors import IllegalArgumentError


class Call:
    """One inference in flight: the runtime arms it with a stop; `cancel` uses it."""

    def __init__(self, background: bool) -> None:
        self.background = background
        self.cancelled = False
        self._stop: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def arm(self, stop: Callable[[], None]) -> None:
        """The runtime's stop for this call (replacing any before); called at once if the
        call was cancelled already."""
        with self._lock:
            self._stop = stop
            if self.cancelled:
                stop()

    def cancel(self) -> None:
        """Stop the inference with the runtime's own cancel (if it has started)."""
        with self._lock:
            self.cancelled = True
            if self._stop is not None:
                self._stop()  # under the lock: a stop replaced by `arm` never runs late


def is_background(band: int, bands: int) -> bool:
    """True for the two last bands of three or more (the `normal` and `idle` bands of the
    default spec: cached and unknown apps), the last of two, none of one."""
    return bands > 1 and band >= max(1, bands - 2)


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name, shape (None for a dynamic dimension) and dtype."""

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype[Any]

    def describe(self) -> str:
        """E.g. `x: float32[?, 256]`."""
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"


class Session(Protocol):
    """One model opened in a runtime, ready to run on any channel."""

    weight_bytes: int
    inputs: tuple[InputSpec, ...]
    target: str
    """The device or provider that really runs it (e.g. `CPU`, `CPUExecutionProvider`)."""

    def run(self, feeds: dict[str, np.ndarray], call: Call) -> list[np.ndarray]:
        """Perform one inference now; raises if the runtime fails or the call was stopped."""

    def set_band(self, band: int, bands: int) -> None:
        """Tell the runtime the band of the model's work (0 most important of `bands`),
        where it can."""

    def close(self) -> None:
        """Release the runtime's objects."""


def check_feeds(inputs: tuple[InputSpec, ...], given: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """`given` as arrays of the model's inputs; a wrong name, dtype or shape is refused."""
    if not isinstance(given, Mapping):
        raise IllegalArgumentError(f"inputs must be a mapping of name to array; got {given!r}")
    names = {spec.name for spec in inputs}
    if set(given) != names:
        allowed = ", ".join(spec.describe() for spec in inputs)
        extra = sorted(map(str, set(given) - names))
        missing = sorted(names - set(given))
        raise IllegalArgumentError(
            f"inputs must be exactly {{{allowed}}}; unknown {extra}, missing {missing}"
        )
    feeds: dict[str, np.ndarray] = {}
    for spec in inputs:
        value = given[spec.name]
        if isinstance(value, np.ndarray):
            if value.dtype != spec.dtype:
                raise IllegalArgumentError(
                    f"input {spec.name!r} has dtype {value.dtype}; the model takes {spec.dtype}"
                )
            array = value
        else:
            try:
                array = np.asarray(value, dtype=spec.dtype)
            except (TypeError, ValueError) as exc:
                raise IllegalArgumentError(
                    f"input {spec.name!r} is not convertible to {spec.dtype}: {exc}"
                ) from None
        fits = array.ndim == len(spec.shape) and all(
            d is None or d == n for d, n in zip(spec.shape, array.shape, strict=True)
        )
        if not fits or 0 in array.shape:
            raise IllegalArgumentError(
                f"input {spec.name!r} has shape {list(array.shape)}; the model takes "
                f"{spec.describe()} (? is any size >= 1)"
            )
        feeds[spec.name] = array
    return feeds
