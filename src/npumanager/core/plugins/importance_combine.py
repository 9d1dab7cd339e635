"""How the importance sources and an administrator's pins combine into one app's importance.

The order, first that has a value decides:

1. a pin of the app id (``set-importance APP_ID``), over every app of that id;
2. a pin of the app's real uid (``set-importance UID``), over every app of that uid;
3. the sources, in the order they were configured (``serve --importance a --importance b``:
   ``a`` before ``b``), each its opinion of the app id or none;
4. nothing: the caller's fallback (a uid never ranked).

Pure data and no I/O, no lock and no clock: the daemon holds one `ImportanceCombiner` under
its own lock, feeds it what the sources call back and asks it per app.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from npumanager.checks import check_int
from npumanager.errors import IllegalArgumentError
from npumanager.schemas import Importance
from npumanager.schemas.limits import MAX_PRIORITY, MIN_PRIORITY

_K = TypeVar("_K")

PINNED_APP = "pinned app"
"""What decided an app's importance when an administrator pinned its app id."""
PINNED_UID = "pinned uid"
"""What decided an app's importance when an administrator pinned its real uid."""


def combine(
    opinions: Iterable[tuple[str, int | None]],
    *,
    app_pin: int | None = None,
    uid_pin: int | None = None,
) -> tuple[int, str] | None:
    """The importance and what decided it: the app's pin, else its uid's pin, else the first
    of ``opinions`` (``(source, importance or None)`` in the configured order) with a value;
    None where nothing has one."""
    if app_pin is not None:
        return app_pin, PINNED_APP
    if uid_pin is not None:
        return uid_pin, PINNED_UID
    for source, importance in opinions:
        if importance is not None:
            return importance, source
    return None


def importance_label(value: int) -> str:
    """How to show an importance: its platform name (``CACHED``), or the number a pin gave."""
    try:
        return Importance(value).name
    except ValueError:
        return str(value)


class ImportanceCombiner:
    """Pins and each source's opinions by app id, combined by `combine` when asked."""

    def __init__(self, sources: Sequence[str]) -> None:
        duplicates = sorted({s for s in sources if list(sources).count(s) > 1})
        if duplicates:
            raise IllegalArgumentError(
                f"importance source {', '.join(map(repr, duplicates))} given twice; give each "
                "source once (its order decides)"
            )
        clash = sorted({PINNED_APP, PINNED_UID} & set(sources))
        if clash:
            raise IllegalArgumentError(f"{clash[0]!r} is not a name a source may have")
        self.sources = tuple(sources)
        self._opinions: dict[str, dict[str, int]] = {name: {} for name in self.sources}
        self._app_pins: dict[str, int] = {}
        self._uid_pins: dict[int, int] = {}

    def pin_app(self, app_id: str, importance: int | None) -> None:
        """Pin every app of this id (None: unpin), apps that appear later too."""
        _set(self._app_pins, app_id, _checked(importance))

    def pin_uid(self, uid: int, importance: int | None) -> None:
        """Pin every app of this real uid (None: unpin)."""
        _set(self._uid_pins, uid, _checked(importance))

    def opinion(self, source: str, app_id: str, importance: int | None) -> bool:
        """A source's opinion of an app id (None: none); True if it changed anything."""
        try:
            table = self._opinions[source]
        except KeyError:
            raise IllegalArgumentError(
                f"unknown importance source {source!r}; configured: "
                f"{', '.join(self.sources) or 'none'}"
            ) from None
        before = table.get(app_id)
        _set(table, app_id, importance)
        return before != importance

    def effective(self, app_id: str, uid: int) -> tuple[int, str] | None:
        """The importance of the app ``app_id`` of real uid ``uid``, and what decided it (a
        source's name, `PINNED_APP` or `PINNED_UID`); None where nothing ranks it."""
        return combine(
            ((name, self._opinions[name].get(app_id)) for name in self.sources),
            app_pin=self._app_pins.get(app_id),
            uid_pin=self._uid_pins.get(uid),
        )

    def app_pins(self) -> dict[str, int]:
        """Every pin of an app id."""
        return dict(self._app_pins)

    def uid_pins(self) -> dict[int, int]:
        """Every pin of a real uid."""
        return dict(self._uid_pins)


def _checked(importance: int | None) -> int | None:
    if importance is not None:
        check_int("importance", importance, MIN_PRIORITY, MAX_PRIORITY)
    return importance


def _set(table: dict[_K, int], key: _K, value: int | None) -> None:
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value
