"""Print one fenced `sh` block of the README's `## Quick start` section (1 or 2).

CI runs exactly what the README tells a new user to run, so the two cannot drift.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def quickstart_blocks(text: str) -> list[str]:
    """The fenced sh blocks under the `## Quick start` heading, in order."""
    match = re.search(r"^## Quick start\s*$(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    if match is None:
        raise SystemExit("README.md has no '## Quick start' section")
    return re.findall(r"^```sh\n(.*?)^```", match.group(1), re.MULTILINE | re.DOTALL)


def main() -> None:
    number = int(sys.argv[1])
    blocks = quickstart_blocks(README.read_text(encoding="utf-8"))
    if len(blocks) < number:
        raise SystemExit(f"README.md's Quick start has {len(blocks)} sh blocks, need {number}")
    sys.stdout.write(blocks[number - 1])


if __name__ == "__main__":
    main()
