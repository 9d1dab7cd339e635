"""Issue 18's documentation items: the driver guide names the whole contract, and the
daemon examples of the README and the site declare the NPU feature (without it the daemon
logs a warning)."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from npumanager.core.driver import contract as driver

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
SECTION = GUIDE.split("## Writing a vendor driver", 1)[1].split("\n## ", 1)[0]


def members(protocol: type) -> list[str]:
    """The members a class must have to satisfy `protocol`."""
    return sorted(typing._get_protocol_attrs(protocol))  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "protocol", [driver.Driver, driver.VirtualClock, driver.RealClock, driver.ThermalModel]
)
def test_the_driver_guide_names_every_member_of_the_contract(protocol: type) -> None:
    assert members(protocol), protocol
    missing = [m for m in members(protocol) if not re.search(rf"`{m}[`(]", SECTION)]
    assert missing == [], f"CONTRIBUTING's driver guide does not name {missing}"


def test_every_connect_in_the_readme_and_the_site_declares_the_feature() -> None:
    pages = [
        README,
        *(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").rglob("*.md"))),
    ]
    calls = re.findall(r"npu\.connect\(([^)]*)\)", "\n".join(pages))
    assert calls, "the app developers' guide shows npu.connect"
    assert [call for call in calls if "uses_feature=True" not in call] == []
