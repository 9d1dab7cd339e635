"""`python -m npumanager.run [-m MODULE | SCRIPT] ARGS...`: this Python runs the program
under the manager, as `npu-manager run -- python ...` does."""

from __future__ import annotations

import sys

from npumanager.errors import NpuManagerError
from npumanager.run import exec_program
from npumanager.run.settings import from_environment

USAGE = "usage: python -m npumanager.run [-m MODULE | SCRIPT] [ARGS...]"


def main(argv: list[str]) -> int:
    """Exec this Python on the program; a mistake is one line on stderr and exit code 2."""
    if not argv or argv[0] in ("-h", "--help") or argv == ["-m"]:
        print(USAGE, file=sys.stderr if not argv or argv == ["-m"] else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        exec_program([sys.executable, *argv], from_environment())
    except NpuManagerError as error:
        print(f"npumanager.run: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
