"""A hypothesis state machine that runs a driver and the reference device op by op.

After every op both must have returned the same value (work ids and model handles are
compared through the order they were handed out) or raised the same kind of error, and
must hold the same events. Only for drivers that claim virtual time. It runs from a fixed
seed with no example database, so a driver passes or fails the same way on every run; the
device is small (two channels, 1000 bytes) so that the examples reach preemption, pause
and resume, revocation, refusal for capacity, throttling and shutdown (`FEATURES`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    get_state_machine_test,
    initialize,
    invariant,
    rule,
)

from npumanager.core.driver.events import EventKind, WorkEvent
from npumanager.errors import CapacityError
from npumanager.schemas import EndReason, SchedulingConfig, StartReason, ThermalSeverity
from npumanager.schemas.device import DeviceSpec
from npumanager.schemas.limits import VTS_EXAMPLES, VTS_SEED, VTS_STEPS
from npumanager.vendor_drivers.reference import ReferenceDriver

SPEC = DeviceSpec(channels=2, slice_us=500, weight_memory_bytes=1000, sram_bytes=1000)
UIDS = (1000, 10001, 10002, 10003)
RULE = "MatchesReferenceDevice"
FEATURES = (
    "preemption",
    "pause_resume",
    "revocation",
    "capacity_refusal",
    "throttling",
    "shutdown",
)
"""What the examples should reach; `check_against_reference` returns the fraction of each."""


def _features(events: list[WorkEvent]) -> set[str]:
    """The features a batch of the reference's events shows."""
    found = set()
    for e in events:
        if e.kind == EventKind.ENDED and e.reason == EndReason.PAUSED:
            found.add("preemption")
        elif e.kind == EventKind.STARTED and e.reason == StartReason.RESUMED:
            found.add("pause_resume")
        elif e.kind == EventKind.ENDED and e.reason == EndReason.CANCELLED_SYSTEM:
            found.add("revocation")
    return found


OPS_WEIGHTS = (
    ("submit", 30),
    ("advance", 20),
    ("configure", 8),
    ("load", 8),
    ("cancel", 8),
    ("unload", 6),
    ("heat", 6),
    ("run_until_idle", 4),
)
"""The ops a step draws from, and how often."""
OPS = [op for op, _ in OPS_WEIGHTS]


def _error_kind(exc: BaseException) -> str:
    for kind in (LookupError, ValueError):
        if isinstance(exc, kind):
            return kind.__name__
    return type(exc).__name__


def check_against_reference(
    factory: Callable[..., Any],
    max_examples: int = VTS_EXAMPLES,
    *,
    seed_value: int = VTS_SEED,
    thermal: bool = True,
    steps: int = VTS_STEPS,
) -> dict[str, float]:
    """Run the state machine on drivers built by `factory(devices=[SPEC])`, from `seed_value`;
    the fraction of examples that reached each of `FEATURES`. `thermal`: heat the device too
    (for drivers claiming `thermal_model`)."""
    reached: list[set[str]] = []

    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.driver = factory(devices=[SPEC])
            self.oracle = ReferenceDriver([SPEC])
            self.models: list[tuple[int, int]] = []  # (driver handle, oracle handle)
            self.works: list[tuple[int, int]] = []
            self.log: list[str] = []
            self.reached: set[str] = set()

        def both(self, what: str, call: Callable[[Any], Any]) -> tuple[Any, Any]:
            self.log.append(what)
            results = []
            self.oracle_error: Exception | None = None
            for target in (self.driver, self.oracle):
                try:
                    results.append(("ok", call(target)))
                except Exception as exc:
                    results.append(("error", _error_kind(exc)))
                    if target is self.oracle:
                        self.oracle_error = exc
            got, want = results
            assert got[0] == want[0] and (got[0] == "ok" or got[1] == want[1]), (
                f"{RULE}: {what} gave {got} on the driver but {want} on the reference; "
                f"ops: {self.log}"
            )
            return got[1], want[1]

        @initialize(program=st.integers(0, 2**64 - 1))
        def busy_device(self, program: int) -> None:
            """A model, and both channels busy with long unimportant work: what arrives
            later preempts it, and the steps that follow resume, revoke or refuse. The
            steps are drawn from `program` (hypothesis shrinks it and the step count)."""
            self.rng = random.Random(program)
            for uid, app in zip(UIDS, (0, 100, 400), strict=False):
                self.configure(uid, app, True, False)
            self.load(100, 0)
            for _ in range(2):
                self.submit(0, UIDS[-1], None, 1000, 200_000_000)
            self.advance(250)

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

        def load(self, weight: int, sram: int) -> None:
            got, want = self.both(
                f"load_model(0, weight_bytes={weight}, sram_bytes={sram})",
                lambda d: d.load_model(0, weight_bytes=weight, sram_bytes=sram),
            )
            if isinstance(want, int):
                self.models.append((got, want))
            elif isinstance(self.oracle_error, CapacityError):
                self.reached.add("capacity_refusal")

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

        def cancel(self, index: int) -> None:
            if index >= len(self.works):
                return
            mine, theirs = self.works[-1 - index]
            self.both(
                f"cancel(work#{len(self.works) - 1 - index})",
                lambda d: d.cancel(mine if d is self.driver else theirs),
            )

        def unload(self, index: int) -> None:
            if index >= len(self.models):
                return
            mine, theirs = self.models[index]
            self.both(
                f"unload_model(model#{index})",
                lambda d: d.unload_model(mine if d is self.driver else theirs),
            )

        def advance(self, us: int) -> None:
            self.both(f"advance({us})", lambda d: d.advance(us))

        def run_until_idle(self) -> None:
            self.both("run_until_idle()", lambda d: d.run_until_idle())

        def heat(self, mc: int) -> None:
            if thermal:
                self.both(f"add_heat(0, {mc})", lambda d: d.add_heat(0, mc))

        @rule()
        def step(self) -> None:
            """One op, drawn by weight, with its arguments, from the example's program."""
            r = self.rng
            op = r.choices(
                OPS, weights=[w if thermal or o != "heat" else 0 for o, w in OPS_WEIGHTS]
            )
            if op[0] == "configure":
                self.configure(
                    r.choice(UIDS),
                    r.choice((0, 100, 400, 1000)),
                    r.random() < 0.8,
                    r.random() < 0.5,
                )
            elif op[0] == "load":
                self.load(r.choice((1, 100, 600)), r.choice((0, 300, 1200)))
            elif op[0] == "submit":
                self.submit(
                    r.randrange(4),
                    r.choice(UIDS),
                    r.choice((None, None, *UIDS)),
                    r.choice((0, 250, 500, 1000)),
                    r.choice((1, 100_000, 2_000_000, 20_000_000)),
                )
            elif op[0] == "cancel":
                self.cancel(r.randrange(9))
            elif op[0] == "unload":
                self.unload(r.randrange(4))
            elif op[0] == "advance":
                self.advance(r.choice((1, 250, 1000, 5000, 30_000)))
            elif op[0] == "run_until_idle":
                self.run_until_idle()
            else:
                self.heat(r.choice((5_000, 20_000, 40_000, 80_000)))

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
            theirs = self.oracle.take_events()
            self.reached |= _features(theirs)
            state = self.oracle.device_state(0)
            if state.shutdown:
                self.reached.add("shutdown")
            if state.severity >= ThermalSeverity.MODERATE and not state.shutdown:
                self.reached.add("throttling")
            want = [self.translate(e, 1) for e in theirs]
            assert got == want, (
                f"{RULE}: after {self.log[-1:] or ['start']} the driver's events differ from "
                f"the reference device's\n driver:    {got}\n reference: {want}\n ops: {self.log}"
            )

        def teardown(self) -> None:
            reached.append(self.reached)
            self.driver.close()
            self.oracle.close()

    test = get_state_machine_test(
        Machine,
        _min_steps=steps,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=False,
            phases=(Phase.generate, Phase.shrink),
        ),
    )
    seed(seed_value)(test)()
    return {f: sum(f in r for r in reached) / max(1, len(reached)) for f in FEATURES}
