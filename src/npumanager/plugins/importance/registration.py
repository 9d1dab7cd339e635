"""The built-in importance sources, registered through the same hook as any third party's.

`desktop` watches GNOME's focus on the app cgroups, `slices` ranks an app by its systemd
slice, `rules` by a table of app-id globs (its defaults from the config file's
``[importance.rules]``). Their modules are imported on first use, so discovery stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from npumanager.core.plugins.config import Config
from npumanager.core.plugins.hookspecs import hookimpl
from npumanager.plugins.importance.options import DesktopOptions, RulesOptions, SlicesOptions
from npumanager.schemas import ImportanceSourceRecord


def _desktop(options: DesktopOptions) -> Any:
    from npumanager.plugins.importance.desktop import desktop

    return desktop(options)


def _slices(options: SlicesOptions) -> Any:
    from npumanager.plugins.importance.slices import slices

    return slices(options)


class _Rules:
    """The `rules` factory, holding the config file's table."""

    def __init__(self, file_rules: Mapping[str, str]) -> None:
        self.file_rules = dict(file_rules)

    def __call__(self, options: RulesOptions) -> Any:
        from npumanager.plugins.importance.rules import rules

        return rules(options, self.file_rules)


@hookimpl
def npumanager_register_importance_sources(config: Config) -> Iterable[ImportanceSourceRecord]:
    """The built-in importance sources."""
    return [
        ImportanceSourceRecord(
            name="desktop",
            factory=_desktop,
            options_model=DesktopOptions,
            description="the focused app (GNOME's user.xdg.inactive-since), by inotify",
        ),
        ImportanceSourceRecord(
            name="slices",
            factory=_slices,
            options_model=SlicesOptions,
            description="background.slice is CACHED, session.slice FOREGROUND_SERVICE",
        ),
        ImportanceSourceRecord(
            name="rules",
            factory=_Rules(config.importance.rules),
            options_model=RulesOptions,
            description="app-id globs to importances, from options and [importance.rules]",
        ),
    ]
