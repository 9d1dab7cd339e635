"""The per-user folders (platformdirs), with no home directory a one-line error, not a traceback."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from npumanager.errors import ConfigError
from npumanager.schemas.limits import LOG_DIR_APP_NAME


def user_dir(where: Callable[[str], str], instead: str) -> Path:
    """`where("npu-manager")` (a platformdirs function); `instead` says what the user may set."""
    try:
        return Path(where(LOG_DIR_APP_NAME))
    except RuntimeError:
        raise ConfigError(
            f"no home directory (HOME is unset and uid {os.getuid()} has no passwd entry); "
            f"set HOME, or {instead}"
        ) from None
