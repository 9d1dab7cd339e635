"""The conformance suite for vendor drivers (our `VtsHalNpuSchedulingTargetTest`).

A driver package runs it on itself with a few lines::

    from npumanager.testing import DriverSuite

    class TestAcmeDriver(DriverSuite):
        __test__ = True          # the base sets False so pytest never collects it alone
        driver_name = "acme"     # the name the driver registers under

or, without a test file, ``npu-manager vts --driver acme``.

What a subclass may set or override:

- ``driver_name``: the registered driver; the default fixtures read its `DriverRecord`.
- ``driver_options``: keyword arguments passed to the factory on every call.
- fixture ``driver_factory``: a callable ``factory(devices=...)`` returning a fresh driver
  (the suite closes it). The suite calls it with no argument for the default device, or
  with ``devices=N`` / ``devices=[DeviceSpec, ...]`` when a test needs a given geometry.
- fixture ``driver_capabilities``: the `DriverCapability` values the driver claims
  (default: its registered record's). Tests of a capability not claimed are skipped with
  ``driver does not claim <capability>``, never passed.
- ``thread_safe``: True if ``submit`` may be called from several threads at once.
- ``real_time_timeout_s``: how long a real-time wait may take before the test fails.

The driver interface the suite uses (what `SimulatedDriver` offers):

- the scheduling HAL of `DriverBase`: ``set_scheduling_configs``,
  ``update_scheduling_configs``, ``scheduling_configs``, ``set_callback(cb,
  debounce_duration_ms=50)``, ``debounce_duration_ms``;
- ``load_model(device, *, weight_bytes, sram_bytes=0) -> handle`` (a load that does not
  fit raises `CapacityError` and changes nothing), ``submit(model, *, uid, cost_cycles,
  job_priority=0, original_uid=None) -> work id``, ``cancel(work_id)`` (an id that is not
  live is a `LookupError`);
- ``describe_devices()``, ``device_state(n)`` (a `DeviceStatus`), ``take_events()``
  (raw `WorkEvent`s held while no callback is registered), ``close()``;
- time: with ``virtual_time`` claimed, ``advance(us)`` and ``run_until_idle()``; without
  it, ``run_until_idle(max_us)`` waits (at most ``max_us`` of wall time) until idle, the
  suite sleeps instead of advancing, polls ``device_state(n).queue_depth`` and
  ``.running`` (work ids, -1 for a free channel) for idleness, and asserts nothing about
  timing;
- ``add_heat(device, millicelsius)`` if ``thermal_model`` is claimed.

Every assertion message starts with the name of the HAL rule it checks, so a driver that
breaks a rule fails with a message that names it.
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
