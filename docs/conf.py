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
copyright = "npu-manager developers, Apache-2.0"

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

# A single-backticked name in a docstring or an rst page is a Python object, checked as a
# link: ``nitpicky`` makes every reference that resolves to nothing a warning (an error
# under -W). Code, values and names that are not objects are written as ``literals``.
default_role = "py:obj"
nitpicky = True
nitpick_ignore_regex = [
    # Types of the standard library and of third-party packages that signatures and
    # annotations name. They cannot be linked: the site is built offline, with no intersphinx
    # inventory to link them to. Nothing of npumanager's own is ignored here.
    (
        r"py:(class|obj)",
        r"(collections(\.abc)?|concurrent\.futures(\._base)?|importlib\.metadata|pathlib|uuid"
        r"|annotated_types|pydantic(\.\w+)*)\.\w+",
    ),
    ("py:class", "NoneType"),
    # The same, short: pydantic writes a field's constraints by their bare names (annotated_types'
    # ``Ge``..., pydantic's ``FieldInfo``) in a model's signature, and annotations that autodoc
    # shows as the source wrote them name pydantic's ``Field`` and ``BaseModel``.
    ("py:class", r"Ge|Gt|Le|MinLen|MaxLen|FieldInfo|Field|BaseModel"),
    # npumanager's own, one by one, where a signature names something that has no entry:
    # - type variables (a lease's model type, the model a plugin value is validated as):
    #   a placeholder, not an object to document;
    ("py:class", r"npumanager\.core\.client\.lease\.Model"),
    ("py:class", r"npumanager\.core\.plugins\.registry\._M"),
    ("py:class", r"npumanager\.checks\.Options"),
    # - what a daemon's scan of the processes holding the device finds, which
    #   Service.show_device_users' provider returns: the daemon's wiring, not an app's API
    #   (imported for type checking only, so autodoc sees the bare name);
    ("py:class", r"DeviceUser"),
    # - the in-process implementation of Backend (documented), which Service builds and
    #   Service.backend returns; its constructor takes the service's internals;
    ("py:class", r"npumanager\.core\.service\.backend\.LocalBackend"),
    # - the arbiter that Service.arbiter returns for inspection: its API is the policy
    #   writers' (the integrators' guide), not an app's;
    ("py:class", r"npumanager\.core\.arbiter\.arbiter\.Arbiter"),
    # - typing.Annotated around one of our enums (or around a union, ``types``): Sphinx names
    #   the Annotated form after the module of the type it wraps, a target that does not exist;
    ("py:class", r"(types|npumanager\.schemas\.(device|enums))\.Annotated"),
    # - SchedulingConfig.effective_priority's return annotation, Annotated[int, Range(...)]:
    #   Range's repr (what=free text) is no Python expression, so Sphinx takes the whole
    #   annotation as one name.
    ("py:obj", r"typing\.Annotated\[int, ~npumanager\.schemas\.types\.Range\(.*\)\]"),
]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"

html_theme = "furo"
html_title = "npu-manager"
