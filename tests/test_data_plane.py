"""The data plane out of the daemon (`daemon.server.direct`, `daemon.host.direct`): a
client's lane goes to its model host, which asks the daemon's scheduler on a gate before
it runs, may lease the channel, and is held to its grants by what the kernel counts
(`daemon.server.audit`), never by its word.

Real daemons on a thread of this process (so a test can see their hosts and counters),
real model hosts, real runs of onnxruntime; every wait is for an event, with a generous
bound that only ends a hang.
"""

from __future__ import annotations

import mmap
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import npumanager as npu
from helpers.daemon_support import WAIT_S, Daemons
from helpers.real_daemon import endless_model, stopped, wait_for
from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.daemon.host.grants import GrantPage, Grants
from npumanager.daemon.wire import gate
from npumanager.errors import IllegalArgumentError
from npumanager.schemas import UnloadReason
from npumanager.schemas.limits import AUDIT_STRIKES

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="model hosts drop to another uid, which needs root"
)

from npumanager.daemon.host.client import HostSettings  # noqa: E402
from npumanager.daemon.server.audit import HostAudit, Watched  # noqa: E402
from npumanager.telemetry import ModelLoadState, ModelLoadStateChanged  # noqa: E402
from npumanager.vendor_drivers.realexec.chain import chain_model  # noqa: E402

LYING_HOST = Path(__file__).parent / "helpers" / "lying_host.py"
DEAF_HOST = Path(__file__).parent / "helpers" / "deaf_host.py"
X = np.full((8, 256), 0.25, np.float32)


@pytest.fixture
def served(daemon: Daemons) -> Iterator[Any]:
    """`served(**host_settings)`: an onnxruntime service and its daemon with model hosts,
    and a client of it (`.service`, `.daemon`, `.client`, `.events` of a memory sink)."""
    made: list[Any] = []

    def serve(driver_options: dict[str, Any] | None = None, **settings: Any) -> Any:
        service = npu.Service("onnxruntime", driver_options=driver_options)
        events = service.add_sink("memory").sink
        hosts = HostSettings("onnxruntime", **settings)
        running = daemon.on_a_thread(service, hosts=hosts)
        client = npu.connect(running.socket_path, uses_feature=True)
        made.append((client, service))
        return SimpleNamespace(service=service, daemon=running, client=client, events=events)

    yield serve
    for client, service in made:
        client.close()
        service.close()


def loaded(client: Any, model: bytes | None = None, request_id: int = 1) -> Any:
    request = npu.ModelLoadRequest.Builder(request_id).set_size(0).build()
    lease = client.reserve(request, timeout_s=WAIT_S)
    lease.__enter__()
    loaded = lease.load_model(model=chain_model() if model is None else model)
    loaded.lease = lease  # to end it
    return loaded


def stats(served: Any) -> dict[str, Any]:
    counters: dict[str, Any] = served.daemon.describe()["daemon"]
    return counters


def the_host(served: Any) -> Any:
    (connection,) = served.daemon.transport.connections.values()
    return connection.host


def in_process(x: np.ndarray) -> list[np.ndarray]:
    service = npu.Service("onnxruntime")
    try:
        return loaded(service.manager(10001, uses_feature=True)).run({"x": x})  # type: ignore[no-any-return]
    finally:
        service.close()


def test_a_run_goes_to_the_host_directly_asking_the_scheduler_each_time(served: Any) -> None:
    setup = served(lease_us=0)
    model = loaded(setup.client)
    outputs = [model.run({"x": X}) for _ in range(5)]
    expected = in_process(X)
    for out in outputs:
        assert [o.tolist() for o in out] == [e.tolist() for e in expected]
    counts = stats(setup)
    assert counts["lanes_opened"] == 1
    assert counts["inferences_direct"] == 5, "one grant a run without a lease"
    assert counts["direct_runs"] == 5
    assert counts["inferences_on_lane"] == 5
    assert counts["model_hosts"]["runs_in_place"] + counts["model_hosts"]["runs_copied"] == 0, (
        "no tensor went through the daemon"
    )

    def ended() -> list[int]:
        work = [e for e in setup.events.events if type(e) is WorkEvent]
        return [e.reason for e in work if e.kind == EventKind.ENDED]

    wait_for(lambda: len(ended()) >= 5)
    assert ended() == [npu.NPU_END_REASON_COMPLETED] * 5, "each run's life, as the daemon saw it"


def test_a_lease_covers_further_runs_until_the_model_is_unloaded(served: Any) -> None:
    setup = served(lease_us=100_000, lease_idle_us=60_000_000)
    model = loaded(setup.client)
    host = the_host(setup)
    for _ in range(10):
        model.run({"x": X})
    counts = stats(setup)
    assert counts["direct_runs"] == 10
    assert counts["inferences_direct"] < 10, "a lease let later runs go without asking"
    before = host.page.generation
    model.lease.__exit__(None, None, None)  # the model is unloaded
    wait_for(lambda: host.page.generation > before)  # the unload took the lease back


@pytest.mark.parametrize("lease_us", [0, 2000])
def test_a_run_past_its_timeout_is_cancelled_in_the_host_and_the_lane_goes_on(
    served: Any, lease_us: int
) -> None:
    """Granted alone, or under a lease that is taken back (overrun) while the run goes on:
    the cancel reaches the run in the host either way, and its failure is told."""
    setup = served(lease_us=lease_us)
    endless = loaded(setup.client, endless_model(), request_id=2)
    ended: list[BaseException] = []

    def run() -> None:
        try:
            endless.run({"x": X}, timeout=0.5)
        except BaseException as exc:  # what ended the run is the result
            ended.append(exc)

    running = threading.Thread(target=run, daemon=True)
    running.start()
    running.join(WAIT_S)
    assert not running.is_alive(), "the run was never stopped"
    assert [type(exc) for exc in ended] == [TimeoutError]
    model = loaded(setup.client)
    assert [o.tolist() for o in model.run({"x": X})] == [o.tolist() for o in in_process(X)]
    assert stats(setup)["lanes_opened"] == 1, "the same lane, to the same live host"


def stop_as_the_driver_would(setup: Any, model: Any, how: str) -> None:
    """Stop the one live run: by restart preemption (to make room), the model's unload, the
    client's cancel (what its timeout sends), or as failed (`inject_fault`)."""
    driver = setup.service.driver
    if how == "preempted":
        with driver._lock:
            (work,) = driver._work.values()
            work.stopping = True
            work.call.cancel()
    elif how == "failed":
        (work_id,) = driver._work
        driver.inject_fault(work_id)
    elif how == "unloaded":
        threading.Thread(target=model.lease.__exit__, args=(None, None, None)).start()
    else:
        assert the_gate(setup).cancel()


def the_gate(setup: Any) -> Any:
    (connection,) = setup.daemon.transport.connections.values()
    return connection.lane


@pytest.mark.parametrize(
    ("how", "ends_with"),
    [
        ("preempted", CancelledError),  # requeued, then cancelled by the test
        ("unloaded", CancelledError),
        ("cancelled", CancelledError),
        ("failed", npu.ExecutionError),
    ],
)
def test_a_run_stopped_as_its_lease_overran_is_requeued_or_ends_as_stopped(
    served: Any, how: str, ends_with: type[BaseException]
) -> None:
    """The driver stops a leased run (its cancel on its way to the host) while the host is
    too slow to answer before the lease overruns: the grant ends at the overrun, and the
    run's failure comes after. It is asked for again if the driver would have requeued it,
    else it ends cancelled: never a failure of the client's run, never a lane left waiting
    (it once waited for ever, and then failed with the runtime's stop as its error), and
    a run the host has had the daemon's word on is never asked for again."""
    setup = served(lease_us=100_000)
    endless = loaded(setup.client, endless_model())
    after = loaded(setup.client, request_id=2)
    host, ended = the_host(setup), []

    def run() -> None:
        try:
            endless.run({"x": X})
        except BaseException as exc:  # what ended the run is the result
            ended.append(exc)

    def started() -> int:
        work = [e for e in setup.events.events if type(e) is WorkEvent]
        return sum(e.kind == EventKind.STARTED for e in work)

    running = threading.Thread(target=run, daemon=True)
    running.start()
    # The stop must come within the lease and its overrun (200 ms): looked for often.
    wait_for(lambda: started() == 1 and host.grants.open == 1, every=0.001)
    host.pause()  # the host hears of the stop only after the lease has overrun
    wait_for(lambda: stopped(host.pid), every=0.001)
    try:
        stop_as_the_driver_would(setup, endless, how)
        wait_for(lambda: bool(the_gate(setup)._overran))  # its seq (once True)
    finally:
        host.resume()
    if how == "preempted":
        wait_for(lambda: started() == 2)  # asked for again: in line, and started over
        assert running.is_alive() and not ended, ended
        assert the_gate(setup).cancel()
    running.join(WAIT_S)
    assert not running.is_alive(), "the lane was left waiting"
    assert [type(exc) for exc in ended] == [ends_with]
    after.run({"x": X})
    runs = 3 if how == "preempted" else 2  # the endless run (twice if requeued), this one
    wait_for(lambda: started() >= runs)
    assert started() == runs


def test_a_lane_refused_while_the_last_one_winds_down_is_opened_again_later(
    served: Any,
) -> None:
    """A client whose lane closed (an interrupted exchange) opens a new one at its next run;
    the daemon refuses it while the old lane's gate is still live (its host has not yet
    seen the close). That refusal lasts only until the old lane has gone: the connection
    gets a lane again, rather than running on the connection's path for good. And the old
    lane goes as soon as its host has closed it (its gate's thread once waited for the live
    host to die, up to `answer_s`, to say why it closed)."""
    setup = served(lease_us=0, answer_s=3 * WAIT_S)
    model = loaded(setup.client)
    model.run({"x": X})
    inference, host = setup.client._service._inference, the_host(setup)
    old = the_gate(setup)
    host.pause()  # the host's end of the old lane does not see the close yet
    wait_for(lambda: stopped(host.pid), every=0.001)  # a SIGSTOP takes effect a moment later
    try:
        inference._lane.close()  # as an exchange interrupted mid-way closes it
        assert inference.lane() is None, "refused: the old lane is live"
    finally:
        host.resume()
    wait_for(old.finished)
    before = stats(setup)["inferences_on_lane"]

    def on_a_new_lane() -> bool:
        model.run({"x": X})
        return bool(stats(setup)["inferences_on_lane"] > before)

    wait_for(on_a_new_lane)
    assert stats(setup)["lanes_opened"] == 2


@pytest.mark.parametrize("lease_us", [0, 2000])
def test_a_cancel_the_host_does_not_heed_frees_the_channel_all_the_same(
    served: Any, lease_us: int
) -> None:
    """One channel; a host that ignores the daemon's cancels (`helpers/deaf_host.py`). Its
    run past its timeout goes on in the host, but the cancel ended the driver's work: the
    channel goes to the next run, with a lease or without."""
    setup = served(
        driver_options={"channels": 1},
        lease_us=lease_us,
        command=(sys.executable, str(DEAF_HOST)),
    )
    endless, after = loaded(setup.client, endless_model()), loaded(setup.client, request_id=2)

    def unanswered() -> None:
        with pytest.raises(npu.NpuManagerError):  # when the host is killed, at the end
            endless.run({"x": X}, timeout=0.5)

    threading.Thread(target=unanswered, daemon=True).start()

    def started() -> bool:
        work = [e for e in setup.events.events if type(e) is WorkEvent]
        return any(e.kind == EventKind.STARTED for e in work)

    wait_for(started)  # the endless run has the channel
    ran: list[Any] = []
    beside = threading.Thread(target=lambda: ran.append(after.run({"x": X})), daemon=True)
    beside.start()  # the lane is taken: this run goes by the connection, to the same host
    beside.join(WAIT_S)
    assert ran, "the next run never had the channel"
    assert [o.tolist() for o in ran[0]] == [o.tolist() for o in in_process(X)]


@pytest.mark.parametrize(("lease_us", "path"), [(0, "lane"), (2000, "lane"), (0, "runner")])
def test_a_stop_the_host_does_not_heed_counts_as_granted_for_stopped_grant_s_only(
    served: Any, lease_us: int, path: str
) -> None:
    """A host that ignores the daemon's cancels (`helpers/deaf_host.py`) goes on with its
    endless run; that run's grant counts `STOPPED_GRANT_S` past the cancel and no more, so
    the audit holds what the host computes after it against the host (on its lane, with a
    lease or without, and on a runner: the connection's own path)."""
    setup = served(
        driver_options={"channels": 1},
        lease_us=lease_us,
        command=(sys.executable, str(DEAF_HOST)),
    )
    endless = loaded(setup.client, endless_model())
    host = the_host(setup)
    if path == "lane":

        def unanswered() -> None:
            with pytest.raises(npu.NpuManagerError):  # when the host is killed, at the end
                endless.run({"x": X}, timeout=0.5)  # its timeout's cancel is not heeded

        threading.Thread(target=unanswered, daemon=True).start()
    else:
        work = endless.submit({"x": X})

    def started() -> bool:
        events = [e for e in setup.events.events if type(e) is WorkEvent]
        return any(e.kind == EventKind.STARTED for e in events)

    wait_for(started)
    if path == "runner":
        assert work.cancel()
    wait_for(lambda: host.grants.unheeded == 1)  # STOPPED_GRANT_S after the cancel
    before, since = host.grants.total_ns(), time.monotonic_ns()
    while time.monotonic_ns() < since + 100_000_000:
        time.sleep(0.1)
    assert host.grants.total_ns() == before, "the unheeded run is on the host's own account"
    assert host.grants.open == 1 and host.dead is None, "the premise: the host runs it still"


def test_a_cancel_on_one_lane_stops_no_run_of_another_lane_in_the_same_host(
    served: Any,
) -> None:
    """Two connections of one app have their lanes in one host, and each lane counts its
    runs from 1: the cancel of one lane's run 1 stops that run, not the other lane's run 1
    (begun later), which goes on until its own cancel."""
    setup = served(driver_options={"channels": 2}, lease_us=0)
    other = npu.connect(setup.daemon.socket_path, uses_feature=True)
    try:
        clients = {"first": setup.client, "second": other}
        models = {
            name: loaded(client, endless_model(), request_id=1) for name, client in clients.items()
        }
        hosts = {id(c.host) for c in setup.daemon.transport.connections.values()}
        assert len(hosts) == 1, "one app, one host"
        ended: dict[str, BaseException] = {}

        def run(name: str) -> None:
            try:
                models[name].run({"x": X})
            except BaseException as exc:  # what ended the run is the result
                ended[name] = exc

        def started() -> int:
            work = [e for e in setup.events.events if type(e) is WorkEvent]
            return sum(e.kind == EventKind.STARTED for e in work)

        threads = {name: threading.Thread(target=run, args=(name,)) for name in clients}
        for count, name in enumerate(clients, start=1):
            threads[name].start()
            wait_for(lambda count=count: started() == count)  # the first begins first
        clients["first"]._service._inference._cancel_lane()  # as its timeout would
        threads["first"].join(WAIT_S)
        assert isinstance(ended.get("first"), CancelledError), ended
        assert "second" not in ended, f"the second lane's run was stopped: {ended}"
        clients["second"]._service._inference._cancel_lane()
        threads["second"].join(WAIT_S)
        assert isinstance(ended.get("second"), CancelledError), ended
    finally:
        other.close()


def test_a_host_killed_between_runs_is_told_and_a_new_host_serves_the_next_load(
    served: Any,
) -> None:
    setup = served(lease_us=0)
    model = loaded(setup.client)
    model.run({"x": X})
    host = the_host(setup)
    os.kill(host.pid, signal.SIGKILL)
    wait_for(lambda: host.dead is not None)
    with pytest.raises(npu.ModelHostError, match="killed by SIGKILL"):
        model.run({"x": X})
    again = loaded(setup.client, request_id=3)
    assert [o.tolist() for o in again.run({"x": X})] == [o.tolist() for o in in_process(X)]
    counts = stats(setup)
    assert counts["lanes_opened"] == 2, "a new lane, to the new host"
    wait_for(lambda: bool(revoked(setup)))
    assert revoked(setup) == [UnloadReason.MODEL_HOST_ENDED]


def revoked(setup: Any) -> list[int]:
    """The unload reasons of the REVOKED events the service's sink has seen."""
    return [
        e.unload_reason
        for e in setup.events.events
        if type(e) is ModelLoadStateChanged and e.state == ModelLoadState.REVOKED
    ]


def run_until(model: Any, done: Any, x: np.ndarray = X) -> BaseException | None:
    """Run `model` on `x` back to back until `done()`; what a run raised, if one did."""
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"the condition did not hold within {WAIT_S} s"
        try:
            model.run({"x": x})
        except (npu.NpuManagerError, CancelledError) as exc:
            return exc
    return None


def test_a_leased_run_that_outlasts_its_lease_is_granted_until_it_ends(served: Any) -> None:
    """A run started under a `GO` with a lease keeps its grant until the host says it is
    done, however long past the lease's deadline it takes: the grant time the audit holds
    the host to covers it (it once closed at the deadline and `LEASE_OVERRUN_S`, and an
    honest host with a long run was killed), and the lease is taken back meanwhile."""
    setup = served(lease_us=2000)
    model = loaded(setup.client, chain_model(layers=64))
    host = the_host(setup)
    big = np.full((16384, 256), 0.25, np.float32)  # 64 layers: far past 0.2 s of a core
    model.run({"x": X})
    wait_for(lambda: host.grants.open == 0)  # the first lease given back
    before, generation = host.grants.total_ns(), host.page.generation
    started = time.monotonic_ns()
    model.run({"x": big})
    took = time.monotonic_ns() - started
    wait_for(lambda: host.grants.open == 0)
    granted = host.grants.total_ns() - before
    assert took > 2e8, "the premise: a run far longer than the lease and its overrun"
    assert granted >= took / 2, (granted, took)
    assert host.page.generation > generation, "the overrun lease was taken back"
    assert setup.daemon.inference.hosting.audit.killed == 0


def test_a_host_that_runs_without_its_grants_is_throttled_then_killed(served: Any) -> None:
    setup = served(lease_us=0, command=(sys.executable, str(LYING_HOST)))
    model = loaded(setup.client)
    audit = setup.daemon.inference.hosting.audit
    # Runs long enough that the host, not the round trip, takes the time: beside busy
    # programs a host of tiny runs got under a quarter of a CPU, within its allowance.
    big = np.full((512, 256), 0.25, np.float32)
    run_until(model, lambda: audit.killed > 0, big)  # the run in flight may fail either way
    # Stopped at each strike before the last; on a busy machine a period within its grants
    # forgives one, and it is stopped again before the strikes add up.
    assert audit.throttled >= AUDIT_STRIKES - 1
    wait_for(lambda: bool(revoked(setup)))
    assert revoked(setup) == [UnloadReason.OVER_GRANT]
    with pytest.raises(npu.ModelHostError, match="more CPU time than the daemon granted"):
        model.run({"x": X})
    (app,) = setup.daemon.describe()["apps"]
    assert "more CPU time than the daemon granted" in app["host_ended"]


def test_an_honest_host_under_the_same_load_keeps_within_its_grants(served: Any) -> None:
    setup = served(lease_us=0)
    model = loaded(setup.client)
    audit = setup.daemon.inference.hosting.audit
    start = audit.periods
    assert run_until(model, lambda: audit.periods >= start + AUDIT_STRIKES + 1) is None
    assert (audit.throttled, audit.killed) == (0, 0)


def test_an_honest_host_running_on_every_cpu_between_frames_keeps_within_its_grants(
    served: Any,
) -> None:
    """A model on one thread per CPU (`threads=0`, the runtimes' default), run as a frame
    app runs it, a run and then a pause: the runtime's pool threads must not burn CPU
    between runs (onnxruntime's spin-wait did: an honest host was killed for it)."""
    setup = served(lease_us=0)
    setup.service.set_uid_importance(os.getuid(), npu.IMPORTANCE_FOREGROUND)
    request = npu.ModelLoadRequest.Builder(1).set_size(0).build()
    lease = setup.client.reserve(request, timeout_s=WAIT_S)
    lease.__enter__()
    model = lease.load_model(model=chain_model(), threads=0)
    audit = setup.daemon.inference.hosting.audit
    start = audit.periods
    deadline = time.monotonic() + WAIT_S
    while audit.periods < start + AUDIT_STRIKES + 1:
        assert time.monotonic() < deadline, f"the audit did not look within {WAIT_S} s"
        model.run({"x": np.full((64, 256), 0.25, np.float32)})
        time.sleep(0.005)
    assert (audit.throttled, audit.killed) == (0, 0)


# The audit's arithmetic, on a host whose CPU time the test sets ---------------------------


class FakeHost:
    def __init__(self) -> None:
        self.pid, self.uid, self.dead, self.cgroup = 4242, 1000, None, None
        self.grants = Grants()
        self.signals: list[str] = []

    def pause(self) -> None:
        self.signals.append("stop")

    def resume(self) -> None:
        self.signals.append("cont")

    def condemn(self, why: str) -> None:
        self.signals.append("kill")
        self.why = why


def test_the_audit_throttles_at_each_strike_kills_at_the_last_and_forgives_slowly() -> None:
    used = [0]
    audit = HostAudit(period_s=1.0, cpus=2, read=lambda pid, cgroup: used[0])
    host = FakeHost()
    entry = Watched(host, 0, host.grants.total_ns(), None)  # type: ignore[arg-type]
    audit._watched[host.pid] = entry
    second = 1_000_000_000

    used[0] += second  # a whole CPU second with nothing granted
    audit.check(entry)
    assert (host.signals, entry.strikes) == (["stop"], 1)
    entry.throttled_until = 1e-9  # the stop is over
    audit.check(entry)
    assert host.signals == ["stop", "cont"]
    audit.check(entry)  # a period within: one strike forgiven
    assert entry.strikes == 0
    for strike in range(AUDIT_STRIKES):
        used[0] += second
        audit.check(entry)
        if strike < AUDIT_STRIKES - 1:
            entry.throttled_until = 1e-9
            audit.check(entry)
    assert host.signals[-1] == "kill"
    assert "1000 ms with 0 ms granted" in host.why
    assert audit.killed == 1 and host.pid not in audit._watched


def test_the_audit_lets_the_hosts_it_stopped_go_on_when_it_ends() -> None:
    """A host throttled (stopped) when the audit's thread ends is resumed then: nothing
    else would, and a stopping daemon's wait for its runs would find it stopped."""
    used = [0]
    audit = HostAudit(period_s=1.0, cpus=1, read=lambda pid, cgroup: used[0])
    throttled, untouched = FakeHost(), FakeHost()
    untouched.pid = 4244
    for host in (throttled, untouched):
        audit._watched[host.pid] = Watched(host, 0, host.grants.total_ns(), None)  # type: ignore[arg-type]
    used[0] += 10**9  # a CPU second with nothing granted: for the first host only
    audit.check(audit._watched[throttled.pid])
    assert throttled.signals == ["stop"]
    audit.stop()
    assert throttled.signals == ["stop", "cont"]
    assert untouched.signals == []


def test_cpu_time_inside_open_grants_is_no_strike() -> None:
    used = [0]
    audit = HostAudit(period_s=1.0, cpus=1, read=lambda pid, cgroup: used[0])
    host = FakeHost()
    entry = Watched(host, 0, host.grants.total_ns(), None)  # type: ignore[arg-type]
    host.grants.opened()
    time.sleep(0.05)  # the grant is open for at least this long
    used[0] += 40_000_000  # 40 ms of CPU: less than the grant's time
    audit.check(entry)
    assert (host.signals, entry.strikes) == ([], 0)


def test_the_kernel_counts_a_process_cpu_time_in_every_thread() -> None:
    from npumanager.daemon.server.audit import cpu_ns

    before = cpu_ns(os.getpid())
    assert before is not None
    sum(i * i for i in range(3_000_000))
    after = cpu_ns(os.getpid())
    assert after is not None and after > before
    assert cpu_ns(2**22 + 1) is None, "a process that is not there"


# The grant page and the gate's frames -------------------------------------------------------


def test_only_the_daemons_own_mapping_writes_the_grant_page() -> None:
    page = GrantPage()
    try:
        seen = mmap.mmap(
            page.read_only, gate.PAGE_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ
        )
        assert gate.PAGE.unpack_from(seen)[0] == 0
        page.revoke()
        assert gate.PAGE.unpack_from(seen)[0] == 1, "the host sees the daemon's write"
        with pytest.raises(PermissionError):
            mmap.mmap(page.read_only, gate.PAGE_BYTES, flags=mmap.MAP_SHARED)
        again = os.open(f"/proc/self/fd/{page.read_only}", os.O_RDWR)
        try:
            with pytest.raises(PermissionError):
                os.pwrite(again, b"\xff" * 8, 0)
            with pytest.raises(PermissionError):
                mmap.mmap(again, gate.PAGE_BYTES, flags=mmap.MAP_SHARED)
        finally:
            os.close(again)
        assert gate.PAGE.unpack_from(seen)[0] == 1
    finally:
        page.close()


def test_a_closed_grant_page_holds_no_descriptor_and_a_late_revoke_is_harmless() -> None:
    before = set(os.listdir("/proc/self/fd"))
    page = GrantPage()
    assert len(set(os.listdir("/proc/self/fd")) - before) == 2, "the host's and the mapping's"
    page.close()
    assert set(os.listdir("/proc/self/fd")) <= before, "a host's end gives both back"
    page.revoke()  # a gate's revoke racing the host's end
    assert page.generation == 1


INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


@given(
    st.sampled_from(list(gate.Op)),
    st.integers(0, 255),
    INT32,
    INT64,
    INT64,
    INT64,
    INT64,
    st.text(max_size=200),
)
def test_gate_frames_decode_to_what_was_encoded(
    op: gate.Op,
    status: int,
    model: int,
    seq: int,
    work_id: int,
    until: int,
    generation: int,
    text: str,
) -> None:
    frame = gate.encode(
        op,
        seq,
        status=status,
        model=model,
        work_id=work_id,
        lease_until_ns=until,
        lease_generation=generation,
        text=text,
    )
    assert gate.decode(frame) == (op, status, model, seq, work_id, until, generation, text)


@given(st.binary(max_size=gate.FRAME.size + 64))
def test_any_bytes_from_a_host_decode_or_are_refused_with_what_is_wrong(data: bytes) -> None:
    try:
        gate.decode(data)
    except IllegalArgumentError as exc:
        assert str(exc)


def expanding_model(elements: int) -> bytes:
    """A tiny model whose run makes `elements` float32s from one (`Expand`): gigabytes at
    run time from a file of a few hundred bytes."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["y"])],
        "expanding",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [elements])],
        [numpy_helper.from_array(np.array([elements], np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data: bytes = model.SerializeToString()
    return data


def test_without_a_memory_cgroup_a_run_past_the_hosts_grants_fails_alone(served: Any) -> None:
    setup = served(lease_us=0, cgroups=None)
    host_model = loaded(setup.client, expanding_model(1 << 29), request_id=4)  # 2 GiB out
    host = the_host(setup)
    assert host.rlimit is not None
    with pytest.raises(npu.ExecutionError, match=r"this model host may use \d+ MiB"):
        host_model.run({"x": np.ones(1, np.float32)})
    model = loaded(setup.client)
    assert [o.tolist() for o in model.run({"x": X})] == [o.tolist() for o in in_process(X)]
    assert the_host(setup) is host and host.dead is None, "the host served on"
