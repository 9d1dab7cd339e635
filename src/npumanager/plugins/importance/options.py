"""The built-in importance sources' options, validated before a source is built; light to
import, so that registering the sources costs nothing until one is used.

Each model forbids unknown options; `npumanager.checks.validate_options`
turns a refusal into one line naming the allowed ones.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import pairwise
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from npumanager.core.plugins.importance import ImportanceName, importance_named
from npumanager.schemas import Importance

Ladder = tuple[tuple[float, Importance], ...]
"""Steps of the ``desktop`` ladder: from ``seconds`` after an app lost focus, ``importance``."""

DEFAULT_LADDER: Final[Ladder] = (
    (0.0, Importance.SERVICE),
    (600.0, Importance.CACHED),
)
"""An app that lost the focus is work the user may still wait for (SERVICE); ten minutes
later nobody is waiting on it (CACHED, the first to give way). Not VISIBLE first: the
device's default bands schedule VISIBLE (200) in the focused app's band (100..299), where
fair share alone divides the channels, so the focus would change nothing at the device
(measured by benchmarks/focus.py: the deadline app's p99 only 1.43x better with the focus
that way, 3.7x with this ladder). A desktop where unfocused windows stay in front can say
``ladder=VISIBLE@0/SERVICE@60/CACHED@600``."""
MAX_LADDER_S: Final = 7 * 24 * 3600.0
"""The latest a ladder step may begin: a week after focus was lost."""
NO_OPINION: Final = "none"
"""The option value that gives no opinion (``slices:app=none``)."""

_STEP = re.compile(r"\s*([A-Za-z_]+)\s*@\s*([0-9]+(?:\.[0-9]*)?)\s*")


class _Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DesktopOptions(_Options):
    """The ``desktop`` source's options (see `npumanager.plugins.importance.desktop`)."""

    root: str | None = None
    """The cgroup v2 hierarchy to watch; default: where it is mounted (from mountinfo)."""
    ladder: Ladder = DEFAULT_LADDER
    """``NAME@SECONDS/...``: from SECONDS after an app lost focus, importance NAME; the first
    step at 0, seconds rising, each step less important than the one before."""

    @field_validator("ladder", mode="before")
    @classmethod
    def _ladder(cls, value: Any) -> Any:
        steps = _steps(value)
        if not steps or steps[0][0] != 0:
            raise ValueError("the first step must begin at 0 s, e.g. VISIBLE@0/CACHED@600")
        for (s1, i1), (s2, i2) in pairwise(steps):
            if not (s2 > s1 and i2 > i1):
                raise ValueError(
                    f"each step begins later and is less important than the one before; "
                    f"got {i1.name}@{s1:g} then {i2.name}@{s2:g}"
                )
        for seconds, importance in steps:
            if not Importance.FOREGROUND < importance < Importance.GONE:
                raise ValueError(
                    f"a step is less important than FOREGROUND and more than GONE; "
                    f"got {importance.name}"
                )
            if seconds > MAX_LADDER_S:
                raise ValueError(f"a step begins at most {MAX_LADDER_S:g} s after; got {seconds:g}")
        return tuple(steps)


def _steps(value: Any) -> list[tuple[float, Importance]]:
    """The ladder's steps from ``NAME@S/...``, ``{NAME: S}`` or ``[(S, NAME)]``."""
    if isinstance(value, str):
        pairs: list[tuple[Any, Any]] = []
        for item in value.split("/"):
            match = _STEP.fullmatch(item)
            if match is None:
                raise ValueError(f"steps are NAME@SECONDS separated by '/'; got {item!r}")
            pairs.append((match[2], match[1]))
    elif isinstance(value, Mapping):
        pairs = [(s, name) for name, s in value.items()]
    else:
        pairs = list(value)
    steps = []
    for seconds, name in pairs:
        steps.append((_seconds(seconds), importance_named("a step", name)))
    return steps


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"a step's seconds are a number; got {value!r}")
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"a step's seconds are a number; got {value!r}") from None
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"a step's seconds are 0 or more; got {value!r}")
    return seconds


class SlicesOptions(_Options):
    """The ``slices`` source's options: the importance of an app under each slice, or
    ``none`` (see `npumanager.plugins.importance.slices`)."""

    background: ImportanceName | None = Importance.CACHED
    """An app under ``background.slice``."""
    session: ImportanceName | None = Importance.FOREGROUND_SERVICE
    """A service under ``session.slice``."""
    app: ImportanceName | None = None
    """An app under ``app.slice``."""

    @field_validator("background", "session", "app", mode="before")
    @classmethod
    def _none(cls, value: Any) -> Any:
        if isinstance(value, str) and value.lower() == NO_OPINION:
            return None
        if isinstance(value, str) and value.upper() not in Importance.__members__:
            allowed = ", ".join([NO_OPINION, *Importance.__members__])
            raise ValueError(f"{value!r} is not an importance; allowed: {allowed}")
        return value


class RulesOptions(_Options):
    """The ``rules`` source's options (see `npumanager.plugins.importance.rules`)."""

    rules: str | dict[str, str] = Field(default_factory=dict)
    """``GLOB=NAME/GLOB=NAME`` or a table; tried before the config file's
    ``[importance.rules]``, the first match winning."""
