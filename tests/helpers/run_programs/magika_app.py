"""Magika (a third-party package that ships its own ONNX model) used as its docs show,
for tests/test_run_magika.py. Usage: magika_app.py FILE...; prints each file's label and
score, then `loaded PID`, and waits for a line on stdin before it identifies them again."""

from __future__ import annotations

import os
import sys

from magika import Magika


def identify(magika: Magika, paths: list[str]) -> None:
    for path in paths:
        result = magika.identify_path(path)
        print("file", os.path.basename(path), result.prediction.dl.label, repr(result.score))
    for sample in (b"#!/bin/sh\necho hello\n" * 20, b'{"a": [1, 2, 3]}\n' * 40):
        result = magika.identify_bytes(sample)
        print("bytes", result.prediction.dl.label, repr(result.score), flush=True)


if __name__ == "__main__":
    magika = Magika()
    identify(magika, sys.argv[1:])
    print("loaded", os.getpid(), flush=True)
    sys.stdin.readline()
    identify(magika, sys.argv[1:])
    print("done", flush=True)
