"""`npu-manager demo --real`: the demo scenario's apps as real models on a real driver,
direct and managed, through the installed console script as a user runs it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from npumanager.cli.program import main
from npumanager.errors import UnknownModelError
from npumanager.simulation import real_apps
from npumanager.simulation.real_apps import AppScore, Runner, play
from npumanager.simulation.real_demo import metrics
from npumanager.simulation.scenario import load_scenario, parse_scenario, shipped_scenarios

pytest.importorskip("onnxruntime")

SIMULATED_KEYS = {
    "camera_frames",
    "camera_deadline_misses",
    "camera_p99_ms",
    "background_jobs_done",
    "assistant_jobs_done",
    "indexer_jobs_done",
    "unload_requests",
    "jobs_done",
}
"""The simulated demo's keys that apply to a real run (memory and heat do not)."""


def console(*argv: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it."""
    script = Path(sys.executable).with_name("npu-manager")
    return subprocess.run(
        [str(script), *argv], capture_output=True, text=True, env=dict(os.environ), check=False
    )


def real_runs(scenario: Path, seconds: str, *, min_jobs: int) -> dict[str, Any]:
    """Both runs of `demo --real --json` of a scenario file on onnxruntime."""
    result = console(
        "demo", "--real", "--driver", "onnxruntime", "--scenario", str(scenario), "--seconds",
        seconds, "--min-jobs", str(min_jobs), "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    runs: dict[str, Any] = json.loads(result.stdout)
    return runs


@pytest.fixture(scope="module")
def demo_json() -> dict[str, Any]:
    """One short real demo on onnxruntime, both runs, as JSON; no app's time is up before it
    has finished an inference (`--min-jobs 1`), however busy the machine: a background app
    runs under `SCHED_IDLE`, and beside programs that keep the cores busy it gets almost no
    CPU within a run's wall-clock seconds."""
    result = console(
        "demo", "--real", "--driver", "onnxruntime", "--seconds", "1.2", "--min-jobs", "1",
        "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    runs: dict[str, Any] = json.loads(result.stdout)
    return runs


def test_every_app_of_the_demo_runs_real_work_in_both_runs(demo_json: dict[str, Any]) -> None:
    apps = {app.name for app in load_scenario(shipped_scenarios()["demo"]).apps}
    assert set(demo_json) == {"direct", "managed"}
    for mode, run in demo_json.items():
        assert set(run) - {"no_work"} == SIMULATED_KEYS, mode
        assert set(run["jobs_done"]) == apps == {"camera", "assistant", "llm", "indexer"}
        assert run["camera_frames"] == run["jobs_done"]["camera"] >= 1
        # the scaled start times: the indexer starts at 40 ms, the assistant at 400 ms
        assert run["jobs_done"]["indexer"] >= 1, mode
        assert run["indexer_jobs_done"] == run["jobs_done"]["indexer"]
        assert run["assistant_jobs_done"] == run["jobs_done"]["assistant"]


def test_the_table_names_the_apps_the_driver_and_the_policy() -> None:
    result = console("demo", "--real", "--driver", "onnxruntime", "--seconds", "0.3")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # the assistant comes to the foreground at 2 s of the scenario's 6: at 0.10 s of 0.3
    assert "camera (foreground), assistant (cached; foreground at 0.10 s), llm (cached)" in out
    assert "real models on onnxruntime" in out and "'pressure' policy" in out
    for row in ("camera deadline misses", "assistant jobs done", "indexer jobs done"):
        assert row in out
    assert "DIRECT" in out and "MANAGED" in out


def test_a_scenario_file_is_played_for_real(tmp_path: Path) -> None:
    scenario = tmp_path / "two.toml"
    scenario.write_text(
        'name = "two"\nduration_ms = 1000\npolicy = "status_quo"\n'
        '[[apps]]\nname = "cam"\nrole = "camera"\nuid = 10001\nmodel_bytes = 1000\n'
        '[apps.work]\nkind = "periodic"\nperiod_ms = 20\ncost_us = 1000\ndeadline_ms = 20\n'
        '[[apps]]\nname = "bulk"\nrole = "background"\nuid = 10002\nmodel_bytes = 1000\n'
        'importance = "CACHED"\n[apps.work]\nkind = "loop"\nburst = 2\ncost_us = 2000\n'
    )
    for run in real_runs(scenario, "0.4", min_jobs=1).values():
        assert set(run) == {
            "camera_frames",
            "camera_deadline_misses",
            "camera_p99_ms",
            "background_jobs_done",
            "unload_requests",
            "jobs_done",
        }
        assert run["jobs_done"]["bulk"] >= 1 and run["camera_frames"] >= 1


def test_managed_apps_give_their_model_back_when_asked_and_take_turns() -> None:
    turns = shipped_scenarios()["turn_taking"]
    # The LLM's windows (before the assistant, after the photo editor) are 0.4 s each; its
    # work runs under SCHED_IDLE, so on a busy machine only --min-jobs gets a job done.
    runs = real_runs(turns, "2.4", min_jobs=1)
    assert runs["direct"]["unload_requests"] == {}
    assert runs["managed"]["unload_requests"].get("HIGHER_PRIORITY_REQUEST", 0) >= 1
    assert all(done >= 1 for done in runs["managed"]["jobs_done"].values()), runs["managed"]


def test_min_jobs_keeps_an_app_going_past_the_run_until_it_finished_that_many(
    tmp_path: Path,
) -> None:
    """An inference that takes longer than the whole run: only the event (the app's second
    inference finished) ends its time, in both runs."""
    scenario = tmp_path / "slow.toml"
    scenario.write_text(
        'name = "slow"\nduration_ms = 1000\n[[apps]]\nname = "a"\nuid = 1\nmodel_bytes = 1\n'
        '[apps.work]\nkind = "loop"\ncost_us = 200000\n'
    )
    for run in real_runs(scenario, "0.01", min_jobs=2).values():
        assert run["jobs_done"]["a"] >= 2, run


@pytest.mark.parametrize("jobs", ["-1", "1001"])
def test_min_jobs_out_of_range_is_one_line(jobs: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--real", "--driver", "onnxruntime", "--min-jobs", jobs]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--min-jobs must be within 0..1000" in err


def test_min_jobs_without_real_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--min-jobs", "1"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--min-jobs applies to demo --real only" in err


def test_an_inference_longer_than_the_real_demo_runs_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "long.toml"
    scenario.write_text(
        'name = "long"\nduration_ms = 1000\n[[apps]]\nname = "a"\nuid = 1\nmodel_bytes = 1\n'
        '[apps.work]\nkind = "loop"\ncost_us = 900000\n'
    )
    argv = ["demo", "--real", "--driver", "onnxruntime", "--scenario", str(scenario)]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "apps.0.work.cost_us: 900000 us" in err
    assert "at most 500000 us" in err


def test_demo_real_with_a_simulated_driver_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--real", "--driver", "reference", "--seconds", "0.1"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs no real models" in err


@pytest.mark.parametrize("seconds", ["0", "-1", "601"])
def test_seconds_out_of_range_is_one_line(seconds: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--real", "--driver", "onnxruntime", "--seconds", seconds]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--seconds must be more than 0 and at most 600" in err


class Done(Future[list[int]]):
    """A future that has its outputs at once, counting how many were made."""

    made = 0

    def __init__(self) -> None:
        super().__init__()
        Done.made += 1
        self.set_result([1])


def _app(kind: str, **work: Any) -> Any:
    data = {
        "name": "s",
        "duration_ms": 1000,
        "apps": [{"name": "a", "uid": 1, "model_bytes": 1, "work": {"kind": kind, **work}}],
    }
    return parse_scenario(data).apps[0]


def _play_for(app: Any, runner: Runner, seconds: float) -> AppScore:
    stop, score = threading.Event(), AppScore()
    threading.Timer(seconds, stop.set).start()
    play(app, runner, stop, score)
    return score


class VirtualClock(threading.Event):
    """The apps' clock (`real_apps.time`) and their stop event, in virtual time: a wait
    moves the clock on by its timeout, `sleep` by its seconds; the run stops once the
    clock reaches `until`."""

    def __init__(self, until: float = math.inf) -> None:
        super().__init__()
        self.now = 0.0
        self.until = until

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def wait(self, timeout: float | None = None) -> bool:
        if not self.is_set():
            assert timeout is not None, "an app waited for ever"
            self.now += timeout
            if self.now >= self.until:
                self.set()
        return self.is_set()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Callable[..., VirtualClock]:
    """A `VirtualClock` the apps of `real_apps` run on."""

    def virtual(until: float = math.inf) -> VirtualClock:
        virtual_clock = VirtualClock(until)
        monkeypatch.setattr(real_apps, "time", virtual_clock)
        return virtual_clock

    return virtual


def test_periodic_work_times_each_inference_against_its_deadline(
    clock: Callable[..., VirtualClock],
) -> None:
    slow = iter([0.0, 0.2] + [0.0] * 1000)
    app = _app("periodic", period_ms=10, cost_us=1, deadline_ms=20)
    stop, score = clock(until=0.3), AppScore()
    play(app, Runner(lambda: stop.sleep(next(slow)), Done), stop, score)
    assert score.done == len(score.latencies_ms) >= 2
    assert score.latencies_ms[1] == pytest.approx(200)
    assert score.misses == sum(1 for ms in score.latencies_ms if ms > 20) >= 1


def test_a_loop_keeps_burst_inferences_in_flight_and_cancels_them_at_the_end() -> None:
    left: list[Future[list[int]]] = []

    def submit() -> Future[list[int]]:
        future: Future[list[int]] = Future()
        left.append(future)
        if len(left) <= 5:
            future.set_result([1])
        return future

    score = _play_for(_app("loop", burst=3, cost_us=1000), Runner(lambda: None, submit), 0.1)
    assert score.done == 5
    assert len(left) == 8 and all(f.cancelled() for f in left[5:])


def test_bursts_come_every_period(clock: Callable[..., VirtualClock]) -> None:
    stop, score, starts = clock(), AppScore(), []

    def submit() -> Done:
        if Done.made % 4 == 0:
            starts.append(stop.now)
        if Done.made == 11:
            stop.set()
        return Done()

    Done.made = 0
    play(_app("burst", burst=4, period_ms=30, cost_us=1), Runner(print, submit), stop, score)
    assert Done.made == 12 and score.done == 8  # the third burst came after the stop
    assert starts == pytest.approx([0.0, 0.03, 0.06])


def test_an_app_whose_model_is_taken_back_stops_and_says_why() -> None:
    def gone() -> None:
        raise UnknownModelError("model 3 is no longer loaded")

    app = _app("periodic", period_ms=10, cost_us=1)
    score = _play_for(app, Runner(gone, Done), 0.05)
    assert score.error == "model 3 is no longer loaded" and score.done == 0


def test_metrics_report_only_the_roles_some_app_plays() -> None:
    scenario = load_scenario(shipped_scenarios()["demo"])
    scores = {app.name: AppScore(done=2) for app in scenario.apps}
    scores["camera"].latencies_ms = [5.0, 40.0]
    scores["camera"].misses = 1
    out = metrics(scenario, scores)
    assert out["camera_frames"] == 2 and out["camera_p99_ms"] == 40.0
    assert out["background_jobs_done"] == 2 and "apps_stopped" not in out
    assert out["unload_requests"] == {}
    scores["llm"].error = "revoked"
    scores["llm"].unloads = ["THERMAL", "THERMAL"]
    again = metrics(scenario, scores)
    assert again["apps_stopped"] == {"llm": "revoked"}
    assert again["unload_requests"] == {"THERMAL": 2}
