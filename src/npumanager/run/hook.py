"""What the import hook does once a runtime is imported: swap its session classes for the
managed ones (`npumanager.run.ort_session`, `npumanager.run.openvino_model`), in every place
the runtime exposes them, so that `import onnxruntime as ort`, `from onnxruntime import
InferenceSession` and the runtime's own submodules all give the managed class."""

from __future__ import annotations

import sys
from types import ModuleType

from npumanager.errors import NpuManagerError
from npumanager.run._boot.npumanager_run_boot import WARNING_PREFIX
from npumanager.run.settings import from_environment

MANAGED_MARK = "__npu_manager_managed__"
"""Set on a runtime module whose sessions are managed (a program may check it)."""


def manage_runtime(name: str, module: ModuleType) -> None:
    """Manage `module` (a runtime's top-level package, just imported) if the settings name it;
    a setting that cannot be read leaves it unmanaged and says so in one line."""
    try:
        settings = from_environment()
    except NpuManagerError as error:
        sys.stderr.write(f"{WARNING_PREFIX} {name} runs unmanaged: {error}\n")
        return
    if name not in settings.runtimes or getattr(module, MANAGED_MARK, False):
        return
    if name == "onnxruntime":
        from npumanager.run.ort_session import managed_session_class

        managed = managed_session_class(module, settings)
        module.InferenceSession = managed  # type: ignore[attr-defined]
        collection = sys.modules.get("onnxruntime.capi.onnxruntime_inference_collection")
        if collection is not None:
            collection.InferenceSession = managed  # type: ignore[attr-defined]
    else:
        from npumanager.run.openvino_model import manage_core

        manage_core(module, settings)
    setattr(module, MANAGED_MARK, True)
