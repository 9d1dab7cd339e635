"""The `npu-manager` console script's entry point: a Ctrl-C at any moment, even while
npu-manager is still being imported, ends the command quietly with exit code 130.

It lives outside the `npumanager` package because importing anything inside it runs the
package's `__init__` first, where a Ctrl-C would escape as a traceback. So it imports
nothing of npu-manager before its `try`, and repeats the two values it needs.
"""

from __future__ import annotations

import signal
import sys

_INTERRUPTED_LINE = "npu-manager: interrupted\n"
"""`npumanager.cli.program`'s line for a Ctrl-C (that module may be half imported here)."""
_EXIT_INTERRUPTED = 130
"""`npumanager.cli.program.EXIT_INTERRUPTED`: what a shell reports for Ctrl-C."""


def entry() -> None:
    """Run the `npu-manager` command line; a Ctrl-C is one line and exit code 130."""
    try:
        from npumanager.cli.program import entry as run

        run()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C changes nothing now
        try:
            sys.stderr.write(_INTERRUPTED_LINE)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        sys.exit(_EXIT_INTERRUPTED)
