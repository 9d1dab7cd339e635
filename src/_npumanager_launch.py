"""The `npu-manager` console script's entry point: a Ctrl-C at any moment, even while
npu-manager is still being imported, ends the command quietly with exit code 130.

It lives outside the `npumanager` package because importing anything inside it runs the
package's `__init__` first, where a Ctrl-C would escape as a traceback. So it imports
nothing of npu-manager before its guard, and repeats the two values it needs.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

_INTERRUPTED_LINE = "npu-manager: interrupted\n"
"""`npumanager.cli.program`'s line for a Ctrl-C (that module may be half imported here)."""
_EXIT_INTERRUPTED = 130
"""`npumanager.cli.program.EXIT_INTERRUPTED`: what a shell reports for Ctrl-C."""


def entry() -> None:
    """Run the `npu-manager` command line; a Ctrl-C is one line and exit code 130."""
    guarded = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if guarded:  # not where the shell started us with Ctrl-C ignored (a background job)
        signal.signal(signal.SIGINT, _end_while_starting)
    try:
        from npumanager.cli.program import entry as run
    finally:
        if guarded:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run()
    except BaseException as error:
        if not _caused_by_ctrl_c(error):
            raise
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C changes nothing now
        try:
            sys.stderr.write(_INTERRUPTED_LINE)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        sys.exit(_EXIT_INTERRUPTED)


def _end_while_starting(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C while npu-manager is being imported: nothing has started that needs undoing,
    so end at once. A KeyboardInterrupt raised there could land where Python wraps it in
    another error (inside a class's `__set_name__`, as pydantic's models use)."""
    os.write(2, _INTERRUPTED_LINE.encode())
    os._exit(_EXIT_INTERRUPTED)


def _caused_by_ctrl_c(error: BaseException) -> bool:
    """A KeyboardInterrupt, or an error that Python raised because one landed inside it."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__
    return False
