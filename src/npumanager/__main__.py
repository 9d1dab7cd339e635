"""`python -m npumanager` is the `npu-manager` command."""

from npumanager.cli.program import entry

if __name__ == "__main__":
    entry()
