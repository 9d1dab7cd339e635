"""The runtime options (``core.driver.contract.Tuned``) the OpenVINO driver applies when it
compiles a model: those an app passes in its own ``compile_model`` config that change what
a run computes, named ``openvino.`` and the runtime's own property name."""

from __future__ import annotations

from collections.abc import Mapping

from npumanager.errors import IllegalArgumentError

PREFIX = "openvino."
TAKEN: dict[str, tuple[str, ...]] = {
    "INFERENCE_PRECISION_HINT": ("f32", "bf16", "f16"),
    "EXECUTION_MODE_HINT": ("ACCURACY", "PERFORMANCE"),
}
"""Every property this driver takes, and the values it takes for each."""


def compile_options(asked: Mapping[str, str]) -> dict[str, str]:
    """The ``openvino.`` options of ``asked`` as ``compile_model`` properties; every other
    runtime's are left alone. An unknown name or a value not taken raises
    `IllegalArgumentError`, saying what is taken."""
    properties = {}
    for key, value in asked.items():
        if not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX) :]
        allowed = TAKEN.get(name)
        if allowed is None:
            taken = ", ".join(PREFIX + option for option in TAKEN)
            raise IllegalArgumentError(
                f"the openvino driver takes no option {key!r}; it takes {taken}"
            )
        if value not in allowed:
            raise IllegalArgumentError(
                f"option {key} takes {', '.join(repr(v) for v in allowed)}; got {value!r}"
            )
        properties[name] = value
    return properties
