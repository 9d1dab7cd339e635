"""A program run to its end in a process group of its own: a timeout kills the whole group,
the daemons and apps it started included, not the program alone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def run_group(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `argv` (text output captured) in a new session; past `timeout` seconds every
    process of its group is killed with SIGKILL and `subprocess.TimeoutExpired` raised."""
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # the leader lives: its group is ours
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    return subprocess.CompletedProcess(argv, process.returncode, out, err)
