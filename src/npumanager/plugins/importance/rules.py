"""The ``rules`` importance source: a table of app-id globs and their importances.

For boxes with no desktop (an embedded camera service) and for overrides: each rule is a
glob over the app id (``fnmatch`` rules, case-sensitive: ``*``, ``?``, ``[...]``) and the
name of an importance, ``"camera.service" = "FOREGROUND"``. The first rule that matches
decides; an app no rule matches gets no opinion. The rules come from the option ``rules``
(``rules:rules=camera.service=FOREGROUND/org.example.*=VISIBLE`` at the command line, a
table in Python), then from the config file's ``[importance.rules]`` table in its order:

.. code-block:: toml

   [importance.rules]
   "camera.service" = "FOREGROUND"
   "org.gnome.Photos.*" = "CACHED"

A name that is not an importance is refused with one line listing the allowed ones. The
table never changes while the source runs, so it never calls back.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase

from npumanager.core.plugins.importance import AppView, ImportanceCallback, importance_named
from npumanager.errors import IllegalArgumentError
from npumanager.plugins.importance.options import RulesOptions
from npumanager.schemas import Importance

Rules = tuple[tuple[str, Importance], ...]
"""``(glob, importance)`` in the order they are tried."""


def parse_rules(rules: str | Mapping[str, object]) -> Rules:
    """The rules of ``GLOB=NAME/GLOB=NAME`` or of a table, in order; `IllegalArgumentError`
    for a rule without a glob or with a name that is not an importance."""
    if isinstance(rules, str):
        pairs: list[tuple[str, object]] = []
        for item in filter(None, rules.split("/")):
            glob, equals, name = item.rpartition("=")
            if not equals:
                raise IllegalArgumentError(
                    f"importance source 'rules': rules are GLOB=NAME separated by '/'; got {item!r}"
                )
            pairs.append((glob, name))
    else:
        pairs = list(rules.items())
    parsed = []
    for glob, named in pairs:
        if not glob:
            raise IllegalArgumentError(f"importance source 'rules': a rule has no glob (={named})")
        parsed.append((glob, importance_named(f"importance source 'rules': {glob!r}", named)))
    return tuple(parsed)


class RulesSource:
    """The first rule whose glob matches the app id decides (see the module)."""

    def __init__(self, rules: Rules = ()) -> None:
        self.rules = rules

    def importance(self, app: AppView) -> Importance | None:
        """The importance of the first matching rule, or None."""
        for glob, importance in self.rules:
            if fnmatchcase(app.app_id, glob):
                return importance
        return None

    def start(self, changed: ImportanceCallback) -> None:
        """Nothing to watch: the table is fixed."""

    def close(self) -> None:
        """Nothing to stop."""


def rules(options: RulesOptions, file_rules: Mapping[str, str] | None = None) -> RulesSource:
    """The ``rules`` source: the option's rules, then the config file's."""
    return RulesSource(parse_rules(options.rules) + parse_rules(file_rules or {}))
