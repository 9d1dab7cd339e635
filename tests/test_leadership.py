"""`Leadership`: the loop's thread runs a deferred job while the standby leads the loop."""

from __future__ import annotations

import threading
import time

from helpers.daemon_support import WAIT_S
from npumanager.daemon.server.leadership import Leadership


def test_a_deferred_job_runs_while_the_standby_leads_and_shutdown_runs_once() -> None:
    lead = Leadership()
    job_running, turns_during_job = threading.Event(), threading.Event()
    turn_threads: list[int] = []
    job_thread: list[int] = []
    shutdowns: list[int] = []
    turns = [0]

    def job() -> None:
        job_thread.append(threading.get_ident())
        job_running.set()
        assert turns_during_job.wait(WAIT_S), "no turn ran while the job did"

    def turn() -> bool:
        turns[0] += 1
        turn_threads.append(threading.get_ident())
        if turns[0] == 1:
            deadline = time.monotonic() + WAIT_S  # the standby thread may not be waiting yet
            while not lead.can_defer() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert lead.can_defer()
            lead.defer(job)
            assert not lead.can_defer(), "one job a turn"
        elif job_running.is_set() and not turns_during_job.is_set():
            turns_during_job.set()
        return turns[0] < 50

    lead.run(turn, lambda: shutdowns.append(threading.get_ident()))
    first, during = turn_threads[0], turn_threads[1]
    assert job_thread == [first], "the leader that deferred the job ran it"
    assert during != first, "the standby led the loop meanwhile"
    assert len(shutdowns) == 1 and turns[0] == 50


def test_a_job_that_raises_is_logged_and_the_loop_goes_on() -> None:
    lead = Leadership()
    turns = [0]

    def boom() -> None:
        raise RuntimeError("boom")

    def turn() -> bool:
        turns[0] += 1
        if turns[0] in (1, 5) and lead.can_defer():
            lead.defer(boom)
        return turns[0] < 20

    lead.run(turn, lambda: None)
    assert turns[0] == 20


def test_a_turn_that_raises_shuts_down_once_and_run_raises_it() -> None:
    lead = Leadership()
    shutdowns: list[int] = []
    turns = [0]

    def turn() -> bool:
        turns[0] += 1
        if turns[0] == 3:
            raise OSError("the selector broke")
        return True

    try:
        lead.run(turn, lambda: shutdowns.append(1))
    except OSError as exc:
        assert str(exc) == "the selector broke"
    else:
        raise AssertionError("run() did not raise what the turn raised")
    assert shutdowns == [1]
