"""The rules of resources: debounce, memory, devices, heat, and matching the reference."""

# ruff: noqa: N802 - the test names are the platform's, in its spelling

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable

import pytest

from npumanager.errors import CapacityError, IllegalArgumentError
from npumanager.schemas import DriverCapability, WorkInfo
from npumanager.schemas.device import DeviceSpec
from npumanager.testing.base import (
    MS,
    ONE_CHANNEL,
    Driver,
    Factory,
    Recorder,
    SuiteBase,
    final_reason,
    requires,
)

SMALL = DeviceSpec(weight_memory_bytes=1000, sram_bytes=64)
"""A device with little memory, so loads are refused."""


class ResourceRules(SuiteBase):
    """Debounce, memory, device numbering, heat, MatchesReferenceDevice."""

    # Ours: debounce ------------------------------------------------------------------

    def test_DebounceDefaultWindow(self, make: Callable[..., Driver]) -> None:
        attempts = self.tries()
        for attempt in attempts:
            driver = make()
            recorder = Recorder()
            driver.set_callback(recorder)
            assert driver.debounce_duration_ms == 50, (
                "Debounce: expected set_callback's default debounce_duration_ms 50; got "
                f"{driver.debounce_duration_ms}"
            )
            model = self.model(driver)
            long, short = self.work(driver, model, 40), self.work(driver, model, 2)
            works = [driver.submit(model, uid=5, **long)]
            self.wait_ms(driver, 5)
            first = functools.partial(self.running, driver, works[0])
            self.wait_until(driver, first, "the first start")
            works += [driver.submit(model, uid=5, **short) for _ in "ab"]
            # Back to back (the premise): the others came while the first still ran ...
            if not first() and attempt != attempts[-1]:
                continue
            if self.virtual:
                driver.advance(50 * MS)
                early = [name for name, _, _ in recorder.calls]
                assert "ended" not in early, (
                    "Debounce: ENDED must be held until the uid has been idle for the window; "
                    f"got {early} 15 ms after the last ended"
                )
            self.settle(driver)
            # ... and each started within the window of the one before it ending: a busy
            # machine may start the next a window late, and then the uid was idle that long.
            if not _idle_for_a_window(recorder, 50) or attempt == attempts[-1]:
                break
        names = [name for name, _, _ in recorder.calls]
        assert names == ["requested", "started", "ended"], (
            "Debounce: back-to-back work of one uid must give one Requested, one Started and, "
            f"after the window, one Ended; got {names}"
        )
        assert recorder.calls[0][1].id == works[0], (
            f"Debounce: expected the Requested sent to be work {works[0]}'s; got "
            f"{recorder.calls[0][1].id}"
        )
        driver.submit(model, uid=6, **self.work(driver, model, 2))
        self.settle(driver)
        assert [name for name, _, _ in recorder.calls][3:] == ["requested", "started", "ended"], (
            "Debounce: the window is per uid; expected another uid's work reported; got "
            f"{[name for name, _, _ in recorder.calls][3:]}"
        )

    def ended_delivery(self, driver: Driver, recorder: Recorder, work: int) -> tuple[int, int]:
        """(Ended's timestampMs, an upper bound of the driver clock in ms when it arrived)."""

        def ended() -> list[WorkInfo]:
            return [i for name, i, _ in recorder.calls if name == "ended" and i.id == work]

        self.wait_until(driver, lambda: bool(ended()), f"work {work}'s Ended")
        return ended()[0].timestamp_ms, driver.now_us // 1000  # read after: it came before

    def test_DebounceHoldsEnded(self, make: Callable[..., Driver]) -> None:
        driver = make()
        recorder = Recorder()
        driver.set_callback(recorder, debounce_duration_ms=50)
        model = self.model(driver)
        work = driver.submit(model, uid=7, **self.work(driver, model, 2))
        stamp, delivered = self.ended_delivery(driver, recorder, work)
        assert delivered >= stamp + 50, (
            "DebounceHoldsEnded: expected Ended held for the 50 ms window, delivered at or "
            f"after {stamp + 50} ms; observed it delivered by {delivered} ms"
        )

    def test_DebounceSuppressesWithinWindow(self, make: Callable[..., Driver]) -> None:
        for attempt in self.tries():
            # A busy machine may let the window pass before the second submit: each try
            # holds Ended longer (0.4, 2, then 10 s), which the rule's meaning allows.
            window_ms = min(400 * 5**attempt, 10_000)
            driver = make()
            recorder = Recorder()
            driver.set_callback(recorder, debounce_duration_ms=window_ms)
            model = self.model(driver)
            first = driver.submit(model, uid=8, **self.work(driver, model, 2))
            self.wait_until(driver, functools.partial(self.idle, driver), "the first work's end")
            if self.virtual:
                driver.advance(10 * 1000)
            if "ended" not in [name for name, _, _ in recorder.calls]:
                break
        else:
            pytest.skip(f"the {window_ms} ms window passed before the second submit every time")
        second = driver.submit(model, uid=8, **self.work(driver, model, 2))
        self.settle(driver)
        assert recorder.of(second) == [("ended", "COMPLETED")], (
            "DebounceSuppressesWithinWindow: expected only Ended(COMPLETED) for work submitted "
            f"while uid 8's Ended was held; observed {recorder.of(second)}"
        )
        assert [c for c, _ in recorder.of(first)] == ["requested", "started"], (
            "DebounceSuppressesWithinWindow: expected the first work's Ended replaced by the "
            f"second's; observed {recorder.of(first)}"
        )

    def test_DebounceZero(self, make: Callable[..., Driver]) -> None:
        driver = make()
        recorder = Recorder()
        driver.set_callback(recorder, debounce_duration_ms=0)
        assert driver.debounce_duration_ms == 0, (
            f"DebounceZero: expected a window of 0 held; got {driver.debounce_duration_ms}"
        )
        model = self.model(driver)
        works = [driver.submit(model, uid=5, **self.work(driver, model, 2)) for _ in range(3)]
        self.settle(driver)
        for work in works:
            assert [c for c, _ in recorder.of(work)] == ["requested", "started", "ended"], (
                "DebounceZero: with a window of 0 every event must be delivered; "
                f"work {work} got {recorder.of(work)}"
            )
        with pytest.raises(IllegalArgumentError):
            driver.set_callback(recorder, debounce_duration_ms=-1)
            pytest.fail("DebounceZero: a negative window must be an illegal argument")

    def test_UnloadFreesItsBytes(self, make: Callable[..., Driver]) -> None:
        driver = make([SMALL])
        big = driver.load_model(0, weight_bytes=600)
        small = driver.load_model(0, weight_bytes=300)
        with pytest.raises(CapacityError):
            driver.load_model(0, weight_bytes=700)
            pytest.fail("UnloadFreesItsBytes: expected 700 bytes refused with 100 free")
        driver.unload_model(big)
        used = driver.device_state(0).weight_memory_used_bytes
        assert used == 300, (
            f"UnloadFreesItsBytes: expected 300 bytes used after unloading 600 of 900; got {used}"
        )
        try:
            later = driver.load_model(0, weight_bytes=700)
        except CapacityError as exc:
            pytest.fail(f"UnloadFreesItsBytes: expected 700 bytes to fit after the unload; {exc}")
        for model in (small, later):
            driver.unload_model(model)
        state = driver.device_state(0)
        got = (state.weight_memory_used_bytes, state.models_loaded)
        assert got == (0, 0), f"UnloadFreesItsBytes: expected (0, 0) at the end; got {got}"

    def test_MemoryAccounting(self, make: Callable[..., Driver], npu_seed: int) -> None:
        driver = make([SMALL])
        rng = random.Random(npu_seed)
        loaded: dict[int, int] = {}
        ops: list[str] = []
        for _ in range(60):
            if loaded and rng.random() < 0.4:
                model = rng.choice(sorted(loaded))
                ops.append(f"unload({loaded[model]})")
                driver.unload_model(model)
                del loaded[model]
            else:
                size = rng.choice((1, 64, 250, 333, 600, 999))
                fits = size <= 1000 - sum(loaded.values())
                ops.append(f"load({size})")
                try:
                    loaded[driver.load_model(0, weight_bytes=size)] = size
                    refused = False
                except CapacityError:
                    refused = True
                assert refused != fits, (
                    f"MemoryAccounting: expected load({size}) {'accepted' if fits else 'refused'}"
                    f" with {1000 - sum(loaded.values())} bytes free; ops {ops}"
                )
            state = driver.device_state(0)
            want = (sum(loaded.values()), len(loaded))
            got = (state.weight_memory_used_bytes, state.models_loaded)
            assert got == want, (
                f"MemoryAccounting: expected (bytes used, models) {want}, the sum of what is "
                f"loaded; observed {got} after {ops}"
            )

    def test_UnloadCancelsItsWork(self, make: Callable[..., Driver]) -> None:
        driver = make([ONE_CHANNEL])
        model = self.model(driver)
        other = self.model(driver)
        running = driver.submit(model, uid=9, **self.work(driver, model, 100))
        queued = driver.submit(model, uid=9, **self.work(driver, model, 1))
        kept = driver.submit(other, uid=9, **self.work(driver, other, 1))
        self.wait_ms(driver, 5)
        driver.unload_model(model)
        self.settle(driver)
        events = driver.take_events()
        want = {running: "CANCELLED_SYSTEM", queued: "CANCELLED_SYSTEM", kept: "COMPLETED"}
        got = {w: getattr(final_reason(events, w), "name", None) for w in want}
        assert got == want, (
            f"UnloadCancelsItsWork: expected the unloaded model's work to end CANCELLED_SYSTEM "
            f"and the other's to complete, {want}; observed {got}"
        )
        with pytest.raises(LookupError):
            driver.submit(model, uid=9, cost_cycles=1)
            pytest.fail("UnloadCancelsItsWork: expected a LookupError for an unloaded model")

    def test_CapacityErrorLeavesNothingLoaded(self, make: Callable[..., Driver]) -> None:
        driver = make([DeviceSpec(weight_memory_bytes=1000, sram_bytes=64)])
        driver.load_model(0, weight_bytes=600)
        before = driver.device_state(0)
        with pytest.raises(CapacityError):
            driver.load_model(0, weight_bytes=500)
            pytest.fail("Capacity: a model bigger than the free weight memory must not load")
        with pytest.raises(CapacityError):
            driver.load_model(0, weight_bytes=1, sram_bytes=65)
            pytest.fail("Capacity: a model needing more SRAM than the device has must not load")
        after = driver.device_state(0)
        assert (after.weight_memory_used_bytes, after.models_loaded) == (
            before.weight_memory_used_bytes,
            before.models_loaded,
        ), f"Capacity: expected a refused load to leave nothing half-loaded; got {after}"
        driver.load_model(0, weight_bytes=400)
        assert driver.device_state(0).weight_memory_used_bytes == 1000, (
            "Capacity: expected exactly the free space to fit after refused loads; got "
            f"{driver.device_state(0).weight_memory_used_bytes} of 1000 used"
        )

    def check_numbering(self, driver: Driver, count: int) -> None:
        numbers = [d.number for d in driver.describe_devices()]
        assert numbers == list(range(count)), (
            f"DeviceNumbering: expected {count} devices numbered from 0, {list(range(count))}; "
            f"got {numbers}"
        )
        models = [self.model(driver, n) for n in range(count)]
        works = [driver.submit(m, uid=1, **self.work(driver, m, 1)) for m in models]
        self.settle(driver)
        events = driver.take_events()
        where = {e.id: e.device_number for e in events}
        want = dict(zip(works, range(count), strict=True))
        assert where == want, (
            "DeviceNumbering: expected each work's events to name the device it ran on "
            f"(work id: device) {want}; got {where}"
        )
        with pytest.raises(LookupError):
            driver.load_model(count, weight_bytes=1)
            pytest.fail(f"DeviceNumbering: device {count} does not exist and must be refused")

    def test_DeviceNumbering(self, make: Callable[..., Driver]) -> None:
        self.check_numbering(make(), 1)

    @requires(DriverCapability.MULTI_DEVICE)
    def test_DeviceNumberingMultiDevice(self, make: Callable[..., Driver]) -> None:
        self.check_numbering(make([DeviceSpec(channels=1) for _ in range(3)]), 3)

    @requires(DriverCapability.THERMAL_MODEL)
    def test_ThermalModel(self, make: Callable[..., Driver]) -> None:
        driver = make()
        before = driver.device_state(0).temperature_mc
        driver.add_heat(0, 20_000)
        after = driver.device_state(0).temperature_mc
        assert after >= before + 15_000, (
            f"ThermalModel: add_heat must raise the device temperature; {before} -> {after}"
        )

    @requires(DriverCapability.VIRTUAL_TIME)
    def test_MatchesReferenceDevice(self, driver_factory: Factory, npu_seed: int) -> None:
        from npumanager.testing.stateful import check_against_reference

        thermal = DriverCapability.THERMAL_MODEL in self._caps
        check_against_reference(driver_factory, seed_value=npu_seed, thermal=thermal)


def _idle_for_a_window(recorder: Recorder, window_ms: int) -> bool:
    """An Ended reported, then a Started whose work began at least `window_ms` after it:
    the uid was idle for the window in between, and both were rightly reported."""
    calls = recorder.calls
    return any(
        before[0] == "ended"
        and after[0] == "started"
        and after[1].timestamp_ms - before[1].timestamp_ms >= window_ms
        for before, after in itertools.pairwise(calls)
    )
