"""Sphinx configuration of the npu-manager documentation site.

The generated parts (the request-state table, the wire-protocol messages, the conformance
rules, the command line, the API entries) come from `_ext/npudocs.py`, read from the code
at build time so they cannot drift from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent / "src"))

project = "npu-manager"
author = "npu-manager developers"
copyright = "npu-manager developers, Apache-2.0"  # noqa: A001

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "npudocs",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Docstrings write `name` for code, as Markdown does.
default_role = "code"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"

html_theme = "furo"
html_title = "npu-manager"
