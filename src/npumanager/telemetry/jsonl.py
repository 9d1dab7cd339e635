"""The `jsonl` sink: one JSON object a line, in a file that rotates by size.

The default file is `events.jsonl` in the per-user log directory (platformdirs). When a
batch leaves the file at `max_bytes` or more it is rotated like a log: `events.jsonl.1`
is the newest backup, at most `backup_count` are kept (0: the file is simply restarted).

A named file's folder must exist and the file must be writable when the sink is built. A
write that fails later (a full disk) is one log line, never a traceback: events are dropped
(and counted) and the file is tried again every `JSONL_RETRY_INTERVAL_S`.
"""

from __future__ import annotations

import contextlib
import logging
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
    JSONL_RETRY_INTERVAL_S,
)
from npumanager.telemetry.events import TelemetryEvent
from npumanager.telemetry.paths import writable_file
from npumanager.telemetry.records import to_json_line
from npumanager.userdirs import user_dir

log = logging.getLogger(__name__)


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
        self.max_bytes = check_int("max_bytes", max_bytes, 1, 1 << 50)
        self.backup_count = check_int("backup_count", backup_count, 0, 1000)
        if path is None:
            self.path = default_path()
            self.path.parent.mkdir(parents=True, exist_ok=True)
        else:
            self.path = Path(path)
        writable_file(self.path, "sink 'jsonl'")
        self._file: IO[str] | None = None
        self._size = 0
        self._flushed_at = time.monotonic()
        self.dropped = 0
        """Events lost to failed writes."""
        self._retry_at: float | None = None
        """While writes fail: when to try the file again."""

    def handle(self, batch: Sequence[TelemetryEvent]) -> None:
        """Write the batch, one line an event; flush at most once a second. While the file
        cannot be written, drop the batch (see the module's docstring)."""
        now = time.monotonic()
        if self._retry_at is not None and now < self._retry_at:
            self.dropped += len(batch)
            return
        try:
            self._write(batch, now)
        except OSError as exc:
            self._failed(exc, len(batch), now)
            return
        if self._retry_at is not None:
            self._retry_at = None
            log.warning(
                "sink 'jsonl': writing %s again; %d events were dropped", self.path, self.dropped
            )

    def _write(self, batch: Sequence[TelemetryEvent], now: float) -> None:
        file = self._file or self._open()
        text = "".join([to_json_line(event) for event in batch])
        file.write(text)
        self._size += len(text)  # json.dumps writes ASCII only: characters are bytes
        if self._size >= self.max_bytes:
            self._rotate()
            return
        if now - self._flushed_at >= JSONL_FLUSH_INTERVAL_S:
            file.flush()
            self._flushed_at = now

    def _failed(self, exc: OSError, events: int, now: float) -> None:
        """Drop the file and the batch; one line when writes begin to fail."""
        self.dropped += events
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()  # its buffer is lost with it; the descriptor is closed
        if self._retry_at is None:
            log.warning(
                "sink 'jsonl': cannot write %s: %s; its events are dropped until it can be "
                "written again (tried every %g s)",
                self.path,
                exc.strerror or exc,
                JSONL_RETRY_INTERVAL_S,
            )
        self._retry_at = now + JSONL_RETRY_INTERVAL_S

    def _open(self) -> IO[str]:
        self._file = self.path.open("a", encoding="utf-8")
        self._size = self.path.stat().st_size
        if self._retry_at is not None and self._size and not _ends_a_line(self.path):
            self._file.write("\n")  # a line cut short by the failed write ends here
        return self._file

    def _rotate(self) -> None:
        if not self.path.is_file():
            self._size = 0  # a device or a FIFO (/dev/null, a pipe) is written, never renamed
            return
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
        """Flush and close the file; a failed flush is logged (once), never raised."""
        file, self._file = self._file, None
        if file is None:
            return
        try:
            file.close()
        except OSError as exc:
            if self._retry_at is None:
                log.warning(
                    "sink 'jsonl': cannot write %s at close: %s; its last events are dropped",
                    self.path,
                    exc.strerror or exc,
                )


def _ends_a_line(path: Path) -> bool:
    """True if the file's last byte ends a line (or it cannot be read: nothing to mend)."""
    try:
        with path.open("rb") as file:
            file.seek(-1, 2)
            return file.read(1) == b"\n"
    except OSError:
        return True
