"""The file a sink writes: checked when the sink is built, so a daemon with a sink that
cannot write is refused before it serves, not told on the first event."""

from __future__ import annotations

import os
from pathlib import Path

from npumanager.errors import IllegalArgumentError


def writable_file(path: Path, what: str, *, create: bool = True) -> Path:
    """`path` if its folder exists and the file can be opened for appending (an existing
    file is left as it is, a missing one is created empty, or with ``create=False`` only
    its folder must be writable: a sink that writes nothing until it closes); else a
    one-line `IllegalArgumentError` naming `what` ("sink 'jsonl'") and the problem."""
    folder = path.parent
    if not folder.is_dir():
        problem = "not a folder" if folder.exists() else "no such folder; create it first"
        raise IllegalArgumentError(f"{what}: {folder}: {problem}")
    if path.is_dir():
        raise IllegalArgumentError(f"{what}: {path}: is a directory; name a file in it")
    if not create and not path.exists():
        if not os.access(folder, os.W_OK | os.X_OK):
            raise IllegalArgumentError(f"{what}: {folder}: cannot be written: no permission")
        return path
    try:
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise IllegalArgumentError(
            f"{what}: {path}: cannot be written: {exc.strerror or exc}"
        ) from None
    return path
