"""`python -m npumanager` is the `npu-manager` command."""

from npumanager.cli import entry

if __name__ == "__main__":
    entry()
