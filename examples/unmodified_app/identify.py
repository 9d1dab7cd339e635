"""Identify files with Magika's Python API, as its documentation shows: nothing here knows
of npu-manager. Usage: python identify.py FILE..."""

import sys

from magika import Magika

magika = Magika()
for path in sys.argv[1:]:
    result = magika.identify_path(path)
    print(f"{path}: {result.output.label} ({result.score:.3f})")
