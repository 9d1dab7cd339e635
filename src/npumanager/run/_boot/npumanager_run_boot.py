"""The import hook of `npu-manager run`: a `sys.meta_path` finder that lets ONNX Runtime and
OpenVINO import as usual, then hands the module to the callable it was installed with
(`sitecustomize` installs it with `npumanager.run.hook`).

It imports nothing of npu-manager, so a program that never imports a runtime pays for a
finder that looks at two names and nothing more.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

RUNTIMES = ("onnxruntime", "openvino")
"""The top-level packages whose sessions `npu-manager run` can manage."""
WARNING_PREFIX = "npu-manager run: warning:"


OnImport = Callable[[str, ModuleType], None]
"""What the finder calls with a runtime's name and module once the runtime has run it."""


class _ManagingLoader:
    """The runtime's own loader, and after it has run the module, the manager's hook."""

    def __init__(self, loader: Any, name: str, on_import: OnImport) -> None:
        self._loader = loader
        self._name = name
        self._on_import = on_import

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._on_import(self._name, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class RuntimeFinder:
    """Finds nothing itself: for a runtime's top-level package it asks the finders after it
    and wraps the loader they give; every other import passes by untouched."""

    def __init__(self, on_import: OnImport) -> None:
        self._on_import = on_import

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name not in RUNTIMES:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: ModuleSpec | None = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    loader = _ManagingLoader(spec.loader, name, self._on_import)
                    spec.loader = loader  # type: ignore[assignment]
                return spec
        return None


def install(on_import: OnImport) -> None:
    """Put the finder first on `sys.meta_path` (once)."""
    if not any(isinstance(finder, RuntimeFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, RuntimeFinder(on_import))
