"""A hostile client process (tests/helpers/daemon_attacker.py) as a test drives it: its
uid, its attack, and what it reported once the attack was made."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from helpers.daemon_support import ATTACKER, SOCKET_GID, WAIT_S

ATTACK_UID = 20021


class Attacker:
    """One hostile client process (see daemon_attacker.py)."""

    def __init__(
        self,
        socket_path: Path,
        kind: str,
        count: int,
        *,
        uid: int = ATTACK_UID,
        gid: int | None = None,
        per: int = 1,
        timeout: float = WAIT_S,
    ) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(ATTACKER),
                str(socket_path),
                str(uid),
                str(uid if gid is None else gid),
                str(SOCKET_GID),
                kind,
                str(count),
                str(per),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = _readline(self.process.stdout, timeout)
        assert line, f"the {kind} attacker ended without reporting"
        self.report: dict[str, Any] = json.loads(line)["ready"]

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write("exit\n")
            self.process.stdin.flush()
            self.process.wait(WAIT_S)


def _readline(stream: Any, timeout: float) -> str:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return result[0] if result else ""
