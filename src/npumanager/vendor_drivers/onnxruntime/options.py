"""The runtime options (``core.driver.contract.Tuned``) the ONNX Runtime driver applies to
a model's session: those an app sets on its own ``SessionOptions`` that change what a run
computes or how it runs, named ``onnxruntime.`` and the runtime's own name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import onnxruntime as ort

from npumanager.errors import IllegalArgumentError

PREFIX = "onnxruntime."
_LEVELS = {
    "0": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "1": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "2": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "99": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_SWITCHES = {"0": "0", "1": "1"}
CONFIG_ENTRIES = ("session.set_denormal_as_zero", "session.disable_prepacking")
"""The session config entries taken (``SessionOptions.add_session_config_entry``)."""
TAKEN = ("graph_optimization_level", *CONFIG_ENTRIES)
"""Every option this driver takes, without its prefix. Not ``execution_mode``: a session
runs its nodes one after another, on the threads its grant counts (a parallel session
runs them on inter-op threads besides, which the runtime only starts for more than one)."""


def apply_options(options: ort.SessionOptions, asked: Mapping[str, str]) -> None:
    """Set the ``onnxruntime.`` options of ``asked`` on a session's ``options``; every other
    runtime's are left alone. An unknown name or a value the runtime does not take raises
    `IllegalArgumentError`, saying what is taken."""
    for key, value in asked.items():
        if not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX) :]
        if name == "graph_optimization_level":
            options.graph_optimization_level = _pick(key, value, _LEVELS)
        elif name in CONFIG_ENTRIES:
            options.add_session_config_entry(name, _pick(key, value, _SWITCHES))
        else:
            taken = ", ".join(PREFIX + option for option in TAKEN)
            raise IllegalArgumentError(
                f"the onnxruntime driver takes no option {key!r}; it takes {taken}"
            )


def _pick(key: str, value: str, allowed: Mapping[str, Any]) -> Any:
    if value not in allowed:
        raise IllegalArgumentError(
            f"option {key} takes {', '.join(repr(v) for v in allowed)}; got {value!r}"
        )
    return allowed[value]
