"""The `npu-manager` command: every verb (`program` parses and dispatches; one module a
family of verbs)."""

from npumanager.cli.program import entry, main

__all__ = ["entry", "main"]
