"""How pins and importance sources combine (`core.plugins.importance_combine`), against a
reference written as its docstring states the order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npumanager.core.plugins.importance_combine import (
    PINNED_APP,
    PINNED_UID,
    ImportanceCombiner,
    combine,
    importance_label,
)
from npumanager.errors import IllegalArgumentError
from npumanager.schemas import Importance
from npumanager.schemas.limits import MAX_PRIORITY

SOURCES = ("rules", "desktop", "slices")
APP_IDS = ("cam", "mail", "indexer")
UIDS = (1000, 1001)

values = st.one_of(st.none(), st.sampled_from(list(Importance)), st.integers(0, MAX_PRIORITY))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("app"), st.sampled_from(APP_IDS), values),
        st.tuples(st.just("uid"), st.sampled_from(UIDS), values),
        st.tuples(st.sampled_from(SOURCES), st.sampled_from(APP_IDS), values),
    ),
    max_size=40,
)


@given(steps)
def test_pin_of_the_app_then_of_the_uid_then_sources_in_order(
    script: list[tuple[str, object, int | None]],
) -> None:
    combiner = ImportanceCombiner(SOURCES)
    tables: dict[str, dict[object, int]] = {k: {} for k in ("app", "uid", *SOURCES)}
    for kind, target, value in script:
        if value is None:
            tables[kind].pop(target, None)
        else:
            tables[kind][target] = value
        if kind == "app":
            combiner.pin_app(str(target), value)
        elif kind == "uid":
            assert isinstance(target, int)
            combiner.pin_uid(target, value)
        else:
            combiner.opinion(kind, str(target), value)
    for app_id in APP_IDS:
        for uid in UIDS:
            expected: tuple[int, str] | None
            if app_id in tables["app"]:
                expected = (tables["app"][app_id], PINNED_APP)
            elif uid in tables["uid"]:
                expected = (tables["uid"][uid], PINNED_UID)
            else:
                expected = next(
                    ((tables[s][app_id], s) for s in SOURCES if app_id in tables[s]), None
                )
            assert combiner.effective(app_id, uid) == expected
    assert combiner.app_pins() == tables["app"]
    assert combiner.uid_pins() == tables["uid"]


@given(st.lists(st.tuples(st.sampled_from(SOURCES), values), max_size=6), values, values)
def test_combine_is_the_first_value_in_that_order(
    opinions: list[tuple[str, int | None]], app_pin: int | None, uid_pin: int | None
) -> None:
    ordered = [(PINNED_APP, app_pin), (PINNED_UID, uid_pin), *opinions]
    expected = next(((v, name) for name, v in ordered if v is not None), None)
    assert combine(opinions, app_pin=app_pin, uid_pin=uid_pin) == expected


def test_an_earlier_source_wins_only_where_it_has_an_opinion() -> None:
    combiner = ImportanceCombiner(["rules", "desktop"])
    combiner.opinion("desktop", "cam", Importance.CACHED)
    assert combiner.effective("cam", 1000) == (Importance.CACHED, "desktop")
    assert combiner.opinion("rules", "cam", Importance.FOREGROUND)
    assert not combiner.opinion("rules", "cam", Importance.FOREGROUND)
    assert combiner.effective("cam", 1000) == (Importance.FOREGROUND, "rules")
    combiner.pin_uid(1000, 250)
    assert combiner.effective("cam", 1000) == (250, PINNED_UID)
    combiner.pin_app("cam", Importance.SERVICE)
    assert combiner.effective("cam", 1000) == (Importance.SERVICE, PINNED_APP)
    assert combiner.effective("mail", 1001) is None


def test_bad_pins_sources_and_names_are_refused_in_one_line() -> None:
    combiner = ImportanceCombiner(["desktop"])
    for bad in (-1, MAX_PRIORITY + 1, "100", True):
        with pytest.raises(IllegalArgumentError, match="importance") as caught:
            combiner.pin_app("cam", bad)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value)
    assert combiner.app_pins() == {}
    with pytest.raises(IllegalArgumentError, match="unknown importance source 'slices'"):
        combiner.opinion("slices", "cam", Importance.CACHED)
    with pytest.raises(IllegalArgumentError, match="'desktop' given twice"):
        ImportanceCombiner(["desktop", "rules", "desktop"])
    with pytest.raises(IllegalArgumentError, match="not a name a source may have"):
        ImportanceCombiner([PINNED_APP])


def test_labels_name_the_platforms_importances_and_show_other_numbers() -> None:
    assert importance_label(Importance.CACHED) == "CACHED"
    assert importance_label(400) == "CACHED"
    assert importance_label(250) == "250"
