"""The `jsonl` sink: one JSON object a line, in a file that rotates by size.

The default file is `events.jsonl` in the per-user log directory (platformdirs). When a
batch leaves the file at `max_bytes` or more it is rotated like a log: `events.jsonl.1`
is the newest backup, at most `backup_count` are kept (0: the file is simply restarted).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import platformdirs

from npumanager.checks import check_int
from npumanager.errors import IllegalArgumentError
from npumanager.schemas.limits import (
    DEFAULT_JSONL_BACKUPS,
    DEFAULT_JSONL_MAX_BYTES,
    JSONL_FLUSH_INTERVAL_S,
)
from npumanager.telemetry.events import TelemetryEvent
from npumanager.telemetry.records import to_json_line
from npumanager.userdirs import user_dir


def default_path() -> Path:
    """`events.jsonl` in the per-user log directory."""
    return user_dir(platformdirs.user_log_dir, "give the sink a path (jsonl:path=FILE)") / (
        "events.jsonl"
    )


class JsonlSink:
    """Appends every event as a JSON line; rotates the file by size."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        max_bytes: int = DEFAULT_JSONL_MAX_BYTES,
        backup_count: int = DEFAULT_JSONL_BACKUPS,
    ) -> None:
        if path is not None and not isinstance(path, str | Path):
            raise IllegalArgumentError(f"path must be a str or a Path; got {path!r}")
        self.path = Path(path) if path is not None else default_path()
        self.max_bytes = check_int("max_bytes", max_bytes, 1, 1 << 50)
        self.backup_count = check_int("backup_count", backup_count, 0, 1000)
        self._file: IO[str] | None = None
        self._size = 0
        self._flushed_at = time.monotonic()

    def handle(self, batch: Sequence[TelemetryEvent]) -> None:
        """Write the batch, one line an event; flush at most once a second."""
        file = self._file or self._open()
        text = "".join([to_json_line(event) for event in batch])
        file.write(text)
        self._size += len(text)  # json.dumps writes ASCII only: characters are bytes
        if self._size >= self.max_bytes:
            self._rotate()
            return
        now = time.monotonic()
        if now - self._flushed_at >= JSONL_FLUSH_INTERVAL_S:
            file.flush()
            self._flushed_at = now

    def _open(self) -> IO[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._size = self.path.stat().st_size
        return self._file

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.backup_count == 0:
            self.path.unlink(missing_ok=True)
        else:
            for n in range(self.backup_count - 1, 0, -1):
                older = self._backup(n)
                if older.exists():
                    older.replace(self._backup(n + 1))
            self.path.replace(self._backup(1))
        self._open()

    def _backup(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{n}")

    def close(self) -> None:
        """Flush and close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None
