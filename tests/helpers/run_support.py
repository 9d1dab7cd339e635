"""Programs run under `npu-manager run` (the console script) and directly, for the tests of
`tests/test_run_*.py`: their stdout read line by line, each wait for a line bounded by
`WAIT_S` only to end a hung test."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from helpers.console import CONSOLE_SCRIPT
from helpers.daemon_support import WAIT_S

PROGRAMS = Path(__file__).with_name("run_programs")
ORT_APP = PROGRAMS / "ort_app.py"
OV_APP = PROGRAMS / "ov_app.py"


def managed_command(socket: Path | None, *command: str, options: tuple[str, ...] = ()) -> list[str]:
    """`npu-manager run [--socket S] OPTIONS -- COMMAND` as a user types it."""
    where = () if socket is None else ("--socket", str(socket))
    return [CONSOLE_SCRIPT, "run", *where, *options, "--", *command]


class Program:
    """A program started with stdin and stdout as pipes; `line(prefix)` waits for a line."""

    def __init__(self, command: list[str], **kwargs: Any) -> None:
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **kwargs,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self._errors = threading.Thread(target=self._read_errors, daemon=True)
        self._errors.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _read_errors(self) -> None:
        assert self.process.stderr is not None
        self._stderr.extend(self.process.stderr)

    def line(self, prefix: str) -> str:
        """The next line that starts with `prefix` (the lines before it are kept in `seen`)."""
        while True:
            try:
                line = self.lines.get(timeout=WAIT_S)
            except queue.Empty:
                raise AssertionError(f"no line {prefix!r} within {WAIT_S} s: {self.seen}") from None
            if line is None:
                self.process.wait(WAIT_S)
                raise AssertionError(
                    f"the program ended before {prefix!r}: {self.seen}\n{self.stderr}"
                )
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    def send(self, text: str = "go") -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def interrupt(self) -> None:
        self.process.send_signal(signal.SIGINT)

    def finish(self) -> int:
        """Close stdin and wait for the exit code."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        code = self.process.wait(WAIT_S)
        return code

    @property
    def stderr(self) -> str:
        if self.process.poll() is not None:
            self._errors.join(WAIT_S)  # it drains the pipe to its end after the exit
        return "".join(self._stderr)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(WAIT_S)


def all_lines(command: list[str], stdin: str = "go\n", **kwargs: Any) -> list[str]:
    """Run a program to its end; its stdout lines (it must exit 0)."""
    done = subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=WAIT_S, check=False, **kwargs
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def python(*args: str) -> list[str]:
    """This Python running `args`, as a program's command."""
    return [sys.executable, *map(str, args)]


def without_hook() -> dict[str, str]:
    """The environment of a program run directly: no hook inherited from the test's own."""
    return {k: v for k, v in os.environ.items() if not k.startswith("NPUMANAGER_RUN")}


@contextlib.contextmanager
def managed_sessions(socket: Path, monkeypatch: Any) -> Iterator[tuple[type, list[Any]]]:
    """In this process: `npu-manager run`'s session class for onnxruntime against the daemon
    at `socket` (refusing to run unmanaged), and a list for the sessions made of it, each
    closed at the end with the process's connection."""
    import onnxruntime as ort

    from npumanager.run.managed import PROCESS
    from npumanager.run.ort_session import managed_session_class
    from npumanager.run.settings import REFUSE, Settings

    monkeypatch.setenv("NPUMANAGER_SOCKET", str(socket))
    sessions: list[Any] = []
    try:
        yield managed_session_class(ort, Settings(no_daemon=REFUSE)), sessions
    finally:
        for session in sessions:
            session._npu_model.close()
        if PROCESS.manager is not None:
            PROCESS.manager.close()
            PROCESS.manager = None
