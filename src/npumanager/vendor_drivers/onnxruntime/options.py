"""Applying the ``onnxruntime.`` runtime options (``npumanager.runtime_options``) to a
model's session: those an app sets on its own ``SessionOptions`` that change what a run
computes."""

from __future__ import annotations

from collections.abc import Mapping

import onnxruntime as ort

from npumanager.runtime_options import (
    ONNXRUNTIME,
    ONNXRUNTIME_CONFIG_ENTRIES,
    ONNXRUNTIME_LEVELS,
    ONNXRUNTIME_TAKEN,
    check_value,
    not_taken,
)

_LEVELS = dict(
    zip(
        ONNXRUNTIME_LEVELS,
        (
            ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        ),
        strict=True,
    )
)


def apply_options(options: ort.SessionOptions, asked: Mapping[str, str]) -> None:
    """Set the ``onnxruntime.`` options of ``asked`` on a session's ``options``; every other
    runtime's are left alone. An unknown name or a value the runtime does not take raises
    `IllegalArgumentError`, saying what is taken."""
    for key, value in asked.items():
        if not key.startswith(ONNXRUNTIME):
            continue
        name = key[len(ONNXRUNTIME) :]
        if name == "graph_optimization_level":
            options.graph_optimization_level = _LEVELS[check_value(key, value, _LEVELS)]
        elif name in ONNXRUNTIME_CONFIG_ENTRIES:
            options.add_session_config_entry(name, check_value(key, value, ("0", "1")))
        else:
            raise not_taken(key, ONNXRUNTIME, ONNXRUNTIME_TAKEN)
