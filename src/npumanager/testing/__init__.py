"""The conformance suite for vendor drivers (our ``VtsHalNpuSchedulingTargetTest``).

A driver package runs it on itself with a few lines::

    from npumanager.testing import DriverSuite

    class TestAcmeDriver(DriverSuite):
        __test__ = True          # the base sets False so pytest never collects it alone
        driver_name = "acme"     # the name the driver registers under

or, without a test file, ``npu-manager vts --driver acme``.

What a subclass may set or override:

- ``driver_name``: the registered driver; the default fixtures read its `~npumanager.DriverRecord`.
- ``driver_options``: keyword arguments passed to the factory on every call.
- fixture ``driver_factory``: a callable ``factory(devices=...)`` returning a fresh driver
  (the suite closes it). The suite calls it with no argument for the default device, or
  with ``devices=N`` / ``devices=[DeviceSpec, ...]`` when a test needs a given geometry.
- fixture ``driver_capabilities``: the `~npumanager.DriverCapability` values the driver claims
  (default: its registered record's). Tests of a capability not claimed are skipped with
  ``driver does not claim <capability>``, never passed.
- ``thread_safe``: True if ``submit`` may be called from several threads at once.
- ``real_time_timeout_s``: how long a real-time wait may take before the test fails (120 s:
  only a hang outlasts it, however busy the machine).
- ``real_time_tries``: how often a real-time rule whose setup needs submissions within
  milliseconds of one another tries again when a busy machine spoiled that (5).

The driver interface the suite uses is the `~npumanager.Driver` protocol of
``npumanager.core.driver.contract`` (exported as `npumanager.Driver`), where every member is
documented: the scheduling HAL (``set_scheduling_configs``, ``update_scheduling_configs``,
``scheduling_configs``, ``set_callback``, ``debounce_duration_ms``), the devices
(``device_count``, ``describe_devices``, ``device_state``), ``now_us``, models
(``load_model``, ``unload_model``), work (``submit``, ``cancel``), events (``pump``,
``take_events``), ``run_until_idle`` and ``close``. A capability claimed brings its own
small protocol: ``virtual_time`` is `~npumanager.VirtualClock` (``advance``, ``idle``),
``thermal_model`` is `~npumanager.ThermalModel` (``add_heat``), ``real_time`` may add
`~npumanager.RealClock` (``fileno``). Without ``virtual_time`` the suite sleeps instead of
advancing, polls ``device_state(n)`` for idleness and asserts nothing about timing.

Every assertion message starts with the name of the HAL rule it checks and says what was
expected and what was observed; `npumanager.testing.rules.RULES` lists the rules, their tests
and the capability each needs (``npu-manager vts --list``). The suite's random choices (the
reference-matching state machine, the memory sequence) come from a fixed seed: pass
``--npu-seed N`` to pytest (or in ``PYTEST_ADDOPTS``), or ``npu-manager vts --seed N``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["DriverSuite"]

if TYPE_CHECKING:
    from npumanager.testing.suite import DriverSuite


def __getattr__(name: str) -> Any:
    if name == "DriverSuite":
        from npumanager.testing.suite import DriverSuite

        return DriverSuite
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
