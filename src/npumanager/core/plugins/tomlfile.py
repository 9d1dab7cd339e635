"""Reading a TOML file a user named: a regular file, not too large, UTF-8, not nested too deep.

Every way such a file can be wrong is a `ConfigError` of one line naming the file; nothing
blocks (a FIFO) or fills memory (`/dev/zero`).
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from npumanager.errors import ConfigError
from npumanager.schemas.limits import MAX_TOML_DEPTH, MAX_TOML_FILE_BYTES

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(path: Path) -> str | None:
    """None for a regular file or the null device (an empty file: `--config /dev/null`
    gives the defaults), "missing", or what it is; `ConfigError` if it cannot be seen."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror}") from None
    mode = status.st_mode
    if stat.S_ISREG(mode) or (stat.S_ISCHR(mode) and _is_null_device(status)):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _is_null_device(status: os.stat_result) -> bool:
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(null.st_mode) and status.st_rdev == null.st_rdev


def read_toml(path: Path) -> dict[str, Any]:
    """The parsed document of `path`; any problem is a one-line `ConfigError`."""
    kind = file_kind(path)
    if kind == "missing":
        raise ConfigError(f"{path}: no such file")
    if kind is not None:
        raise ConfigError(f"{path}: is {kind}, not a TOML file")
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_TOML_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror}") from None
    if len(raw) > MAX_TOML_FILE_BYTES:
        raise ConfigError(f"{path}: larger than the limit of {MAX_TOML_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start} is invalid)") from None
    document: dict[str, Any] | None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        document = None
    if document is None or _depth(document) > MAX_TOML_DEPTH:
        raise ConfigError(f"{path}: nested deeper than the limit of {MAX_TOML_DEPTH}")
    return document


def _depth(value: Any) -> int:
    """How deep tables and arrays nest in a parsed document (dotted keys nest too)."""
    stack = [(value, 0)]
    deepest = 0
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, level + 1) for child in item)
    return deepest
