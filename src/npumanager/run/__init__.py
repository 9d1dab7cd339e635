"""Run an unmodified program under the manager: `npu-manager run -- COMMAND ARGS...`, or
`python -m npumanager.run script.py ARGS...`.

The program starts with a private folder first on its PYTHONPATH, whose `sitecustomize`
installs an import hook; when the program (or any package it uses) imports ONNX Runtime or
OpenVINO, their session classes are replaced by managed ones that ask the daemon before a
model loads and run it in the app's model host. Every other import is left alone.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from typing import NoReturn

from npumanager.errors import NpuManagerError
from npumanager.run.settings import Settings

__all__ = ["Settings", "exec_program"]


def exec_program(command: Sequence[str], settings: Settings) -> NoReturn:
    """Replace this process by `command` under the manager (exec: the program keeps this
    process's id, terminal and signals, so Ctrl-C reaches it as it would without us)."""
    if not command:
        raise NpuManagerError("run needs a command to run, e.g. npu-manager run -- python app.py")
    program = command[0]
    found = shutil.which(program) if os.sep not in program else program
    if found is None or not os.path.isfile(found):
        raise NpuManagerError(f"run: command not found: {program}")
    if not os.access(found, os.X_OK):
        raise NpuManagerError(f"run: command is not executable: {program}")
    env = settings.environment(os.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(found, list(command), env)
    except OSError as error:
        raise NpuManagerError(f"run: cannot run {program}: {error.strerror}") from None
