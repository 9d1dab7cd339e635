"""Run the conformance suite on an installed driver, in a subprocess, and read the results.

`npu-manager vts` uses this: it writes a three-line test module for the driver into a
temporary folder, runs pytest on it with a JUnit XML report, and returns one `TestResult`
per test.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from npumanager.errors import NpuManagerError

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
SUITE_NEEDS = ("pytest", "hypothesis")
"""What the suite runs with; the `test` extra installs them."""
TEST_EXTRA_HINT = "pip install 'npu-manager[test]'"


class MissingTestExtraError(NpuManagerError):
    """The conformance suite needs pytest and hypothesis, which the `test` extra installs."""


def check_suite_runnable() -> None:
    """Raise `MissingTestExtraError` (one line naming the extra) unless this Python can
    import what the suite runs with: a missing package is not a failure of the driver."""
    for package in SUITE_NEEDS:
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise MissingTestExtraError(
                f"vts runs the conformance suite with {package}, which is not installed: "
                f"{TEST_EXTRA_HINT}"
            )


@dataclass(frozen=True)
class TestResult:
    """One test of the suite: its name, PASS/FAIL/SKIP, and why (the first line)."""

    __test__ = False  # not a pytest test class

    name: str
    outcome: str
    detail: str = ""


def module_for(driver_name: str) -> str:
    """The test module that runs the suite on the driver registered as `driver_name`."""
    return textwrap.dedent(
        f"""\
        from npumanager.testing import DriverSuite


        class TestDriver(DriverSuite):
            __test__ = True
            driver_name = {driver_name!r}
        """
    )


def run_suite(
    module_source: str, *, pytest_args: tuple[str, ...] = (), timeout_s: float = 600
) -> tuple[list[TestResult], str]:
    """Run pytest on `module_source`; the results and pytest's own output
    (`MissingTestExtraError` first if pytest or hypothesis is not installed)."""
    check_suite_runnable()
    with tempfile.TemporaryDirectory(prefix="npu-vts-") as folder:
        root = Path(folder)
        (root / "test_vts.py").write_text(module_source)
        report = root / "report.xml"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--rootdir",
                str(root),
                "-c",
                os.devnull,
                f"--junitxml={report}",
                "-o",
                "junit_family=xunit2",
                *pytest_args,
                str(root / "test_vts.py"),
            ],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        output = proc.stdout + proc.stderr
        if not report.exists():
            return [TestResult("(collection)", FAIL, output.strip().splitlines()[-1:][0])], output
        return parse_junit(report.read_text()), output


def _first_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0] if lines else ""


def parse_junit(xml_text: str) -> list[TestResult]:
    """The results in a pytest JUnit XML report, in run order."""
    results = []
    for case in ET.fromstring(xml_text).iter("testcase"):
        name = case.get("name", "?")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            message = failure.get("message") or failure.text
            results.append(TestResult(name, FAIL, _first_line(message)))
        elif skipped is not None:
            message = skipped.get("message") or ""
            results.append(TestResult(name, SKIP, _first_line(message)))
        else:
            results.append(TestResult(name, PASS))
    return results
