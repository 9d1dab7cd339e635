"""A machine without an optional package, for a subprocess: a `sitecustomize` on PYTHONPATH
that puts a finder first on `sys.meta_path` refusing the named top-level packages with
`ModuleNotFoundError`, exactly what Python says when a package is not installed; nothing
of npu-manager is patched."""

from __future__ import annotations

import os
from pathlib import Path

BLOCKER = '''
"""Refuse the packages named in NPU_TEST_BLOCK_IMPORTS, as if they were not installed."""
import os
import sys
from importlib.abc import MetaPathFinder

BLOCKED = frozenset(filter(None, os.environ.get("NPU_TEST_BLOCK_IMPORTS", "").split(",")))


class _NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
'''


def write_blocker(folder: Path) -> Path:
    """`folder`, now holding the blocking `sitecustomize.py`."""
    (folder / "sitecustomize.py").write_text(BLOCKER)
    return folder


def without(blocker: Path, *packages: str) -> dict[str, str]:
    """This environment, with `blocker` first on PYTHONPATH refusing `packages`."""
    env = dict(os.environ, NPU_TEST_BLOCK_IMPORTS=",".join(packages))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocker), env.get("PYTHONPATH")]))
    return env
