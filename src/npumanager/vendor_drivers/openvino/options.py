"""The ``openvino.`` runtime options (``npumanager.runtime_options``) as the properties the
OpenVINO driver compiles a model with: those an app passes in its own ``compile_model``
config that change what a run computes."""

from __future__ import annotations

from collections.abc import Mapping

from npumanager.runtime_options import OPENVINO, OPENVINO_PROPERTIES, check_value, not_taken


def compile_options(asked: Mapping[str, str]) -> dict[str, str]:
    """The ``openvino.`` options of ``asked`` as ``compile_model`` properties; every other
    runtime's are left alone. An unknown name or a value not taken raises
    `IllegalArgumentError`, saying what is taken."""
    properties = {}
    for key, value in asked.items():
        if not key.startswith(OPENVINO):
            continue
        name = key[len(OPENVINO) :]
        allowed = OPENVINO_PROPERTIES.get(name)
        if allowed is None:
            raise not_taken(key, OPENVINO, OPENVINO_PROPERTIES)
        properties[name] = check_value(key, value, allowed)
    return properties
