"""Every numeric limit and default of the system, defined once."""

from __future__ import annotations

from typing import Final

INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

MIN_PRIORITY: Final = 0
"""The HAL's most important priority: lower numbers run first."""
MAX_PRIORITY: Final = 1000
"""The HAL's least important app or job priority."""
MAX_EFFECTIVE_PRIORITY: Final = MAX_PRIORITY + MAX_PRIORITY
"""An effective priority is an app priority plus a job priority, so at most 2000."""

DEBOUNCE_DURATION_MS: Final = 50
"""The platform's default debounce window for scheduling callbacks."""

ROOT_UID: Final = 0
SYSTEM_UID: Final = 1000
PINNED_PRIORITY: Final = 100
"""System and root uids are pinned at this priority, whatever their importance."""
UNKNOWN_UID_PRIORITY: Final = 1000
"""A uid the service knows nothing about gets the least important app priority."""

DEFAULT_BUDGET_WEIGHTS: Final = (1, 2, 4)
"""Budget policy weight of each size class, smallest class first."""
DEFAULT_MAX_BUDGET: Final = 4
"""Budget policy total that the weights of admitted loads may not exceed."""

MAX_PLUGIN_NAME_LENGTH: Final = 64
PLUGIN_NAME_PATTERN: Final = r"^[a-z][a-z0-9_-]*$"
"""Names of drivers, policies and sinks: lower case, digits, '-' and '_'."""

MAX_DEVICES: Final = 16
"""Devices one simulated driver may hold."""
MAX_CHANNELS: Final = 64
"""Execution channels one simulated device may have."""
DEFAULT_MAX_LIVE_WORK: Final = 1 << 16
"""Queued plus running work a simulated driver holds before new work fails."""
DEFAULT_MAX_MODELS: Final = 1024
"""Models a simulated driver holds loaded at once."""
DEFAULT_EVENT_RING: Final = 1 << 16
"""Raw events a simulated driver buffers before the reader must drain."""
MAX_LIVE_WORK: Final = 1 << 24
"""The largest ``max_live_work`` a simulated driver may be opened with."""
MAX_MODELS: Final = 1 << 20
"""The largest ``max_models`` a simulated driver may be opened with."""
MAX_COST_CYCLES: Final = INT64_MAX // 100
"""The costliest job, in cycles: its remaining work times a throttle percentage fits int64."""
MAX_PERIODIC_US: Final = INT64_MAX // 4
"""The latest start and the longest period of device-generated arrivals."""
MAX_BURST: Final = 1 << 16
"""Jobs one periodic arrival may bring at once."""
MAX_HEAT_STEP_MC: Final = 10**9
"""The largest thermal spike (up or down) `~npumanager.EngineDriver.add_heat` takes, in
milli-degrees Celsius."""
MAX_RUNTIME_DEVICES: Final = 1 << 10
"""Devices a driver over a real runtime (``onnxruntime``, ``openvino``) may open."""
MAX_INTRA_OP_THREADS: Final = 256
"""Threads one real-runtime session may use inside an operator."""
MAX_RUNTIME_OPTIONS: Final = 16
"""Runtime options (``load_model(options=)``) one model load may carry."""
MAX_RUNTIME_OPTION_KEY: Final = 64
"""Characters of a runtime option's name, its runtime's prefix included."""
MAX_RUNTIME_OPTION_VALUE: Final = 128
"""Characters of a runtime option's value."""
RUNTIME_OPTION_KEY_PATTERN: Final = r"^[a-z][a-z0-9_]*\.[A-Za-z0-9_][A-Za-z0-9_.-]*$"
"""A runtime option's name: its runtime (``onnxruntime``, ``openvino``), a dot, the
runtime's own name for it."""
DEFAULT_RUN_UNTIL_IDLE_MS: Final = 60_000
"""How much virtual time `~npumanager.Service.run_until_idle` gives at most, unless told."""

DEFAULT_UNLOAD_GRACE_MS: Final = 5_000
"""How long a client asked to unload may take before its models are revoked."""
NPU_FEATURE: Final = "android.hardware.npu"
"""The feature name a client declares to use the NPU (the platform's uses-feature)."""

GIB: Final = 1 << 30
NOMINAL_MODEL_BYTES: Final = (1 * GIB, 2 * GIB, 4 * GIB)
"""Bytes the pressure policy counts for a request that gave no size, per size class."""
DEFAULT_DEVICE_CAPACITY_BYTES: Final = (4 * GIB,)
"""Weight memory the pressure policy assumes until the driver reports its devices."""
MEMORY_PRESSURE_NONE: Final = 0
"""Memory pressure level with no pressure: nothing is unloaded for memory."""
MEMORY_PRESSURE_MODERATE: Final = 1
"""Memory pressure level at which opportunistic models are unloaded."""
MEMORY_PRESSURE_CRITICAL: Final = 2
"""Memory pressure level at which background-priority models are unloaded too."""

SIMULATION_HORIZON_US: Final = 1 << 62
"""Virtual time never reaches this: the simulated drivers' "never" and their clock limit."""

PROTOCOL_VERSION: Final = 4
"""The daemon's wire protocol version; a hello with another version is refused (2: real
models by descriptor, tensors in shared memory; 3: inference lanes)."""
MAX_FRAME_BYTES: Final = 1 << 20
"""The largest frame body the daemon or a client accepts."""
FRAME_HEADER_BYTES: Final = 4
"""Every frame starts with its body's length as a big-endian unsigned 32-bit int."""
MAX_OUTBOX_BYTES: Final = 8 << 20
"""Bytes the daemon queues for a client that does not read before it drops the client."""
HELLO_TIMEOUT_S: Final = 10.0
"""A daemon connection that has not said hello by then is closed."""
SOCKET_MODE: Final = 0o660
"""The daemon's socket: read and write for its owner and group only."""

DEFAULT_SINK_QUEUE_EVENTS: Final = 1 << 16
"""Events a sink's queue holds before new batches are dropped (real time) or handed over."""
MAX_SINK_QUEUE_EVENTS: Final = 1 << 26
"""The largest queue a sink registration may ask for."""
MAX_DEBOUNCE_DURATION_MS: Final = 3_600_000
"""The longest debounce window a sink registration may ask for: an hour."""
SINK_CLOSE_TIMEOUT_S: Final = 5.0
"""How long closing waits for a real-time sink's worker to hand over what is queued."""
HEALTH_SAMPLE_INTERVAL_MS: Final = 50
"""Device health reaches sinks at least this often in virtual time (simulations), and at once
when severity or memory change."""
DEFAULT_HEALTH_INTERVAL_MS: Final = 1000
"""The same in real time (the daemon, ``serve --health-interval-ms``): an idle device is one
sample a second, not twenty."""
MAX_HEALTH_INTERVAL_MS: Final = 3_600_000
"""The longest health sample interval a service may ask for: an hour."""
LOG_DIR_APP_NAME: Final = "npu-manager"
"""The platformdirs application name of the per-user log directory."""
DEFAULT_JSONL_MAX_BYTES: Final = 16 << 20
"""Size at which the ``jsonl`` sink rotates its file."""
DEFAULT_JSONL_BACKUPS: Final = 3
"""Rotated files the ``jsonl`` sink keeps."""
JSONL_FLUSH_INTERVAL_S: Final = 1.0
"""The ``jsonl`` sink flushes its file at most this often (and on close)."""
JSONL_RETRY_INTERVAL_S: Final = 10.0
"""After a write fails (a full disk), the ``jsonl`` sink drops events and tries its file
again at most this often, logging one line when it fails and one when it writes again."""
WORK_DURATION_BUCKETS_S: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Histogram buckets of ``npu_work_duration_seconds``, from half a millisecond to ten seconds."""
PROGRESS_AFTER_S: Final = 1.0
"""A simulation shows a progress bar once it has run this long in wall time."""
PROGRESS_REDRAW_S: Final = 0.1
"""The progress bar is redrawn at most this often."""

GRANT_ALLOWANCE_BYTES: Final = NOMINAL_MODEL_BYTES
"""Weight bytes one grant may load, per size class, when the request declared no bytes: what
the pressure policy counts for it, so the arbiter's accounting never falls below the device's."""


def grant_allowance_bytes(size_class: int, declared_bytes: int | None) -> int:
    """The weight bytes a granted request may hold loaded: its declared bytes, or its class's."""
    if declared_bytes is not None:
        return declared_bytes
    return GRANT_ALLOWANCE_BYTES[size_class]


UID_MAX: Final = 2**32 - 2
"""The largest uid or gid Linux gives a process ((uid_t)-1 means "no uid")."""
DEFAULT_MAX_CONNECTIONS_PER_UID: Final = 64
"""Daemon connections one uid may hold open (management is exempt)."""
DEFAULT_MAX_REQUESTS_PER_UID: Final = 1024
"""Live model-load requests one uid may hold through the daemon (management is exempt)."""
DEFAULT_MAX_MODELS_PER_UID: Final = 64
"""Models one uid may hold loaded through the daemon (management is exempt)."""
DEFAULT_MAX_REQUESTS_PER_APP: Final = DEFAULT_MAX_REQUESTS_PER_UID // 4
"""Live requests one app (found by its cgroup) may hold: a person's uid runs several apps,
and one of them must not take the whole uid's share."""
DEFAULT_MAX_MODELS_PER_APP: Final = DEFAULT_MAX_MODELS_PER_UID // 4
"""Models one app (found by its cgroup) may hold loaded."""
DEFAULT_MAX_HOSTS_PER_UID: Final = 8
"""Model hosts one real uid may have at once (one per app: ``daemon.server.hosting``); each
holds a runtime, about 90-100 MiB resident before any model."""
DEFAULT_MAX_HOSTS: Final = 128
"""Model hosts the daemon runs at once, over every uid."""
DEFAULT_MAX_BUFFERED_BYTES: Final = 64 << 20
"""Bytes the daemon buffers for all clients together (partial frames and unread replies);
past it, the connection buffering the most is dropped."""
DAEMON_SWITCH_INTERVAL_S: Final = 0.0005
"""The daemon's GIL switch interval (Python's default is 5 ms): how long a thread ready to
run may wait for one holding the interpreter."""
DEFAULT_MAX_SHARED_BYTES: Final = 256 << 20
"""The largest shared-memory segment one daemon connection may attach for its tensors."""
DEFAULT_CLIENT_SHARED_BYTES: Final = 64 << 20
"""The segment a daemon client makes for its tensors unless told (pages cost nothing until
touched)."""
DEFAULT_LANE_SPIN_US: Final = 200
"""How long a client polls its lane for a reply before it sleeps in ``recv``, while the lane's
replies have been coming within that (``connect(lane_spin_us=...)``; 0: never poll)."""
MAX_LANE_SPIN_US: Final = 10_000
LANE_AGAIN_S: Final = 1.0
"""How long a daemon client whose lane the daemon refused runs on its connection before it
asks for a lane again (the refusal may pass: the last lane may still be winding down)."""
DEFAULT_LEASE_US: Final = 5000
"""How long a model host's grant leases its channel for further runs of the same model and
priority without asking the daemon (``serve --lease-us``; 0: it asks before every run).
Measured (``benchmarks/data_plane.py --lease-us``): at 2 ms half of a 0.8 ms model's runs
still asked; at 5 ms a fifth did, and longer leases gained nothing more."""
MAX_LEASE_US: Final = 100_000
LEASE_IDLE_US: Final = 200
"""How long a model host holding a lease waits for its client's next request before it
gives the lease back, so that an idle lease does not keep the device from others."""
AUDIT_PERIOD_S: Final = 0.5
"""How often the daemon reads each model host's CPU time from the kernel and holds it to
the host's grants (``daemon.server.audit``)."""
AUDIT_ALLOWANCE: Final = 0.25
"""The share of one CPU a model host may use outside its grants (its own upkeep)."""
AUDIT_STRIKES: Final = 3
"""Periods over its grants (less one for each within them) after which a host is killed."""
THROTTLE_S: Final = 0.5
"""How long a model host over its grants is stopped (SIGSTOP) before it may go on."""
LEASE_OVERRUN_S: Final = 0.1
"""How long past its deadline a lease may go before the daemon takes it back and frees its
channel (the run in progress keeps its grant, for the audit, until the host speaks again)."""
STOPPED_GRANT_S: Final = 1.0
"""How long a model host's grant still counts, for the audit, after the daemon stopped the
run under it (a cancel, an unload, room made): a host that goes on computing past it is
over its grants (throttled, then killed), as one that ran without asking would be."""
DEFAULT_MAX_INFERENCES_PER_CONNECTION: Final = 256
"""Inferences one daemon connection may have in flight (with the per-uid connection cap,
one uid cannot fill the driver's live work)."""
DEFAULT_MAX_MODEL_FILE_BYTES: Final = 2 * GIB
"""The largest model file the daemon reads from a client's descriptor."""
MAX_LOADS_PER_CONNECTION: Final = 2
"""Model loads one daemon connection may have queued or running on the daemon's loader
(each holding at most `MAX_PENDING_DESCRIPTORS` descriptors until it runs)."""
MAX_PENDING_DESCRIPTORS: Final = 4
"""Descriptors a daemon connection may have sent ahead of the frames that use them."""
MAX_MODEL_SIDECARS: Final = MAX_PENDING_DESCRIPTORS - 1
"""Files a model may keep its weights in besides its own (ONNX external data, an OpenVINO
IR's ``.bin``): they travel with the model's descriptor in one frame."""
MAX_SIDECAR_NAME: Final = 255
"""The longest name a model may give a file of its weights (a relative path)."""
TENSOR_ALIGN_BYTES: Final = 64
"""Tensors in a shared segment start at multiples of this."""
MAX_TENSOR_DIMS: Final = 32
"""The most dimensions a tensor on the wire may have."""
MAX_WIRE_TENSORS: Final = 1024
"""The most input or output tensors one inference frame may name."""
MAX_HELD_RESULTS: Final = 4
"""Results too large for their region that the daemon keeps for a client to fetch; past it,
the oldest is dropped."""
DEFAULT_IDLE_TIMEOUT_S: Final = 0.0
"""A daemon connection with nothing live for this long is closed; 0 never closes one."""
MANAGEMENT_RESERVE_FDS: Final = 32
"""Descriptors the daemon keeps free for management connections when it is full."""
FRAMES_PER_TURN: Final = 32
"""Frames the daemon handles for one app, across its connections, in a turn of its loop."""
TURN_SLICE_S: Final = 0.00005
"""Time the daemon spends on one app's frames, across its connections, in a turn of its loop."""
REFUSED_CALLS_BURST: Final = 64
"""Calls of one app the daemon may refuse in a burst before it holds the app back."""
REFUSED_CALLS_PER_S: Final = 20
"""Refused calls a second one app is allowed past its burst: a held app is read again as
soon as its allowance has room for one more (``npumanager.daemon.server.refusals``)."""
OUTBOX_PAUSE_BYTES: Final = 256 << 10
"""A client with this much unread is not served more until it reads (backpressure)."""
INFO_SNAPSHOT_TTL_S: Final = 0.25
"""``info`` is answered from a snapshot at most this old, renewed sooner when the asker was
told of a change it does not hold (``npumanager.daemon.server.info``)."""
DEFAULT_INFO_LIMIT: Final = 100
"""Requests listed per state (and clients and priorities) by ``info`` unless asked for more."""
MAX_INFO_LIMIT: Final = 500
"""The most entries per list one ``info`` reply carries; larger lists are paged."""
DEFAULT_CALL_TIMEOUT_S: Final = 30.0
"""How long a daemon client waits for an answer before it gives up."""
MAX_CALL_TIMEOUT_S: Final = 86_400.0
"""The longest answer wait a daemon verb's ``--timeout`` may ask for: a day."""
SHUTDOWN_FLUSH_S: Final = 2.0
"""How long a stopping daemon spends, in all, handing its last frames to the clients."""
LOG_BURST: Final = 10
"""Lines one kind of client-caused log message may print per ``LOG_WINDOW_S``."""
LOG_WINDOW_S: Final = 10.0
VTS_SEED: Final = 20_260_401
"""The conformance suite's state machine seed unless ``--seed`` / ``--npu-seed`` names another."""
VTS_EXAMPLES: Final = 40
"""Examples the reference-matching state machine runs per driver."""
VTS_STEPS: Final = 60
"""Steps per example of the reference-matching state machine."""
VTS_ID_ITEMS: Final = (1 << 16) + 64
"""Work items the ids rule submits: past a 16-bit counter's wrap."""

MAX_TOML_FILE_BYTES: Final = 4 << 20
"""The largest config or scenario file read; a longer one is refused before it is parsed."""
MAX_TOML_DEPTH: Final = 32
"""Tables and arrays a config or scenario file may nest inside one another."""
MAX_SCENARIO_APPS: Final = 256
"""Apps one scenario may hold: each is stepped every virtual millisecond of both runs."""
MAX_SCENARIO_APP_MS: Final = 4_000_000
"""Apps times duration (ms) one scenario may ask for: the per-millisecond stepping work, about
a minute of wall time for both runs."""
MAX_SCENARIO_JOBS: Final = 150_000
"""Jobs one run of a scenario may bring (an upper bound from periods, bursts and loop costs):
each job's events are kept for the table, trace and picture, about 3 KiB a job, so both runs
stay within about 1 GiB."""
MAX_BUDGET_VALUE: Final = INT32_MAX
"""The largest budget policy weight or total: what the platform's int fields carry."""
BUDGET_SIZE_CLASSES: Final = 3
"""Weights the budget policy takes, one per size class (the three `~npumanager.ModelSize`
values)."""
REAL_DEFAULT_CHANNELS: Final = 2
"""Execution channels (worker threads) a real-runtime device has unless told."""
REAL_DEFAULT_CAPACITY_BYTES: Final = 1 << 30
"""Weight memory of a real-runtime device that reports none and is given none."""
REAL_MAX_RESULTS: Final = 1024
"""Outputs a real-runtime driver keeps for ``result`` before the oldest are dropped."""
REAL_NO_SLICE_US: Final = 1 << 40
"""The slice of a real-runtime device: longer than any inference, so nothing is paused."""
CHAIN_LAYERS: Final = 8
"""Matrix multiplications in the timed model a real driver builds in code."""
CHAIN_WIDTH: Final = 256
"""Width of the timed model's square weight matrices."""
TIMED_CALIBRATION_ROWS: Final = 64
"""Rows the timed model is measured with at load to learn its cost per row."""
MAX_TIMED_ROWS: Final = 1 << 20
"""The most rows ``timed_inputs`` asks for, whatever the duration."""
OPENVINO_DEVICES: Final = ("NPU", "GPU", "CPU", "AUTO")
"""The devices the ``openvino`` driver may be opened on."""
REAL_RESERVED_CHANNELS: Final = 1
"""Channels of a real-runtime device that background work leaves free (it always gets one,
and takes them when it is more important than all that runs): a foreground inference then
starts at once instead of waiting for a background one."""
REAL_BACKGROUND_NICE: Final = 10
"""How much lower (in ``nice`` steps) a real-runtime device's background workers run than the
process: where the runtime computes on the calling thread, the OS then gives a core to the
foreground first when cores are short. 0 leaves them at the process's priority."""
REAL_UNKNOWN_CONFIGS_KEPT: Final = 256
"""Scheduling configs of unconfigured uids a real driver keeps built (it is pydantic, and
such a uid's every submission needs one)."""
REAL_PRIORITIES_KEPT: Final = 4096
"""(uid, original uid, job priority) whose effective priority and permission a real driver
keeps worked out while the configs stay the same."""
MAX_NICE: Final = 19
"""The largest ``nice`` value on Linux: the least CPU priority a thread can have."""
REAL_DEMO_SECONDS: Final = 4.0
"""How long each run of ``npu-manager demo --real`` lasts, in wall-clock seconds."""
MAX_REAL_DEMO_SECONDS: Final = 600.0
"""The longest run ``npu-manager demo --real --seconds`` takes."""
MAX_REAL_DEMO_MIN_JOBS: Final = 1000
"""The most inferences ``demo --real --min-jobs`` waits for each app to finish."""
REAL_DEMO_OVERTIME_S: Final = 600.0
"""How long past its end ``demo --real --min-jobs`` lets an app that has not finished its
inferences go on: only a hang outlasts it, however busy the machine."""
MAX_REAL_DEMO_COST_US: Final = 500_000
"""The longest inference ``demo --real`` runs for an app (its ``cost_us``): the inputs of the
model built in code grow with it, about 100 MiB at this length."""

HEALTH_READ_INTERVAL_MS: Final = 1_000
"""How often a health source is read unless it asks otherwise (ivpu advises at most 1/s)."""
MIN_HEALTH_READ_INTERVAL_MS: Final = 10
MAX_HEALTH_READ_INTERVAL_MS: Final = 3_600_000
HEALTH_STOP_TIMEOUT_S: Final = 5.0
"""How long closing a service waits for its health thread to finish a read."""
PSI_MIN_WINDOW_MS: Final = 500
"""The shortest window the kernel accepts for a PSI trigger."""
PSI_MAX_WINDOW_MS: Final = 10_000
"""The longest window the kernel accepts for a PSI trigger."""
PSI_UNPRIVILEGED_WINDOW_MS: Final = 2_000
"""Without CAP_SYS_RESOURCE a PSI trigger's window must be a multiple of this."""
DEFAULT_PSI_WINDOW_MS: Final = 2_000
DEFAULT_PSI_SOME_MODERATE: Final = 10.0
"""PSI ``some`` share (percent, avg10 or a trigger's window) at which memory pressure is 1."""
DEFAULT_PSI_SOME_CRITICAL: Final = 40.0
"""PSI ``some`` share (percent) at which memory pressure is 2."""
CAP_SYS_RESOURCE: Final = 24
"""The capability bit that lets a process create PSI triggers of any window."""
MAX_HEALTH_FILE_BYTES: Final = 64 << 10
"""The most of one sysfs or procfs file the health sources read: every one they read is small."""
RUN_GRANT_TIMEOUT_S: Final = 30.0
"""How long a program under ``npu-manager run`` waits for its model's CAN_LOAD_NOW before the
session's creation fails (``npu-manager run --timeout``)."""
RUN_TERMINATE_POLL_S: Final = 0.01
"""How often a managed run given ``RunOptions`` looks at their ``terminate`` flag."""
