"""`helpers.checkout_access`: whether another uid can enter a folder is tried as that uid,
and a test that needs it is skipped in one line saying why and how to run it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import checkout_access
from helpers.checkout_access import needs_checkout_other_uids_can_enter, refusal

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="trying another uid needs root")

UID = 54_322
"""A uid with no passwd entry, owning nothing."""


@pytest.fixture
def top() -> Iterator[Path]:
    """A fresh folder in /tmp that every uid may enter (tmp_path is root's own)."""
    folder = Path(tempfile.mkdtemp(prefix="npu-checkout-access-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def checkout_in(parent: Path, mode: int) -> Path:
    """A checkout-like folder (mode 755) in a folder of `mode` below `parent`."""
    folder = parent / f"mode-{mode:o}"
    (folder / "checkout").mkdir(parents=True)
    (folder / "checkout").chmod(0o755)
    folder.chmod(mode)
    return folder / "checkout"


def test_a_folder_on_the_path_without_x_for_others_refuses_them(top: Path) -> None:
    checkout = checkout_in(top, 0o700)
    assert refusal(checkout, UID) == (
        f"{checkout} cannot be entered by uid {UID} ({checkout.parent} has no x for others)"
    )


def test_search_without_read_on_the_path_lets_them_in(top: Path) -> None:
    assert refusal(checkout_in(top, 0o711), UID) is None
    assert refusal(checkout_in(top, 0o755), UID) is None


def test_the_checkout_itself_needs_read_for_others(top: Path) -> None:
    checkout = checkout_in(top, 0o755)
    checkout.chmod(0o711)
    assert refusal(checkout, UID) == (
        f"{checkout} cannot be entered by uid {UID} ({checkout} has no r for others)"
    )


def test_a_test_in_a_checkout_others_cannot_enter_is_skipped_saying_how_to_run_it(
    top: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = checkout_in(top, 0o700)
    monkeypatch.setattr(checkout_access, "ROOT", checkout)
    monkeypatch.setattr(checkout_access, "PACKAGES", top)
    with pytest.raises(pytest.skip.Exception) as skipped:
        needs_checkout_other_uids_can_enter(UID)
    assert str(skipped.value) == (
        f"the checkout at {checkout} cannot be entered by uid {UID} ({checkout.parent} has no "
        "x for others): clone it, with its virtualenv, where other uids can read it (e.g. "
        "under /srv, or in /tmp with mode 755) to run this test"
    )
    monkeypatch.setattr(checkout_access, "ROOT", checkout_in(top, 0o755))
    needs_checkout_other_uids_can_enter(UID)  # no skip: it may be entered
    monkeypatch.setattr(checkout_access, "PACKAGES", checkout)
    with pytest.raises(pytest.skip.Exception, match="^the virtualenv's packages at "):
        needs_checkout_other_uids_can_enter(UID)
