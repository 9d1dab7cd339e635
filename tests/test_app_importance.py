"""How the daemon combines pins and importance sources per app (`daemon.server.importance`),
against a reference written as the docs state the order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from npumanager.apps.identity import AppIdentity
from npumanager.apps.registry import AppRegistry
from npumanager.daemon.server.importance import (
    NO_SOURCE,
    PINNED_APP,
    PINNED_UID,
    AppImportance,
)
from npumanager.schemas.limits import UNKNOWN_UID_PRIORITY

SOURCES = ("desktop", "rules")


class Silent:
    """A source with no opinion of its own: the test tells the daemon its opinions."""

    def start(self, changed: object) -> None:
        pass

    def importance(self, app: object) -> None:
        return None

    def close(self) -> None:
        pass


APP_IDS = ("cam", "mail", "indexer")
UIDS = (1000, 1001)

importances = st.one_of(st.none(), st.sampled_from([100, 200, 300, 400]))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("app"), st.sampled_from(APP_IDS), importances),
        st.tuples(st.just("uid"), st.sampled_from(UIDS), importances),
        st.tuples(st.sampled_from(SOURCES), st.sampled_from(APP_IDS), importances),
    ),
    max_size=30,
)


@given(steps)
def test_pins_then_sources_in_order_then_nobody(
    script: list[tuple[str, object, int | None]],
) -> None:
    registry = AppRegistry()
    applied: dict[int, int] = {}
    combined = AppImportance(registry, applied.__setitem__, [(s, Silent()) for s in SOURCES])
    apps = [
        registry.app_for(uid, AppIdentity(a, "desktop-app", None, f"/{a}"))
        for uid in UIDS
        for a in APP_IDS
    ]
    app_pins: dict[object, int] = {}
    uid_pins: dict[object, int] = {}
    opinions: dict[str, dict[object, int]] = {s: {} for s in SOURCES}
    for kind, target, value in script:
        table = app_pins if kind == "app" else uid_pins if kind == "uid" else opinions[kind]
        if value is None:
            table.pop(target, None)
        else:
            table[target] = value
        if kind == "app":
            combined.pin_app(str(target), value)
        elif kind == "uid":
            combined.pin_uid(int(str(target)), value)
        else:
            combined.opinion(kind, str(target), value)
    for app in apps:
        if app.app_id in app_pins:
            expected = (app_pins[app.app_id], PINNED_APP)
        elif app.uid in uid_pins:
            expected = (uid_pins[app.uid], PINNED_UID)
        else:
            expected = next(
                ((opinions[s][app.app_id], s) for s in SOURCES if app.app_id in opinions[s]),
                (UNKNOWN_UID_PRIORITY, NO_SOURCE),
            )
        assert combined.effective(app) == expected
        assert applied.get(app.hal_uid, UNKNOWN_UID_PRIORITY) == expected[0]


def test_a_bad_importance_is_refused_and_nothing_is_pinned() -> None:
    import pytest

    from npumanager.errors import IllegalArgumentError

    registry = AppRegistry()
    applied: dict[int, int] = {}
    combined = AppImportance(registry, applied.__setitem__)
    app = registry.app_for(1000, AppIdentity("cam", "desktop-app", None, "/cam"))
    with pytest.raises(IllegalArgumentError, match="importance"):
        combined.pin_app("cam", 5000)
    with pytest.raises(IllegalArgumentError, match="importance"):
        combined.pin_uid(1000, -1)
    assert combined.effective(app) == (UNKNOWN_UID_PRIORITY, NO_SOURCE)
    assert applied == {}
