"""Reading small kernel files under a root directory, each problem logged once.

Every path the `linux` source reads goes through `Files`, so `root=` moves all of them
under another directory (tests build fake trees there). A file that is missing,
unreadable or holds something odd turns that one reading off: one log line, then None
for good, never an exception and never a made-up value.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from npumanager.schemas.limits import MAX_HEALTH_FILE_BYTES

log = logging.getLogger("npumanager.health.linux")


class Files:
    """The machine's files as the source sees them: under `root`, each read guarded."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self._off: set[str] = set()

    def path(self, absolute: str) -> Path:
        """Where an absolute path of the machine lies under the root."""
        return self.root / absolute.lstrip("/")

    def shown(self, path: Path) -> str:
        """A path as the machine names it (without the root), for messages and readings."""
        try:
            return "/" + str(path.relative_to(self.root))
        except ValueError:
            return str(path)

    def off(self, path: Path, why: str) -> None:
        """Turn the reading of `path` off, with one log line saying why."""
        key = str(path)
        if key not in self._off:
            self._off.add(key)
            log.warning("%s: %s; that reading is off", self.shown(path), why)

    def is_off(self, path: Path) -> bool:
        """True once a reading of `path` was turned off."""
        return str(path) in self._off

    def text(self, path: Path) -> str | None:
        """The file's text, stripped; None (and the reading off) if it cannot be read."""
        if self.is_off(path):
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                data = b""
                while len(data) < MAX_HEALTH_FILE_BYTES:
                    chunk = os.read(fd, MAX_HEALTH_FILE_BYTES - len(data))
                    if not chunk:
                        break
                    data += chunk
            finally:
                os.close(fd)
            return data.decode("ascii").strip()
        except FileNotFoundError:
            self.off(path, "missing")
        except UnicodeDecodeError:
            self.off(path, "not text")
        except OSError as exc:
            self.off(path, f"unreadable ({exc.strerror or exc})")
        return None

    def integer(self, path: Path, low: int | None = None) -> int | None:
        """The file's whole number; None (and the reading off) if it is not one or below `low`."""
        text = self.text(path)
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            self.off(path, f"not a whole number ({text[:40]!r})")
            return None
        if low is not None and value < low:
            self.off(path, f"out of range ({value} < {low})")
            return None
        return value


def numbered(base: Path, prefix: str) -> list[tuple[int, Path]]:
    """The entries of `base` named `<prefix><number>`, by number (none if it is absent)."""
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)$")
    try:
        return sorted((int(m.group(1)), p) for p in base.iterdir() if (m := pattern.match(p.name)))
    except OSError:
        return []
