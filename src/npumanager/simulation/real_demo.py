"""`npu-manager demo --real`: the demo scenario's apps as real models, on the wall clock,
through a real driver (`onnxruntime`, `openvino`) on this machine's device.

Every app of the scenario (the shipped demo: camera, assistant, background LLM, indexer)
runs the model built in code with inputs sized so that one inference takes its `cost_us`
here, and does its work (`real_apps`). Start times and timed importance changes are
scaled to the run's `seconds`; periods, deadlines and costs are real. With `min_jobs`, an
app's time is not up before it has finished that many inferences: on a busy machine, where
background work runs under `SCHED_IDLE` and crawls, a run then ends on that event rather
than on the wall clock alone. *Direct*: each app opens a driver of its own (its own runtime
session, threads at the process's priority, nobody arbitrating), as before npu-manager.
*Managed*: all go through one `Service` with the scenario's policy, importances and model
priorities; an app asked for its model back gives it back and asks again after
`retry_ms`. Heat and memory-pressure events have nothing real to act on and are left out,
and so are the memory and thermal rows: the keys are the simulated demo's where they apply.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any

from npumanager.core.driver.contract import TimedWork
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.core.driver.job import Job
from npumanager.core.plugins.registry import PluginRegistry
from npumanager.core.service.service import Service
from npumanager.errors import NpuManagerError, UnknownPluginError
from npumanager.schemas import EndReason, ModelLoadRequest, ModelSize
from npumanager.schemas.limits import MAX_REAL_DEMO_COST_US, REAL_DEMO_OVERTIME_S
from npumanager.simulation.real_apps import WAIT_S, AppScore, Runner, play
from npumanager.simulation.scenario import App, Scenario

REAL_DRIVERS = ("openvino", "onnxruntime")
"""The real drivers `demo --real` picks from, in order, when none is named."""
_REAL_NAMES = " or ".join(REAL_DRIVERS)


class Plan:
    """What both runs share: the model, each app's inputs, when things happen."""

    def __init__(
        self,
        registry: PluginRegistry,
        driver: str,
        scenario: Scenario,
        seconds: float,
        *,
        min_jobs: int = 0,
    ):
        for index, app in enumerate(scenario.apps):
            if app.work.cost_us > MAX_REAL_DEMO_COST_US:
                raise NpuManagerError(
                    f"apps.{index}.work.cost_us: {app.work.cost_us} us is longer than demo "
                    f"--real runs one inference (at most {MAX_REAL_DEMO_COST_US} us)"
                )
        self.driver, self.scenario, self.seconds = driver, scenario, seconds
        self.min_jobs = min_jobs
        """Inferences each app finishes before its time is up, however long they take."""
        self.scale = seconds * 1000 / scenario.duration_ms
        """Wall seconds per scenario second, for start times and events."""
        self.factory = registry.driver(driver).factory
        probe: Any = self.factory()
        close, model_bytes = probe.close, getattr(probe, "model_bytes", None)
        try:
            if not isinstance(probe, TimedWork) or model_bytes is None:
                raise NpuManagerError(
                    f"driver {driver!r} runs no real models; demo --real runs on {_REAL_NAMES}"
                )
            timed = probe.load_timed_model()
            self.model = probe.timed_model()
            self.weight_bytes: int = model_bytes(timed)
            """The real model's weights: what each managed app declares it needs."""
            self.inputs = {
                app.name: probe.timed_inputs(timed, app.work.cost_us / 1000)
                for app in scenario.apps
            }
        finally:
            close()

    def at(self, scenario_ms: int) -> float:
        """Seconds into the run of a scenario time."""
        return scenario_ms / 1000 * self.scale

    def until(self, app: App) -> float:
        """Seconds into the run at which the app gives up its model."""
        return self.seconds if app.stop_ms is None else min(self.seconds, self.at(app.stop_ms))

    def time_up(self, score: AppScore, end: float) -> float:
        """When an app whose time ends at `end` (a `perf_counter` time) stops: then, or,
        while it has finished fewer than `min_jobs` inferences, `REAL_DEMO_OVERTIME_S` later
        (only a hang outlasts that)."""
        return end if score.done >= self.min_jobs else end + REAL_DEMO_OVERTIME_S


def _request(index: int, app: App) -> ModelLoadRequest:
    # The real model is a few MiB whatever the scenario's model_bytes: the app asks for
    # the smallest size class and declares the real bytes (`Plan.weight_bytes`).
    builder = ModelLoadRequest.Builder(index).set_size(ModelSize.LESS_THAN_1GB)
    return builder.set_priority(app.priority).build()


def _app_thread(plan: Plan, app: App, t0: float, body: Any, score: AppScore) -> threading.Thread:
    """The app's thread: it starts at its time, runs `body(stop, end)` until its end (a
    `perf_counter` time), when `stop` is set (`Plan.time_up`: later, while it has finished
    fewer than `min_jobs` inferences)."""

    def life() -> None:
        stop, over, end = threading.Event(), threading.Event(), t0 + plan.until(app)
        if stop.wait(max(0.0, t0 + plan.at(app.start_ms) - time.perf_counter())):
            return
        score.start_s = time.perf_counter() - t0
        watch = threading.Thread(
            target=_stop_when_up, args=(plan, score, end, stop, over), daemon=True
        )
        watch.start()
        try:
            body(stop, end)
        except NpuManagerError as exc:
            score.error = str(exc)
        finally:
            over.set()

    return threading.Thread(target=life, name=f"app-{app.name}", daemon=True)


def _stop_when_up(
    plan: Plan, score: AppScore, end: float, stop: threading.Event, over: threading.Event
) -> None:
    """Set `stop` once the app's time is up (`Plan.time_up`, looked at every `WAIT_S` past
    `end`); nothing once its body is `over`."""
    if over.wait(max(0.0, end - time.perf_counter())):
        return
    while time.perf_counter() < plan.time_up(score, end):
        if over.wait(WAIT_S):
            return
    stop.set()


def run_direct(plan: Plan) -> dict[str, Any]:
    """Each app with its own driver and runtime session, nobody arbitrating."""
    factory = plan.factory
    scores = {app.name: AppScore() for app in plan.scenario.apps}
    drivers: list[tuple[App, Any]] = []
    with contextlib.ExitStack() as stack:
        bodies = []
        for app in plan.scenario.apps:
            channels = 1 if app.work.kind == "periodic" else app.work.burst
            driver: Any = factory(
                devices=[{"channels": channels}],
                reserved_channels=0,
                background_nice=0,
                restart_preemption=False,
            )
            stack.callback(driver.close)
            drivers.append((app, driver))
            handle = driver.load_model(0, model=plan.model)
            feeds = plan.inputs[app.name]
            runner = Runner(
                run=_bind(driver.run_inference, handle, app.uid, feeds),
                submit=_submitter(driver, handle, app.uid, feeds),
            )
            bodies.append((app, _worker(app, runner, scores[app.name])))
        t0 = time.perf_counter()  # once every app's model is loaded, as in the managed run
        _run([_app_thread(plan, app, t0, body, scores[app.name]) for app, body in bodies])
        for app, driver in drivers:
            count_events(driver.take_events(), {app.uid: scores[app.name]})
    return metrics(plan.scenario, scores, seconds=plan.seconds)


def run_managed(plan: Plan, registry: PluginRegistry) -> dict[str, Any]:
    """All the apps through one `Service` on one device of the real driver (its default
    channels, one of them left free of background work), under the scenario's policy."""
    scenario = plan.scenario
    scores = {app.name: AppScore() for app in scenario.apps}
    with Service(
        plan.driver, scenario.policy, policy_params=scenario.policy_params, registry=registry
    ) as svc:
        for app in scenario.apps:
            svc.set_uid_importance(app.uid, app.importance)
        by_uid = {app.uid: scores[app.name] for app in scenario.apps}
        svc.add_listener(lambda events: count_events(events, by_uid))
        t0 = time.perf_counter()
        threads = [
            _app_thread(plan, app, t0, _managed_body(svc, plan, i, app, score, t0), score)
            for i, (app, score) in enumerate(zip(scenario.apps, scores.values(), strict=True), 1)
        ]
        changes = threading.Thread(target=_importance_changes, args=(svc, plan, t0), daemon=True)
        _run([*threads, changes])
    return metrics(scenario, scores, seconds=plan.seconds)


def _managed_body(
    svc: Service, plan: Plan, index: int, app: App, score: AppScore, t0: float
) -> Any:
    """A managed app's life: ask for its model, work until the run ends or the service
    wants the model back, then give it back and (after `retry_ms`) ask again. When it
    asked, was granted and was asked to give back is noted in `score`."""

    def body(stop: threading.Event, end: float) -> None:
        manager = svc.manager(app.uid, uses_feature=True)
        while not stop.is_set():
            wait = max(0.001, plan.time_up(score, end) - time.perf_counter())
            if score.asked_s is None:
                score.asked_s = time.perf_counter() - t0
            try:  # only the grant times out: the work itself waits in steps (`real_apps`)
                with manager.reserve(
                    _request(index, app), timeout_s=wait, weight_bytes=plan.weight_bytes
                ) as lease:
                    score.granted_s.append(time.perf_counter() - t0)
                    model = lease.load_model(model=plan.model)
                    play(app, _runner(model, plan.inputs[app.name]), _until(stop, lease), score)
            except TimeoutError:
                score.error = score.error or "its model was not granted during the run"
                return
            if lease.unload_requested:
                reason = lease.unload_reason
                score.unloads.append(reason.name if reason is not None else "UNKNOWN")
                score.unloaded_s.append(time.perf_counter() - t0)
            stop.wait(app.retry_ms / 1000)

    return body


def _runner(model: Any, feeds: dict[str, Any]) -> Runner:
    return Runner(lambda: model.run(feeds), lambda: model.submit(feeds))


def _until(stop: threading.Event, lease: Any) -> threading.Event:
    """An event set when `stop` is or the service asks for the lease's model back
    (looked at every `WAIT_S`)."""
    done = threading.Event()

    def watch() -> None:
        while not stop.wait(WAIT_S) and not lease.unload_requested:
            pass
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    return done


def _importance_changes(svc: Service, plan: Plan, t0: float) -> None:
    """The scenario's importance events, at their scaled times (managed only: direct apps
    have nobody to tell)."""
    for event in sorted(plan.scenario.events, key=lambda e: e.at_ms):
        if event.kind != "importance" or event.app is None or event.importance is None:
            continue
        at = t0 + plan.at(event.at_ms)
        if at >= t0 + plan.seconds:
            return
        time.sleep(max(0.0, at - time.perf_counter()))
        svc.set_uid_importance(plan.scenario.app(event.app).uid, event.importance)


def _bind(method: Any, handle: int, uid: int, feeds: dict[str, Any]) -> Any:
    return lambda: method(handle, uid=uid, inputs=feeds)


def _submitter(driver: Any, handle: int, uid: int, feeds: dict[str, Any]) -> Any:
    job = Job(uid)
    return lambda: driver.submit_future(handle, job, feeds)


def _worker(app: App, runner: Runner, score: AppScore) -> Any:
    return lambda stop, end: play(app, runner, stop, score)


def _run(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def count_events(events: Sequence[WorkEvent], scores: dict[int, AppScore]) -> None:
    """Count, per uid, the starts of inferences the driver reported and the stops of running
    ones for more important work (an end PAUSED: restart preemption)."""
    for event in events:
        score = scores.get(event.uid)
        if score is None:
            continue
        if event.kind == EventKind.STARTED:
            score.started += 1
        elif event.kind == EventKind.ENDED and event.reason == EndReason.PAUSED:
            score.preempted += 1


def why_no_work(app: App, score: AppScore, ended: str) -> str:
    """Why an app finished no inference, from what its run recorded; `ended` says when its
    time was up (`the run ended at 4 s`)."""
    if score.asked_s is not None and not score.granted_s:
        return f"asked for its model at {score.asked_s:.2f} s and was not granted it before {ended}"
    if score.error is not None:
        granted = f"granted its model at {score.granted_s[0]:.2f} s; " if score.granted_s else ""
        return f"{granted}it stopped: {score.error}"
    began = score.granted_s[0] if score.granted_s else score.start_s
    if score.submitted == 0 or began is None:
        return f"it submitted no inference before {ended}"
    n = score.submitted
    said = f"{n} inference{'s' if n != 1 else ''} submitted from {began:.2f} s; "
    cost = f"about {app.work.cost_us / 1000:g} ms on an idle machine"
    if score.preempted:
        they, were, none = ("they", "were", "none") if n != 1 else ("it", "was", "it never")
        return said + (
            f"{they} started {score.started} times and {were} stopped {score.preempted} times "
            "to free a channel for more important work (restart preemption), so "
            f"{none} ran to its end ({cost})"
        )
    if score.unloaded_s and len(score.granted_s) <= len(score.unloaded_s):
        until = (
            f"it was asked for its model back at {score.unloaded_s[-1]:.2f} s ({score.unloads[-1]})"
        )
    else:
        until = f"{ended} (each takes {cost})"
    if score.started == 0:
        return said + f"none of them started before {until}"
    return said + f"{score.started} started and none finished before {until}"


def metrics(
    scenario: Scenario, scores: dict[str, AppScore], *, seconds: float | None = None
) -> dict[str, Any]:
    """The simulated demo's keys that apply to a real run, for the roles some app plays,
    and (`no_work`) why each app that finished no inference did not."""
    out: dict[str, Any] = {}
    by_role: dict[str, list[AppScore]] = {}
    for app in scenario.apps:
        by_role.setdefault(app.role, []).append(scores[app.name])
    if "camera" in by_role:
        cameras = by_role["camera"]
        latencies = sorted(v for s in cameras for v in s.latencies_ms)
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0.0
        out["camera_frames"] = sum(len(s.latencies_ms) for s in cameras)
        out["camera_deadline_misses"] = sum(s.misses for s in cameras)
        out["camera_p99_ms"] = round(p99, 2)
    for role in ("background", "assistant", "indexer"):
        if role in by_role:
            out[f"{role}_jobs_done"] = sum(s.done for s in by_role[role])
    reasons = [reason for score in scores.values() for reason in score.unloads]
    out["unload_requests"] = {reason: reasons.count(reason) for reason in sorted(set(reasons))}
    out["jobs_done"] = {app.name: scores[app.name].done for app in scenario.apps}
    stopped = {app.name: scores[app.name].error for app in scenario.apps}
    if any(stopped.values()):
        out["apps_stopped"] = {name: error for name, error in stopped.items() if error}
    idle = [app for app in scenario.apps if scores[app.name].done == 0]
    if idle:
        out["no_work"] = {
            app.name: why_no_work(app, scores[app.name], _ended(scenario, app, seconds))
            for app in idle
        }
    return out


def _ended(scenario: Scenario, app: App, seconds: float | None) -> str:
    """When the app's time was up: the run's end, or its own scaled `stop_ms` before it."""
    if seconds is None:
        return "the run ended"
    if app.stop_ms is not None and app.stop_ms < scenario.duration_ms:
        return f"it stopped at {app.stop_ms / scenario.duration_ms * seconds:.2f} s"
    return f"the run ended at {seconds:g} s"


def pick_driver(registry: PluginRegistry, asked: str | None) -> str:
    """The named driver, or the first real driver installed (a one-line error naming the
    extras when there is none)."""
    if asked is not None:
        registry.driver(asked)  # an unknown name is a one-line error listing the known ones
        return asked
    for name in REAL_DRIVERS:
        try:
            registry.driver(name)
        except LookupError:
            continue
        return name
    extras = " or ".join(f"pip install 'npu-manager[{name}]'" for name in REAL_DRIVERS)
    raise UnknownPluginError(
        f"demo --real needs a real driver ({_REAL_NAMES}) and none is installed here: {extras}"
    )
