"""The cffi build of the vnpu extension (API mode, out of line).

setup.py names `ffibuilder` in `cffi_modules`; paths are relative to the project root, as
setuptools runs the build there. The cdef is the marked part of `csrc/vnpu.h`, with each
`#define NAME value` turned into `#define NAME ...` so its value comes from the C compiler.
"""

from __future__ import annotations

import re
from pathlib import Path

from cffi import FFI  # type: ignore[import-untyped,unused-ignore]

HERE = Path(__file__).resolve().parent
HEADER = HERE / "csrc" / "vnpu.h"
CSRC = "src/npumanager/vendor_drivers/vnpu/csrc"
BEGIN, END = "/* VNPU_CDEF_BEGIN */", "/* VNPU_CDEF_END */"


def cdef_text(header: str) -> str:
    """The declarations between the cdef markers of `header`, ready for `FFI.cdef`."""
    body = header.split(BEGIN, 1)[1].split(END, 1)[0]
    return re.sub(r"(?m)^#define\s+(\w+)\s+.*$", r"#define \1 ...", body)


ffibuilder = FFI()
ffibuilder.cdef(cdef_text(HEADER.read_text(encoding="utf-8")))
ffibuilder.set_source(
    "npumanager.vendor_drivers.vnpu._vnpu",
    '#include "vnpu.h"',
    sources=[f"{CSRC}/vnpu.c", f"{CSRC}/fair.c"],
    include_dirs=[CSRC],
    extra_compile_args=["-std=c99", "-O2", "-Wall", "-Wextra", "-pthread"],
    libraries=["pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
