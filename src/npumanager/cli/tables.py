"""Plain-text tables for the command line."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(rows: Sequence[Sequence[str]], headers: Sequence[str]) -> str:
    """Left-aligned columns under a header and a rule, two spaces apart."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=False)]
    lines = [headers, ["-" * w for w in widths], *rows]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )
