"""What a real driver needs of one opened model, and the checks on an inference's inputs.

A runtime adapter (`onnxruntime`, `openvino`) opens a model into a `Session`: its weight
bytes, its inputs, and `run`, which performs one inference on the caller's thread and
arms the `Call` with the runtime's own way to stop it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

import numpy as np

from npumanager.core.driver.contract import Asked
from npumanager.errors import IllegalArgumentError
from npumanager.schemas.device import DeviceSpec
from npumanager.schemas.limits import MAX_EFFECTIVE_PRIORITY


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


def background_from(spec: DeviceSpec) -> int:
    """The least effective priority whose band `is_background` on a device of `spec`
    (past every priority when none is): work at or above it is background."""
    count = len(spec.bands)
    for band in range(count):
        if is_background(band, count):
            return spec.bands[band].first_priority
    return MAX_EFFECTIVE_PRIORITY + 1


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name, shape (None for a dynamic dimension) and dtype."""

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype[Any]
    fixed: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)
    """The dimensions of a fixed size, as (index, size): what `check_feeds` compares."""

    def __post_init__(self) -> None:
        fixed = tuple((i, d) for i, d in enumerate(self.shape) if d is not None)
        object.__setattr__(self, "fixed", fixed)

    def describe(self) -> str:
        """E.g. `x: float32[?, 256]`."""
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"


class Counted(Protocol):
    """A model parsed and its weights counted, before anything is allocated for them."""

    weight_bytes: int


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


class SessionHost(Protocol):
    """Where a driver counts and opens a model instead of in its own process (a daemon's
    model host, `npumanager.daemon.host`)."""

    def count(self, model: Any, sidecars: Mapping[str, int], allowed: int | None = None) -> Counted:
        """Parse the model there and count its weights (`allowed`: the most its grant
        allows, for the room the host is given meanwhile)."""

    def open(self, device: int, counted: Counted, band: int, asked: Asked | None = None) -> Session:
        """Open a model counted there, as its app ``asked``: a session whose runs happen
        there."""

    def discard(self, counted: Counted) -> None:
        """Forget a counted model that will not be opened."""


@dataclass(frozen=True)
class InHost:
    """A model to be parsed, opened and run in `host`, not in the driver's process:
    `load_model(model=InHost(host, source))`."""

    host: SessionHost
    source: Any


def check_feeds(inputs: tuple[InputSpec, ...], given: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """`given` as arrays of the model's inputs; a wrong name, dtype or shape is refused."""
    if type(given) is not dict and not isinstance(given, Mapping):
        raise IllegalArgumentError(f"inputs must be a mapping of name to array; got {given!r}")
    if len(given) != len(inputs):
        _wrong_names(inputs, given)
    feeds: dict[str, np.ndarray] = {}
    for spec in inputs:
        value = given.get(spec.name, given)
        if value is given:
            _wrong_names(inputs, given)
        if isinstance(value, np.ndarray):
            dtype = value.dtype
            if dtype is not spec.dtype and dtype != spec.dtype:  # the same object, mostly
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
        shape = array.shape
        fits = len(shape) == len(spec.shape) and 0 not in shape
        if fits:
            for index, size in spec.fixed:
                if shape[index] != size:
                    fits = False
        if not fits:
            raise IllegalArgumentError(
                f"input {spec.name!r} has shape {list(shape)}; the model takes "
                f"{spec.describe()} (? is any size >= 1)"
            )
        feeds[spec.name] = array
    return feeds


def _wrong_names(inputs: tuple[InputSpec, ...], given: Mapping[str, Any]) -> NoReturn:
    """Refuse inputs whose names are not exactly the model's, naming both."""
    names = {spec.name for spec in inputs}
    allowed = ", ".join(spec.describe() for spec in inputs)
    extra = sorted(map(str, set(given) - names))
    missing = sorted(names - set(given))
    raise IllegalArgumentError(
        f"inputs must be exactly {{{allowed}}}; unknown {extra}, missing {missing}"
    )
