"""The runtime options a load may carry (``NpuManager.load_model(options=)``) that the
built-in drivers take, by runtime: the one table the drivers apply and ``npu-manager run``
reads from a program's own settings, and the errors for a name or value not taken."""

from __future__ import annotations

from collections.abc import Iterable

from npumanager.errors import IllegalArgumentError

ONNXRUNTIME = "onnxruntime."
ONNXRUNTIME_LEVELS = ("0", "1", "2", "99")
"""``graph_optimization_level``: disable all, basic, extended, all (the default)."""
ONNXRUNTIME_CONFIG_ENTRIES = ("session.set_denormal_as_zero", "session.disable_prepacking")
"""Session config entries (``SessionOptions.add_session_config_entry``), each ``"0"`` or
``"1"``."""
ONNXRUNTIME_TAKEN = ("graph_optimization_level", *ONNXRUNTIME_CONFIG_ENTRIES)
"""Every ``onnxruntime.`` option, without its prefix. Not ``execution_mode``: a session runs
its nodes one after another, on the threads its grant counts (a parallel session runs them
on inter-op threads besides, which the runtime only starts for more than one)."""
OPENVINO = "openvino."
OPENVINO_PROPERTIES: dict[str, tuple[str, ...]] = {
    "INFERENCE_PRECISION_HINT": ("f32", "bf16", "f16"),
    "EXECUTION_MODE_HINT": ("ACCURACY", "PERFORMANCE"),
}
"""Every ``openvino.`` option (a ``compile_model`` property) and the values taken."""


def not_taken(key: str, prefix: str, taken: Iterable[str]) -> IllegalArgumentError:
    """The error for an option of a driver's own runtime that the driver does not take."""
    names = ", ".join(prefix + name for name in taken)
    return IllegalArgumentError(
        f"the {prefix.rstrip('.')} driver takes no option {key!r}; it takes {names}"
    )


def check_value(key: str, value: str, allowed: Iterable[str]) -> str:
    """``value`` if ``allowed``, else an error naming the values the option takes."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise IllegalArgumentError(
            f"option {key} takes {', '.join(repr(v) for v in allowed)}; got {value!r}"
        )
    return value
