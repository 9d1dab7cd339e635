"""Delivering the suite: the pytest plugin, `npu-manager vts`, and drivers that break rules."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from npumanager.cli.program import main
from npumanager.testing.rules import RULES
from npumanager.testing.runner import FAIL, PASS, SKIP, parse_junit, run_suite


def test_importing_the_plugin_loads_no_driver() -> None:
    code = textwrap.dedent(
        """
        import sys
        import npumanager.testing.plugin
        import npumanager.testing
        heavy = [m for m in ("_cffi_backend", "npumanager.vendor_drivers.vnpu",
                             "npumanager.testing.suite", "hypothesis") if m in sys.modules]
        assert not heavy, heavy
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", ["reference", "vnpu"])
def test_vts_prints_a_table_and_exits_0(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vts", "--driver", name]) == 0
    out = capsys.readouterr().out
    assert "test_RunInferencesPrioritized" in out
    skips = sum(r.capability == "restart_preemption" for r in RULES)  # real drivers' only
    assert f"driver {name}: {len(RULES) - skips} pass, 0 fail, {skips} skip" in out


def test_the_state_machine_catches_a_driver_that_differs_from_the_reference() -> None:
    from npumanager.testing.stateful import check_against_reference
    from npumanager.vendor_drivers.reference import ReferenceDriver
    from npumanager.vendor_drivers.reference.engine import ReferenceEngine

    class AllowsEveryone(ReferenceEngine):
        def _permitted(self, uid: int, original_uid: int) -> bool:
            return True

    class Broken(ReferenceDriver):
        def _make_engine(self) -> ReferenceEngine:
            return AllowsEveryone(self.specs, self.max_live_work, self.max_models)

    with pytest.raises(AssertionError, match="MatchesReferenceDevice: after .* the driver's"):
        check_against_reference(Broken, max_examples=300)


def test_vts_unknown_driver_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vts", "--driver", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("npu-manager: error: unknown driver 'nope'; available: ")
    assert "reference" in err
    assert "vnpu" in err


def test_vts_builds_every_driver_with_the_options_given(capsys: pytest.CaptureFixture[str]) -> None:
    """Room for one model only: the rules that load two fail, so each driver had it."""
    assert main(["vts", "--driver", "vnpu", "--driver-option", "max_models=1", "--json"]) == 1
    results = {r["test"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert results["test_SetSchedulingConfigs"]["result"] == PASS
    full = [name for name, r in results.items() if "holds 1 models already" in r["detail"]]
    assert len(full) > 5, "max_models=1 reached no driver"


def test_vts_with_an_option_the_driver_lacks_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["vts", "--driver", "vnpu", "--driver-option", "bogus=1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "npu-manager: error: driver 'vnpu' has no option 'bogus'; its options: "
        "max_live_work (int), max_models (int), event_capacity (int)\n"
    )


BROKEN = textwrap.dedent(
    """
    import pytest
    from npumanager.testing import DriverSuite
    from npumanager.vendor_drivers.reference import CAPABILITIES, ReferenceDriver
    from npumanager.vendor_drivers.reference.engine import ReferenceEngine


    class NeverPreempts(ReferenceEngine):
        def _marked(self, dev):
            return []  # the running job keeps its channel: lower priority finishes first


    class AllowsEveryone(ReferenceEngine):
        def _permitted(self, uid, original_uid):
            return True  # drops the FAILED of a uid without direct access


    def driver_on(engine):
        class Broken(ReferenceDriver):
            def _make_engine(self):
                return engine(self.specs, self.max_live_work, self.max_models)
        return Broken


    class TestNeverPreempts(DriverSuite):
        __test__ = True

        @pytest.fixture
        def driver_factory(self):
            return driver_on(NeverPreempts)

        @pytest.fixture
        def driver_capabilities(self):
            return CAPABILITIES

        def test_MatchesReferenceDevice(self):
            pytest.skip("not on broken drivers: shrinking would take long")


    class TestAllowsEveryone(TestNeverPreempts):
        @pytest.fixture
        def driver_factory(self):
            return driver_on(AllowsEveryone)
    """
)


def test_a_driver_that_breaks_a_rule_fails_naming_it() -> None:
    results, output = run_suite(BROKEN)
    failed = {r.name: r.detail for r in results if r.outcome == FAIL}
    assert set(failed) == {
        "test_RunInferencesPrioritized",
        "test_PausedResumedPairing",
        "test_FifoAfterPause",
        "test_PausesLeastImportant",
        "test_RunInferenceFailsWithoutDirectAccess",
        "test_RunInferenceFailsWithoutAttributeOtherUid",
    }, output
    assert (
        "RunInferencesPrioritized: the priority-250 job" in failed["test_RunInferencesPrioritized"]
    )
    assert (
        "RunInferenceFailsWithoutDirectAccess:"
        in failed["test_RunInferenceFailsWithoutDirectAccess"]
    )
    assert "PausedResumed:" in failed["test_PausedResumedPairing"]
    skipped = {r.detail for r in results if r.outcome == SKIP}
    assert skipped == {
        "not on broken drivers: shrinking would take long",
        "driver does not claim restart_preemption",
    }
    assert sum(r.outcome == PASS for r in results) > 20


def test_junit_parsing_keeps_reasons() -> None:
    xml = """<testsuites><testsuite>
      <testcase name="a"/>
      <testcase name="b"><skipped message="driver does not claim preemption"/></testcase>
      <testcase name="c"><failure message="AssertionError: Rule: broken&#10;more"/></testcase>
    </testsuite></testsuites>"""
    assert [(r.name, r.outcome, r.detail) for r in parse_junit(xml)] == [
        ("a", PASS, ""),
        ("b", SKIP, "driver does not claim preemption"),
        ("c", FAIL, "AssertionError: Rule: broken"),
    ]


def test_the_plugin_is_registered_through_its_entry_point(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.has_plugin("npumanager")


def test_npu_driver_option_names_the_driver() -> None:
    source = textwrap.dedent(
        """
        from npumanager.testing import DriverSuite

        class TestAnyDriver(DriverSuite):
            __test__ = True
        """
    )
    results, output = run_suite(
        source, pytest_args=("--npu-driver", "vnpu", "-k", "SetSchedulingConfigs")
    )
    assert [r.outcome for r in results] == [PASS] * 3, output


def test_vts_list_prints_the_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vts", "--list"]) == 0
    out = capsys.readouterr().out
    for rule in RULES:
        assert rule.test in out and rule.rule in out


def test_the_rules_table_names_every_test_of_the_suite_and_contributing_shows_it() -> None:
    from pathlib import Path

    from npumanager.testing.suite import DriverSuite

    tests = {name for name in dir(DriverSuite) if name.startswith("test_")}
    assert tests == {r.test for r in RULES}
    contributing = (Path(__file__).resolve().parents[1] / "CONTRIBUTING.md").read_text()
    for rule in RULES:
        assert f"| {rule.rule} | `{rule.test}` | {rule.capability} | {rule.must} |" in contributing


def test_the_state_machine_reaches_every_feature_from_its_fixed_seed() -> None:
    from npumanager.testing.stateful import FEATURES, check_against_reference
    from npumanager.vendor_drivers.reference import ReferenceDriver

    reached = check_against_reference(ReferenceDriver)
    print("fraction of examples reaching each:", reached)
    assert set(reached) == set(FEATURES)
    assert all(fraction >= 0.2 for fraction in reached.values()), reached
    assert check_against_reference(ReferenceDriver) == reached, "the same seed, the same run"


def test_the_seed_is_an_option_and_pytest_addopts_is_respected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_ADDOPTS", "--npu-seed 7")
    results, output = run_suite(
        "from npumanager.testing import DriverSuite\n\n"
        "class TestSeeded(DriverSuite):\n    __test__ = True\n    driver_name = 'reference'\n",
        pytest_args=("-k", "MatchesReferenceDevice or MemoryAccounting"),
    )
    assert [r.outcome for r in results] == [PASS, PASS], output


def test_every_message_of_a_test_starts_with_its_rule() -> None:
    import inspect
    import re

    from npumanager.testing.suite import DriverSuite

    for rule in RULES:
        source = inspect.getsource(getattr(DriverSuite, rule.test))
        prefixes = set(re.findall(r'f?"([A-Z][A-Za-z0-9]+): ', source))
        assert prefixes <= {rule.rule}, (rule.test, prefixes)


def test_a_driver_that_raises_fails_the_test_naming_its_rule() -> None:
    source = textwrap.dedent(
        """
        import pytest
        from npumanager.testing import DriverSuite
        from npumanager.vendor_drivers.reference import CAPABILITIES, ReferenceDriver


        class CancelRaises(ReferenceDriver):
            def cancel(self, work_id):
                raise RuntimeError("firmware timeout")


        class TestCancelRaises(DriverSuite):
            __test__ = True

            @pytest.fixture
            def driver_factory(self):
                return CancelRaises

            @pytest.fixture
            def driver_capabilities(self):
                return CAPABILITIES
        """
    )
    results, output = run_suite(source, pytest_args=("-k", "CancelSemantics"))
    assert [(r.outcome, r.detail) for r in results] == [
        (
            FAIL,
            "AssertionError: Cancel: expected the driver to raise nothing here; observed "
            "RuntimeError: firmware timeout",
        )
    ], output


def test_the_suites_pytest_may_cache_what_it_compiles() -> None:
    """vts leaves the bytecode setting as it finds it: forcing `PYTHONDONTWRITEBYTECODE` on
    its pytest made every run rewrite the asserts of about 180 modules again (1.2 s)."""
    source = "import sys\n\n\ndef test_bytecode():\n    assert not sys.dont_write_bytecode\n"
    results, output = run_suite(source)
    assert [(r.name, r.outcome) for r in results] == [("test_bytecode", PASS)], output
