"""Log lines clients can cause: a burst per kind per window, one line each, never a
traceback unless DEBUG was asked for."""

from __future__ import annotations

import logging

import pytest

from npumanager.daemon.server.ratelog import RateLimitedLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_kind_past_its_burst_is_counted_then_summed_up(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    ratelog = RateLimitedLog(logging.getLogger("t.burst"), burst=3, window_s=10, clock=clock)
    caplog.set_level(logging.INFO, "t.burst")
    for uid in range(10):
        ratelog.info("closing uid %d", uid)
    ratelog.info("another kind %d", 1)
    assert [r.getMessage() for r in caplog.records] == [
        "closing uid 0",
        "closing uid 1",
        "closing uid 2",
        "another kind 1",
    ]
    assert ratelog.suppressed == 7
    clock.now = 10
    ratelog.info("closing uid %d", 10)
    assert [r.getMessage() for r in caplog.records][-2:] == [
        "(7 more like 'closing uid %d' in the last 10 s)",
        "closing uid 10",
    ]


def test_an_internal_error_is_one_line_and_its_traceback_only_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ratelog = RateLimitedLog(logging.getLogger("t.internal"), burst=2)
    caplog.set_level(logging.INFO, "t.internal")
    try:
        raise OSError(5, "Input/output error")
    except OSError as exc:
        error = exc
    for _ in range(5):
        ratelog.internal_error("serving uid %d failed", 7, exc=error)
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.getMessage() for r in lines] == [
        "serving uid 7 failed: OSError(5, 'Input/output error')"
    ] * 2
    assert all(r.exc_info is None for r in lines)
    caplog.clear()
    caplog.set_level(logging.DEBUG, "t.internal")
    ratelog.internal_error("serving uid %d failed", 7, exc=error)
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 1 and debug[0].exc_info is not None
