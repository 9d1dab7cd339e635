"""The installed `npu-manager` console script, run as a user runs it, and the one-line
error every user's mistake must come to."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

CONSOLE_SCRIPT = str(Path(sys.executable).with_name("npu-manager"))
"""The installed `npu-manager` command, as a user runs it."""


VTS_AT_NORMAL_PRIORITY = ("--driver-option", "background_idle=false")
"""`vts` with the background workers at the normal OS priority: the rules judge the driver,
and under SCHED_IDLE its background work gets next to no CPU beside busy programs."""


def npu(*argv: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """`npu-manager ARGV` as a user runs it (keyword arguments go to `subprocess.run`)."""
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs}
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [CONSOLE_SCRIPT, *argv], text=True, check=False, **streams
    )


def one_line_error(result: subprocess.CompletedProcess[str], *parts: str) -> str:
    """The one stderr line of a refused command (exit 2, no traceback), holding `parts`."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


@contextlib.contextmanager
def started(*argv: str, **kwargs: object) -> Iterator[subprocess.Popen[str]]:
    """`npu-manager ARGV` running (stderr a text pipe); killed if still running at the end."""
    streams = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, **kwargs}
    process = subprocess.Popen(  # type: ignore[call-overload]
        [CONSOLE_SCRIPT, *argv], text=True, **streams
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
