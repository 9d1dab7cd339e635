"""Every hook npu-manager calls, with what it is given and what it must return.

A plugin implements any of these as plain functions marked with `npumanager.hookimpl`
and is found through the ``npumanager`` entry-point group. Registration hooks run once,
at discovery; nothing here is called per event, so the hot path never pays for pluggy.

Every hook is called per plugin, through pluggy's own caller on that plugin alone
(``PluginManager.subset_hook_caller``), so that a broken plugin is reported by its name
and the others still load. So, for every hook here: none is ``historic`` (a plugin
registered later is called when it registers), none is ``firstresult`` (every plugin's
answer counts), and wrappers (``hookimpl(wrapper=True)``) and ``tryfirst``/``trylast`` behave
as pluggy documents among the plugin's own implementations: a wrapper sees, and may
change or replace, what its plugin's other implementations returned or raised.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pluggy

from npumanager.schemas import (
    DriverRecord,
    HealthSourceRecord,
    ImportanceSourceRecord,
    PolicyRecord,
    SinkRecord,
)

if TYPE_CHECKING:
    from npumanager.core.plugins.config import Config

PROJECT_NAME = "npumanager"
"""The pluggy project name, the hook prefix and the entry-point group, all one name."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec(firstresult=False, historic=False)
def npumanager_register_drivers() -> Iterable[DriverRecord] | DriverRecord | None:
    """Return the vendor drivers this plugin provides.

    Each `~npumanager.DriverRecord` names the driver, lists the optional capabilities it claims
    (the conformance suite tests exactly those) and gives a factory that builds a driver
    object. Plain dicts with the same keys are accepted and validated.

    A record that fails validation, or whose name another plugin already took, is
    reported as a warning naming this plugin's distribution, and dropped.

    Per plugin, not historic, not firstresult; wrappers allowed (this holds for every
    registration hook below too).
    """


@hookspec(firstresult=False, historic=False)
def npumanager_register_policies() -> Iterable[PolicyRecord] | PolicyRecord | None:
    """Return the model-loading policies this plugin provides.

    A `~npumanager.PolicyRecord` may carry `~npumanager.PolicyRecord.params_model`, a pydantic
    model that validates the parameters given to `~npumanager.Service.set_policy`; the factory
    is called with the validated model.
    """


@hookspec(firstresult=False, historic=False)
def npumanager_register_sinks() -> Iterable[SinkRecord] | SinkRecord | None:
    """Return the telemetry sinks this plugin provides.

    A `~npumanager.SinkRecord`'s factory is called with the options given to
    ``Service.add_sink(name, **options)`` and returns the sink object, which must have:

    - ``handle(batch)``: a sequence of events in time order, each a `~npumanager.WorkEvent`,
      `~npumanager.ModelLoadRequested`, `~npumanager.ModelLoadStateChanged` or
      `~npumanager.DeviceSample` (light named tuples; dispatch on ``type(event)``). The batch
      is shared with other sinks: read it, never modify it. In real time it runs on the
      sink's own worker thread, so it may block; while it does, new batches past the
      registration's ``queue_size`` are dropped and counted. An exception is logged and
      counted as failed, nothing more.
    - optionally ``close()``: called once, after the last batch, when the sink is removed
      or the service closes.

    Debouncing (``debounce_duration_ms``) is the service's business, per registration;
    a sink sees work events already debounced.
    """


@hookspec(firstresult=False, historic=False)
def npumanager_register_health_sources() -> (
    Iterable[HealthSourceRecord] | HealthSourceRecord | None
):
    """Return the device-health sources this plugin provides.

    A `~npumanager.HealthSourceRecord`'s factory is called with the options of
    ``Service(health=...)``, ``serve --health NAME:KEY=VALUE,...`` or ``health --source ...``
    and returns the source, or raises `~npumanager.IllegalArgumentError` naming the options it
    allows. The source must have:

    - ``read()``: a `~npumanager.HealthSample` (or a dict of its shape, validated here) of what
      it can read now: memory pressure levels, thermal readings mapped to
      `~npumanager.ThermalSeverity`, device counters. A reading it cannot make is left out; it
      never raises for a missing sensor. It runs on the service's health thread only, never
      under the service lock.

    and may have:

    - ``interval_ms``: how often to call ``read()`` (default
      `~npumanager.schemas.limits.HEALTH_READ_INTERVAL_MS`);
    - ``descriptors()``: a mapping of file descriptors to poll masks (POLLPRI for a PSI
      trigger, POLLIN for a FIFO); when one is ready the thread calls ``ready(fd)`` and then
      ``read()`` at once (a descriptor that keeps reporting an error is polled no more);
    - ``close()``: called once when the service closes.

    The service combines every source with the driver's own readings, the most severe
    winning, and tells the arbiter when a device's severity or the memory level changes.
    """


@hookspec(firstresult=False, historic=False)
def npumanager_register_importance_sources(
    config: Config,
) -> Iterable[ImportanceSourceRecord] | ImportanceSourceRecord | None:
    """Return the importance sources this plugin provides: what ranks apps (on Linux, an app is
    its cgroup; see ``npumanager.apps.identity``) as the platform's activity manager ranks them.

    ``config`` is the effective configuration (an implementation may leave the argument
    out), so that a source can take defaults from the file: the built-in ``rules`` reads
    ``[importance.rules]``. An `~npumanager.ImportanceSourceRecord`'s factory is called with
    the source's options (``NAME:KEY=VALUE,...`` at the command line), validated against its
    ``options_model`` when it has one, and returns the source, or raises
    `~npumanager.IllegalArgumentError` naming the options it allows. The source
    (`~npumanager.core.plugins.importance.ImportanceSource`) has:

    - ``importance(app)``: its opinion of an app (an object with ``app_id``, ``cgroup`` and
      ``slice``, as `~npumanager.apps.identity.AppIdentity`), an `~npumanager.Importance`, or
      None for none. Cheap and thread-safe: it is asked when an app appears.
    - ``start(changed)``: begin; from then on, whenever its opinion of an app id changes on
      its own (focus moved, time passed), it calls ``changed(app_id, importance_or_None)``
      from a thread of its own (or, for what it knows at once, from ``start`` itself).
    - ``close()``: stop, and call ``changed`` no more.

    Sources are combined in the order they were given, the first with an opinion winning,
    below an administrator's pins (`~npumanager.core.plugins.importance_combine.combine`).
    """


@hookspec(firstresult=False, historic=False)
def npumanager_unavailable() -> Iterable[tuple[str, str, str]] | None:
    """Return what this plugin would register but cannot here, and why.

    Each item is ``(kind, name, reason)``, e.g. ``("driver", "onnxruntime", "pip install
    'npu-manager[onnxruntime]'")``. ``npu-manager plugins`` shows them, and asking for such a
    name is an error that gives the reason.
    """


@hookspec(firstresult=False, historic=False)
def npumanager_configure(config: Config) -> None:
    """Called once per plugin with the effective configuration, after its registrations.

    Use it to read the plugin's own settings. Raising here reports the plugin as broken
    and drops what it registered. Per plugin, not historic, not firstresult; a wrapper
    sees the plugin's own configure raise, and may let it.
    """
