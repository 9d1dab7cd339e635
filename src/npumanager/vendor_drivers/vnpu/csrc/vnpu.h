/* vnpu: the simulated NPU of npu-manager, in C.
 *
 * The same device as vendor_drivers/reference/engine.py (the oracle), event for event.
 * All state lives in one handle; one mutex per handle guards it. Every function returns
 * VNPU_OK (0) or a negative VNPU_E_* code and writes results through pointer arguments.
 *
 * The text between the VNPU_CDEF markers is also the cffi cdef (read by ../_build.py,
 * which turns each `#define NAME value` into `#define NAME ...`), so it holds only
 * declarations that cffi's parser understands.
 */
#ifndef VNPU_H
#define VNPU_H

#include <stdint.h>

/* VNPU_CDEF_BEGIN */

enum {
    VNPU_OK = 0,
    VNPU_E_INVAL = -1,   /* a bad argument */
    VNPU_E_NOMODEL = -2, /* the model handle is not loaded */
    VNPU_E_NOWORK = -3,  /* the work id is not live */
    VNPU_E_NODEV = -4,   /* no such device */
    VNPU_E_NOMEM = -5,   /* capacity: weights, SRAM, model table, or memory */
    VNPU_E_AGAIN = -6,   /* stopped early: the event queue is full; drain and call again */
    VNPU_E_CLOSED = -7   /* the handle was closed */
};

enum { VNPU_CLOCK_VIRTUAL = 0, VNPU_CLOCK_REAL = 1 };

enum { VNPU_KIND_REQUESTED = 0, VNPU_KIND_STARTED = 1, VNPU_KIND_ENDED = 2 };

enum {
    VNPU_NO_REASON = -1,
    VNPU_START_INITIAL = 0,
    VNPU_START_RESUMED = 1,
    VNPU_END_CANCELLED_USER = 0,
    VNPU_END_CANCELLED_SYSTEM = 1,
    VNPU_END_PAUSED = 2,
    VNPU_END_FAILED = 3,
    VNPU_END_COMPLETED = 4
};

enum {
    VNPU_MAX_DEVICES = 16,
    VNPU_MAX_CHANNELS = 64,
    VNPU_LEVELS = 6,             /* LIGHT..SHUTDOWN thresholds; severities 0..6 */
    VNPU_SEVERITY_SHUTDOWN = 6,
    VNPU_MIN_PRIORITY = 0,
    VNPU_MAX_PRIORITY = 1000,
    VNPU_MAX_LIVE_WORK = 16777216,
    VNPU_MAX_MODELS = 1048576,
    VNPU_MAX_EVENT_CAPACITY = 16777216,
    VNPU_MAX_BURST = 65536,
    VNPU_MAX_HEAT_STEP_MC = 1000000000,
    VNPU_MAX_BANDS = 8,
    VNPU_FAIR_WEIGHT_BASE = 100,
    VNPU_MAX_FLOOR_PERCENT = 50
};

enum { VNPU_SCHED_STRICT = 0, VNPU_SCHED_FAIR = 1 };

/* The time horizon: no event point happens at or after it (the reference's NEVER). */
#define VNPU_NEVER 4611686018427387904
/* Largest slice_us, tick_us, period_us and start_us accepted (INT64_MAX // 4). */
#define VNPU_MAX_SPAN_US 2305843009213693951
/* Largest |temperature| in a spec, and largest heat per busy channel (2**40 m°C). */
#define VNPU_MAX_SPEC_MC 1099511627776
/* Largest sram_bytes of a device: 64 running jobs' SRAM must sum within int64. */
#define VNPU_MAX_SRAM_BYTES 144115188075855871
/* Largest cost_cycles of one job (INT64_MAX // 100 centi-cycles). */
#define VNPU_MAX_COST_CYCLES 92233720368547758
/* Largest floor window: floor credits stay within int64. */
#define VNPU_MAX_FLOOR_WINDOW_US 1000000000000

typedef struct vnpu_handle vnpu_handle;

/* One device, as schemas.device.DeviceSpec (thermal fields flattened; bands as the first
 * effective priority of each, most important first). */
typedef struct {
    int32_t channels;
    int32_t scheduler;
    int32_t nbands;
    int64_t band_first[8];
    int64_t floor_percent;
    int64_t floor_window_us;
    int64_t sram_bytes;
    int64_t weight_memory_bytes;
    int64_t clock_mhz;
    int64_t slice_us;
    int64_t ambient_mc;
    int64_t tick_us;
    int64_t heat_per_busy_channel_mc;
    int64_t cooling_permille;
    int64_t thresholds_mc[6];
    int64_t throttle_percent[6];
} vnpu_spec;

/* One SchedulingConfig; six int32 fields, no padding (Python passes a flat int32 array). */
typedef struct {
    int32_t uid;
    int32_t min_priority;
    int32_t max_priority;
    int32_t app_priority;
    int32_t has_direct_access;
    int32_t can_attribute_other_uid;
} vnpu_config;

/* One work event: every field int64, in core.events.WorkEvent order. group_idx and
 * feature_idx are the caller's interned indices (-1 for None). */
typedef struct {
    int64_t kind;
    int64_t reason;
    int64_t id;
    int64_t group_idx;
    int64_t uid;
    int64_t debug_pid;
    int64_t original_uid;
    int64_t feature_idx;
    int64_t job_priority;
    int64_t effective_priority;
    int64_t timestamp_ms;
    int64_t device;
    int64_t time_us;
    int64_t model;
} vnpu_event;

/* A reading of one device, as schemas.device.DeviceStatus. */
typedef struct {
    int64_t now_us;
    int64_t weight_memory_bytes;
    int64_t weight_memory_used_bytes;
    int64_t sram_used_bytes;
    int64_t models_loaded;
    int64_t queue_depth;
    int64_t temperature_mc;
    int64_t peak_temperature_mc;
    int64_t severity;
    int64_t throttled_us;
    int64_t shutdown;
    int64_t channels;
    int64_t running[64];
} vnpu_reading;

/* Counters of the whole handle. */
typedef struct {
    int64_t live_work;
    int64_t models;
    int64_t generators;
    int64_t pending_events;
    int64_t events_total;
    int64_t dropped_events;
    int64_t stalls;
    int64_t next_work_id;
    int64_t sleeping; /* worker threads waiting for their device's next event point */
} vnpu_counters;

/* Create a handle: `ndevices` specs, pools of `max_live_work` jobs and `max_models`
 * models, an event queue of soft capacity `event_capacity`, and the clock. `unknown` is
 * the config a uid without one schedules by (its uid field is ignored).
 *
 * On the real clock time is CLOCK_MONOTONIC microseconds and one worker thread per device
 * sleeps until its device's next event point, then performs every event point due by
 * then (all devices, in the virtual clock's order), stamped with its own time. Every call
 * first performs the event points due by now and then its own (the device it made dirty),
 * so it acts exactly as advance_to(now) then the call would. While the event queue holds
 * `event_capacity` events or more, workers wait for a drain and calls perform no further
 * event points: the device clock then lags wall time, and nothing blocks a caller. */
int vnpu_create(const vnpu_spec *specs, int32_t ndevices, int32_t max_live_work,
                int32_t max_models, int32_t event_capacity, int32_t clock_mode,
                const vnpu_config *unknown, vnpu_handle **out);
/* Stop the worker threads; later calls return VNPU_E_CLOSED. Idempotent. */
int vnpu_close(vnpu_handle *h);
/* Close and free the handle. */
int vnpu_destroy(vnpu_handle *h);

/* Replace the whole set of configs; live work is re-ranked. All or nothing. */
int vnpu_configure(vnpu_handle *h, const vnpu_config *configs, int32_t n);
int vnpu_load_model(vnpu_handle *h, int32_t device, int64_t weight_bytes, int64_t sram_bytes,
                    int64_t *out_model);
int vnpu_unload_model(vnpu_handle *h, int64_t model);
int vnpu_submit(vnpu_handle *h, int64_t model, int32_t uid, int32_t original_uid,
                int32_t job_priority, int64_t cost_cycles, int32_t group_idx,
                int32_t feature_idx, int32_t debug_pid, int64_t *out_id);
int vnpu_add_periodic(vnpu_handle *h, int64_t model, int32_t uid, int32_t original_uid,
                      int32_t job_priority, int64_t cost_cycles, int64_t period_us,
                      int64_t start_us, int32_t count, int32_t burst, int32_t group_idx,
                      int32_t feature_idx, int32_t debug_pid);
/* End one live job now with `reason` (an EndReason value). */
int vnpu_end_work(vnpu_handle *h, int64_t work_id, int32_t reason);
int vnpu_add_heat(vnpu_handle *h, int32_t device, int64_t millicelsius);

/* Virtual clock only: run event points up to `target_us` (< VNPU_NEVER). Returns
 * VNPU_E_AGAIN at an event-point boundary once the queue holds >= event_capacity events. */
int vnpu_advance_to(vnpu_handle *h, int64_t target_us);
int vnpu_now(vnpu_handle *h, int64_t *out_us);
int vnpu_next_event(vnpu_handle *h, int64_t *out_us);
int vnpu_idle(vnpu_handle *h, int32_t *out_idle);
int vnpu_status(vnpu_handle *h, int32_t device, vnpu_reading *out);
int vnpu_stats(vnpu_handle *h, vnpu_counters *out);

/* Move up to `cap` events, oldest first, into `buf` (which holds at least `cap` records);
 * `*out_n` says how many. Draining wakes workers held up by a full queue. */
int vnpu_drain(vnpu_handle *h, vnpu_event *buf, int32_t cap, int32_t *out_n);
/* Real clock only: an eventfd that is readable while the event queue is not empty. */
int vnpu_fileno(vnpu_handle *h, int32_t *out_fd);
/* CLOCK_MONOTONIC in microseconds, the real clock's time base. */
int vnpu_monotonic_us(int64_t *out_us);

/* Benchmark, virtual clock: n times {submit one job; advance event point by event point
 * until idle; drain every queued event into `scratch`}, all in C. `*out_events` counts
 * the events drained (any queued before the call among them). */
int vnpu_bench_single(vnpu_handle *h, int64_t model, int64_t n, int32_t uid,
                      int64_t cost_cycles, int32_t job_priority, vnpu_event *scratch,
                      int32_t scratch_cap, int64_t *out_events);

/* VNPU_CDEF_END */

#endif /* VNPU_H */
