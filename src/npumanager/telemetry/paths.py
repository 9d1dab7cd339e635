"""The file a sink writes: checked when the sink is built, so a daemon with a sink that
cannot write is refused before it serves, not told on the first event."""

from __future__ import annotations

from pathlib import Path

from npumanager.errors import IllegalArgumentError


def writable_file(path: Path, what: str) -> Path:
    """`path` if its folder exists and the file can be opened for appending (an existing
    file is left as it is, a missing one is created empty); else a one-line
    `IllegalArgumentError` naming `what` ("sink 'jsonl'") and the problem."""
    folder = path.parent
    if not folder.is_dir():
        problem = "not a folder" if folder.exists() else "no such folder; create it first"
        raise IllegalArgumentError(f"{what}: {folder}: {problem}")
    if path.is_dir():
        raise IllegalArgumentError(f"{what}: {path}: is a directory; name a file in it")
    try:
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise IllegalArgumentError(
            f"{what}: {path}: cannot be written: {exc.strerror or exc}"
        ) from None
    return path
