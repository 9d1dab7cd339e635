"""Types of the compiled cffi module (built from csrc/vnpu.h by _build.py)."""

from typing import Any

CData = Any

class _Lib:
    VNPU_OK: int
    VNPU_E_INVAL: int
    VNPU_E_NOMODEL: int
    VNPU_E_NOWORK: int
    VNPU_E_NODEV: int
    VNPU_E_NOMEM: int
    VNPU_E_AGAIN: int
    VNPU_E_CLOSED: int
    VNPU_CLOCK_VIRTUAL: int
    VNPU_CLOCK_REAL: int
    VNPU_KIND_REQUESTED: int
    VNPU_KIND_STARTED: int
    VNPU_KIND_ENDED: int
    VNPU_NO_REASON: int
    VNPU_START_INITIAL: int
    VNPU_START_RESUMED: int
    VNPU_END_CANCELLED_USER: int
    VNPU_END_CANCELLED_SYSTEM: int
    VNPU_END_PAUSED: int
    VNPU_END_FAILED: int
    VNPU_END_COMPLETED: int
    VNPU_MAX_DEVICES: int
    VNPU_MAX_CHANNELS: int
    VNPU_LEVELS: int
    VNPU_SEVERITY_SHUTDOWN: int
    VNPU_MIN_PRIORITY: int
    VNPU_MAX_PRIORITY: int
    VNPU_MAX_LIVE_WORK: int
    VNPU_MAX_MODELS: int
    VNPU_MAX_EVENT_CAPACITY: int
    VNPU_MAX_BURST: int
    VNPU_MAX_HEAT_STEP_MC: int
    VNPU_MAX_BANDS: int
    VNPU_FAIR_WEIGHT_BASE: int
    VNPU_MAX_FLOOR_PERCENT: int
    VNPU_SCHED_STRICT: int
    VNPU_SCHED_FAIR: int
    VNPU_MAX_FLOOR_WINDOW_US: int
    VNPU_NEVER: int
    VNPU_MAX_SPAN_US: int
    VNPU_MAX_SPEC_MC: int
    VNPU_MAX_SRAM_BYTES: int
    VNPU_MAX_COST_CYCLES: int

    def vnpu_create(
        self,
        specs: CData,
        ndevices: int,
        max_live_work: int,
        max_models: int,
        event_capacity: int,
        clock_mode: int,
        unknown: CData,
        out: CData,
    ) -> int: ...
    def vnpu_close(self, h: CData) -> int: ...
    def vnpu_destroy(self, h: CData) -> int: ...
    def vnpu_configure(self, h: CData, configs: CData, n: int) -> int: ...
    def vnpu_load_model(
        self, h: CData, device: int, weight_bytes: int, sram_bytes: int, out_model: CData
    ) -> int: ...
    def vnpu_unload_model(self, h: CData, model: int) -> int: ...
    def vnpu_submit(
        self,
        h: CData,
        model: int,
        uid: int,
        original_uid: int,
        job_priority: int,
        cost_cycles: int,
        group_idx: int,
        feature_idx: int,
        debug_pid: int,
        out_id: CData,
    ) -> int: ...
    def vnpu_add_periodic(
        self,
        h: CData,
        model: int,
        uid: int,
        original_uid: int,
        job_priority: int,
        cost_cycles: int,
        period_us: int,
        start_us: int,
        count: int,
        burst: int,
        group_idx: int,
        feature_idx: int,
        debug_pid: int,
    ) -> int: ...
    def vnpu_end_work(self, h: CData, work_id: int, reason: int) -> int: ...
    def vnpu_add_heat(self, h: CData, device: int, millicelsius: int) -> int: ...
    def vnpu_advance_to(self, h: CData, target_us: int) -> int: ...
    def vnpu_now(self, h: CData, out_us: CData) -> int: ...
    def vnpu_next_event(self, h: CData, out_us: CData) -> int: ...
    def vnpu_idle(self, h: CData, out_idle: CData) -> int: ...
    def vnpu_status(self, h: CData, device: int, out: CData) -> int: ...
    def vnpu_stats(self, h: CData, out: CData) -> int: ...
    def vnpu_drain(self, h: CData, buf: CData, cap: int, out_n: CData) -> int: ...
    def vnpu_fileno(self, h: CData, out_fd: CData) -> int: ...
    def vnpu_monotonic_us(self, out_us: CData) -> int: ...
    def vnpu_bench_single(
        self,
        h: CData,
        model: int,
        n: int,
        uid: int,
        cost_cycles: int,
        job_priority: int,
        scratch: CData,
        scratch_cap: int,
        out_events: CData,
    ) -> int: ...

ffi: Any
lib: _Lib
