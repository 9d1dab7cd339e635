"""The importance sources a command runs, from ``--importance NAME[:KEY=VALUE,...]`` specs:
the spelling ``serve --health`` uses, checked the same way (one line for a bad spec, an
unknown source or option), built through the plugin registry, in the order given."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from npumanager.apps.identity import v2_mount
from npumanager.cli.health import parse_source
from npumanager.core.plugins.importance import ImportanceSource, build_importance_source
from npumanager.core.plugins.registry import PluginRegistry
from npumanager.errors import NpuManagerError

DEFAULT_SOURCES = ("rules", "desktop", "slices")
"""Where cgroup v2 is mounted: the config's rules first (they are the overrides), then the
focus, then the slices. Without cgroup v2, ``rules`` alone."""
NONE = "none"


def importance_specs(
    given: Sequence[str],
    *,
    flag: str = "--importance",
    cgroup_v2: Callable[[], object] = v2_mount,
) -> list[tuple[str, dict[str, Any]]]:
    """The sources named by ``flag`` (repeatable), in order: ``none`` alone for none; nothing
    given for the defaults (`DEFAULT_SOURCES` where ``cgroup_v2()`` finds the hierarchy)."""
    if list(given) == [NONE]:
        return []
    if NONE in given:
        raise NpuManagerError(f"{flag} none turns importance sources off; give it alone")
    if not given:
        defaults = DEFAULT_SOURCES if cgroup_v2() is not None else DEFAULT_SOURCES[:1]
        return [(name, {}) for name in defaults]
    specs = []
    for spec in given:
        if not spec.partition(":")[0]:
            raise NpuManagerError(
                f"{flag} {spec!r}: name an importance source first, e.g. desktop or "
                "rules:rules=camera.service=FOREGROUND"
            )
        specs.append(parse_source(flag, spec))
    names = [name for name, _ in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise NpuManagerError(
            f"{flag}: {', '.join(map(repr, twice))} given twice; give each source once "
            "(the order decides which wins)"
        )
    return specs


def build_importance_sources(
    registry: PluginRegistry, given: Sequence[str], *, flag: str = "--importance"
) -> list[tuple[str, ImportanceSource]]:
    """The sources of `importance_specs`, built (not started) in order; an unknown source, a
    bad option or a source that cannot start here is an error of one line, and nothing is
    left built."""
    built: list[tuple[str, ImportanceSource]] = []
    try:
        for spec in importance_specs(given, flag=flag):
            built.append(build_importance_source(registry, spec))
    except BaseException:
        for _, source in built:
            source.close()
        raise
    return built


__all__ = ["DEFAULT_SOURCES", "build_importance_sources", "importance_specs"]
