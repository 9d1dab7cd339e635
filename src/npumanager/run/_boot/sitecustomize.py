"""Started by Python in every program under `npu-manager run` (this folder is first on its
PYTHONPATH): installs the runtimes' import hook, then runs the `sitecustomize` the
environment had without it, if any."""

import os
import sys
from importlib.machinery import PathFinder
from types import ModuleType

import npumanager_run_boot  # type: ignore[import-not-found]  # a file beside this one


def _manage(name: str, module: ModuleType) -> None:
    """Hand a runtime just imported to the manager's hook; if that fails (npu-manager is not
    importable by this Python, say), the runtime runs unmanaged and one line says so."""
    try:
        from npumanager.run.hook import manage_runtime

        manage_runtime(name, module)
    except Exception as error:
        sys.stderr.write(f"{npumanager_run_boot.WARNING_PREFIX} {name} runs unmanaged: {error}\n")


def _chain() -> None:
    """Import the next `sitecustomize` on the path, as Python would have without this one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    ours = sys.modules.get("sitecustomize")
    module = type(sys)("sitecustomize")
    module.__spec__ = spec
    module.__file__ = spec.origin
    module.__loader__ = spec.loader
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        raise


npumanager_run_boot.install(_manage)
_chain()
