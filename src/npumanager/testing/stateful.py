"""A hypothesis state machine that runs a driver and the reference device op by op.

After every op both must have returned the same value (work ids and model handles are
compared through the order they were handed out) or raised the same kind of error, and
must hold the same events. Only for drivers that claim virtual time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from npumanager.core.events import WorkEvent
from npumanager.schemas import SchedulingConfig
from npumanager.schemas.device import DeviceSpec
from npumanager.vendor_drivers.reference import ReferenceDriver

SPEC = DeviceSpec(channels=2, slice_us=500, weight_memory_bytes=1000, sram_bytes=1000)
UIDS = (1000, 10001, 10002, 10003)
RULE = "MatchesReferenceDevice"


def _error_kind(exc: BaseException) -> str:
    for kind in (LookupError, ValueError):
        if isinstance(exc, kind):
            return kind.__name__
    return type(exc).__name__


def check_against_reference(factory: Callable[..., Any], max_examples: int = 30) -> None:
    """Run the state machine on drivers built by `factory(devices=[SPEC])`."""

    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.driver = factory(devices=[SPEC])
            self.oracle = ReferenceDriver([SPEC])
            self.models: list[tuple[int, int]] = []  # (driver handle, oracle handle)
            self.works: list[tuple[int, int]] = []
            self.log: list[str] = []

        def both(self, what: str, call: Callable[[Any], Any]) -> tuple[Any, Any]:
            self.log.append(what)
            results = []
            for target in (self.driver, self.oracle):
                try:
                    results.append(("ok", call(target)))
                except Exception as exc:
                    results.append(("error", _error_kind(exc)))
            got, want = results
            assert got[0] == want[0] and (got[0] == "ok" or got[1] == want[1]), (
                f"{RULE}: {what} gave {got} on the driver but {want} on the reference; "
                f"ops: {self.log}"
            )
            return got[1], want[1]

        @initialize()
        def first_model(self) -> None:
            self.load(100, 0)

        @rule(
            uid=st.sampled_from(UIDS),
            app=st.sampled_from([0, 100, 400, 1000]),
            direct=st.sampled_from([True, True, False]),
            attribute=st.booleans(),
        )
        def configure(self, uid: int, app: int, direct: bool, attribute: bool) -> None:
            config = SchedulingConfig(
                uid=uid,
                app_priority=app,
                has_direct_access=direct,
                can_attribute_other_uid=attribute,
            )
            self.both(
                f"update_scheduling_configs([{config!r}])",
                lambda d: d.update_scheduling_configs([config]),
            )

        @rule(weight=st.sampled_from([1, 100, 600]), sram=st.sampled_from([0, 300, 1200]))
        def load(self, weight: int, sram: int) -> None:
            got, want = self.both(
                f"load_model(0, weight_bytes={weight}, sram_bytes={sram})",
                lambda d: d.load_model(0, weight_bytes=weight, sram_bytes=sram),
            )
            if isinstance(want, int):
                self.models.append((got, want))

        @rule(
            index=st.integers(0, 3),
            uid=st.sampled_from(UIDS),
            original=st.sampled_from([None, *UIDS]),
            priority=st.sampled_from([0, 250, 500, 1000]),
            cost=st.sampled_from([1, 100_000, 2_000_000, 20_000_000]),
        )
        def submit(
            self, index: int, uid: int, original: int | None, priority: int, cost: int
        ) -> None:
            index %= len(self.models)
            mine, theirs = self.models[index]
            got, want = self.both(
                f"submit(model#{index}, uid={uid}, original_uid={original}, "
                f"job_priority={priority}, cost_cycles={cost})",
                lambda d: d.submit(
                    mine if d is self.driver else theirs,
                    uid=uid,
                    original_uid=original,
                    job_priority=priority,
                    cost_cycles=cost,
                ),
            )
            self.works.append((got, want))

        @rule(index=st.integers(0, 8))
        def cancel(self, index: int) -> None:
            if index >= len(self.works):
                return
            mine, theirs = self.works[-1 - index]
            self.both(
                f"cancel(work#{len(self.works) - 1 - index})",
                lambda d: d.cancel(mine if d is self.driver else theirs),
            )

        @rule(index=st.integers(0, 3))
        def unload(self, index: int) -> None:
            if index >= len(self.models):
                return
            mine, theirs = self.models[index]
            self.both(
                f"unload_model(model#{index})",
                lambda d: d.unload_model(mine if d is self.driver else theirs),
            )

        @rule(us=st.sampled_from([1, 250, 1000, 5000, 30_000]))
        def advance(self, us: int) -> None:
            self.both(f"advance({us})", lambda d: d.advance(us))

        @rule()
        def run_until_idle(self) -> None:
            self.both("run_until_idle()", lambda d: d.run_until_idle())

        def translate(self, event: WorkEvent, side: int) -> tuple[Any, ...]:
            """The event with its work id replaced by the work's index (side 0: the driver)."""
            ids = {pair[side]: n for n, pair in enumerate(self.works)}
            return (
                event.kind,
                event.reason,
                ids.get(event.id, ("unknown", event.id)),
                event.uid,
                event.original_uid,
                event.job_priority,
                event.effective_priority,
                event.time_us,
                event.device_number,
            )

        @invariant()
        def same_events(self) -> None:
            got = [self.translate(e, 0) for e in self.driver.take_events()]
            want = [self.translate(e, 1) for e in self.oracle.take_events()]
            assert got == want, (
                f"{RULE}: after {self.log[-1:] or ['start']} the driver's events differ from "
                f"the reference device's\n driver:    {got}\n reference: {want}\n ops: {self.log}"
            )

        def teardown(self) -> None:
            self.driver.close()
            self.oracle.close()

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
