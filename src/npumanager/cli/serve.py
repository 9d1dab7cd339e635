"""`npu-manager serve`: its options, and running the daemon in the foreground until a signal."""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import signal
import socket
import stat
import sys
import warnings
from pathlib import Path
from typing import Any, TextIO

from npumanager.cli.options import (
    Add,
    CommandContext,
    budget_options,
    parse_driver_option,
    parse_sink,
    policy_params,
    socket_option,
)
from npumanager.daemon.server.quotas import DaemonLimits
from npumanager.errors import NpuManagerError
from npumanager.plugins.sinks import check_sink_options
from npumanager.schemas.limits import (
    DAEMON_SWITCH_INTERVAL_S,
    DEFAULT_HEALTH_INTERVAL_MS,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_LEASE_US,
    DEFAULT_MAX_BUFFERED_BYTES,
    DEFAULT_MAX_CONNECTIONS_PER_UID,
    DEFAULT_MAX_HOSTS,
    DEFAULT_MAX_HOSTS_PER_UID,
    DEFAULT_MAX_INFERENCES_PER_CONNECTION,
    DEFAULT_MAX_MODEL_FILE_BYTES,
    DEFAULT_MAX_MODELS_PER_APP,
    DEFAULT_MAX_MODELS_PER_UID,
    DEFAULT_MAX_REQUESTS_PER_APP,
    DEFAULT_MAX_REQUESTS_PER_UID,
    DEFAULT_MAX_SHARED_BYTES,
    DEFAULT_UNLOAD_GRACE_MS,
    INT32_MAX,
    INT64_MAX,
    MAX_LEASE_US,
)

log = logging.getLogger("npumanager.daemon")

_LOG_FORMAT = "%(asctime)s npu-manager[%(process)d] %(levelname)s %(name)s: %(message)s"
_MIB = 1 << 20


def _hub_options(service: type[Any]) -> tuple[str, ...]:
    """The options `Service.add_sink` takes itself (debouncing, queue) for any sink."""
    parameters = inspect.signature(service.add_sink).parameters.values()
    return tuple(p.name for p in parameters if p.kind is p.KEYWORD_ONLY)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number; got {text!r}") from None
    if not 1 <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"must be 1..{INT32_MAX}; got {value}")
    return value


def _lease_us(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of us; got {text!r}") from None
    if not 0 <= value <= MAX_LEASE_US:
        raise argparse.ArgumentTypeError(
            f"must be 0 (ask before every run) to {MAX_LEASE_US} us; got {value}"
        )
    return value


def _milliseconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of ms; got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 ms (at once) or more; got {value}")
    if value > INT64_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {INT64_MAX} ms; got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds; got {text!r}") from None
    if not 0 <= value <= 86_400 * 365:
        raise argparse.ArgumentTypeError(f"must be 0 (never) up to a year; got {text}")
    return value


def add_serve(add: Add) -> None:
    """Add `serve` and its options to the CLI's parser."""
    serve = add("serve", cmd_serve, "run the arbiter as a daemon on a Unix socket (foreground)")
    socket_option(serve)
    serve.add_argument("--driver", default="vnpu", help="the driver to serve (default: vnpu)")
    serve.add_argument(
        "--policy", default="status_quo", help="the model-loading policy (default: status_quo)"
    )
    budget_options(serve)
    serve.add_argument(
        "--devices", type=int, default=1, metavar="N", help="devices of a simulated driver"
    )
    serve.add_argument(
        "--driver-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the driver, e.g. max_models=64, max_live_work=4096 or, for "
        "onnxruntime, channels=2, capacity_bytes=1073741824 (repeatable; an option the driver "
        "does not take is refused, naming the ones it does)",
    )
    serve.add_argument(
        "--socket-group",
        metavar="GROUP",
        help="group that owns the socket; its members may connect (mode 0660)",
    )
    serve.add_argument(
        "--management-group",
        metavar="GROUP",
        help="group whose members may set the policy, importances and access, as root may",
    )
    serve.add_argument(
        "--attribution-uid",
        type=int,
        action="append",
        default=[],
        metavar="UID",
        help="a uid allowed to attribute work to other uids (repeatable)",
    )
    serve.add_argument(
        "--unload-grace-ms",
        type=_milliseconds,
        default=DEFAULT_UNLOAD_GRACE_MS,
        metavar="MS",
        help=f"how long a client asked to unload may take (default {DEFAULT_UNLOAD_GRACE_MS})",
    )
    serve.add_argument(
        "--health-interval-ms",
        type=int,
        default=DEFAULT_HEALTH_INTERVAL_MS,
        metavar="MS",
        help="device health reaches sinks at once on a change of thermal severity or memory, "
        f"and otherwise every MS (default {DEFAULT_HEALTH_INTERVAL_MS})",
    )
    serve.add_argument(
        "--sink",
        action="append",
        default=[],
        metavar="NAME[:KEY=VALUE,...]",
        help="send telemetry to a sink, e.g. prometheus:port=9464 or "
        "jsonl:path=/var/log/npu.jsonl,debounce_duration_ms=50 (repeatable)",
    )
    serve.add_argument(
        "--model-hosts",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="parse, open and run each connection's models in a host process of its own, "
        "confined, unprivileged and held to its grants' memory (default: on for a driver "
        "that runs real models; --no-model-hosts runs them in the daemon; see the "
        "model hosts page)",
    )
    serve.add_argument(
        "--lease-us",
        type=_lease_us,
        default=DEFAULT_LEASE_US,
        metavar="US",
        help="a model host's grant to run what its client sent it directly leases the "
        "device's channel for US microseconds: further runs of the same model and priority "
        f"start without asking the daemon (default {DEFAULT_LEASE_US}; 0: ask before every "
        "run; see the model hosts page)",
    )
    limits = serve.add_argument_group("limits (management uids are exempt from the per-uid caps)")
    limits.add_argument(
        "--max-connections-per-uid",
        type=_positive,
        default=DEFAULT_MAX_CONNECTIONS_PER_UID,
        metavar="N",
        help=f"connections one uid may hold open (default {DEFAULT_MAX_CONNECTIONS_PER_UID})",
    )
    limits.add_argument(
        "--max-requests-per-uid",
        type=_positive,
        default=DEFAULT_MAX_REQUESTS_PER_UID,
        metavar="N",
        help=f"live requests one uid may hold (default {DEFAULT_MAX_REQUESTS_PER_UID})",
    )
    limits.add_argument(
        "--max-models-per-uid",
        type=_positive,
        default=DEFAULT_MAX_MODELS_PER_UID,
        metavar="N",
        help=f"models one uid may hold loaded (default {DEFAULT_MAX_MODELS_PER_UID})",
    )
    limits.add_argument(
        "--max-requests-per-app",
        type=_positive,
        default=DEFAULT_MAX_REQUESTS_PER_APP,
        metavar="N",
        help="live requests one app found by its cgroup may hold, within its uid's "
        f"(default {DEFAULT_MAX_REQUESTS_PER_APP})",
    )
    limits.add_argument(
        "--max-models-per-app",
        type=_positive,
        default=DEFAULT_MAX_MODELS_PER_APP,
        metavar="N",
        help="models one app found by its cgroup may hold loaded, within its uid's "
        f"(default {DEFAULT_MAX_MODELS_PER_APP})",
    )
    limits.add_argument(
        "--max-hosts-per-uid",
        type=_positive,
        default=DEFAULT_MAX_HOSTS_PER_UID,
        metavar="N",
        help="model hosts one uid may have at once, one per app "
        f"(default {DEFAULT_MAX_HOSTS_PER_UID})",
    )
    limits.add_argument(
        "--max-hosts",
        type=_positive,
        default=DEFAULT_MAX_HOSTS,
        metavar="N",
        help=f"model hosts the daemon runs at once, over every uid (default {DEFAULT_MAX_HOSTS})",
    )
    limits.add_argument(
        "--max-buffered-mib",
        type=_positive,
        default=DEFAULT_MAX_BUFFERED_BYTES // _MIB,
        metavar="MIB",
        help="bytes buffered for all clients together before the largest is dropped "
        f"(default {DEFAULT_MAX_BUFFERED_BYTES // _MIB})",
    )
    limits.add_argument(
        "--max-shared-mib",
        type=_positive,
        default=DEFAULT_MAX_SHARED_BYTES // _MIB,
        metavar="MIB",
        help="the largest shared-memory segment one connection may attach for its tensors "
        f"(default {DEFAULT_MAX_SHARED_BYTES // _MIB})",
    )
    limits.add_argument(
        "--max-inferences-per-connection",
        type=_positive,
        default=DEFAULT_MAX_INFERENCES_PER_CONNECTION,
        metavar="N",
        help="inferences one connection may have in flight "
        f"(default {DEFAULT_MAX_INFERENCES_PER_CONNECTION})",
    )
    limits.add_argument(
        "--max-model-mib",
        type=_positive,
        default=DEFAULT_MAX_MODEL_FILE_BYTES // _MIB,
        metavar="MIB",
        help="the largest model file the daemon reads from a client's descriptor "
        f"(default {DEFAULT_MAX_MODEL_FILE_BYTES // _MIB})",
    )
    limits.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=DEFAULT_IDLE_TIMEOUT_S,
        metavar="S",
        help="close a connection that holds nothing and says nothing for S seconds "
        "(default 0: never)",
    )
    serve.add_argument(
        "--health",
        action="append",
        default=[],
        metavar="NAME[:KEY=VALUE,...]",
        help="read device health from a source, e.g. linux or linux:zones=x86_pkg_temp "
        "(repeatable; default: linux on Linux for a driver without virtual_time; none: off)",
    )
    serve.add_argument(
        "--importance",
        action="append",
        default=[],
        metavar="NAME[:KEY=VALUE,...]",
        help="rank apps by an importance source, e.g. desktop (the focused app first), slices "
        "or rules:rules=camera.service=FOREGROUND (repeatable, earlier first; default: rules, "
        "desktop and slices where cgroup v2 is mounted, else rules; none: off; an "
        "administrator's set-importance pin is above them all)",
    )
    serve.add_argument(
        "--device-node",
        action="append",
        default=None,
        metavar="PATH",
        help="a device node of the accelerator whose users outside the manager info and apps "
        "show (repeatable; default: /dev/accel/accel* and /dev/dri/renderD*)",
    )
    serve.add_argument(
        "--count-device-users",
        action="store_true",
        help="count the device memory that processes outside the manager hold (their "
        "drm-resident bytes, scanned every 2 s) against device 0's capacity: loads get "
        "what is left, and background apps are asked to unload when it shrinks",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="what the daemon logs to stderr (default: info)",
    )


def limits_of(args: argparse.Namespace) -> DaemonLimits:
    """The daemon's limits from `serve`'s options."""
    return DaemonLimits(
        max_connections_per_uid=args.max_connections_per_uid,
        max_requests_per_uid=args.max_requests_per_uid,
        max_models_per_uid=args.max_models_per_uid,
        max_buffered_bytes=args.max_buffered_mib * _MIB,
        idle_timeout_s=args.idle_timeout,
        max_shared_bytes=args.max_shared_mib * _MIB,
        max_inferences_per_connection=args.max_inferences_per_connection,
        max_model_file_bytes=args.max_model_mib * _MIB,
        max_requests_per_app=args.max_requests_per_app,
        max_models_per_app=args.max_models_per_app,
        max_hosts_per_uid=args.max_hosts_per_uid,
        max_hosts=args.max_hosts,
    )


def health_specs(ctx: CommandContext) -> list[tuple[str, dict[str, Any]]]:
    """The health sources `serve` reads: `--health`, or by default `linux` for a real driver."""
    from npumanager.cli.health import DEFAULT_SOURCE, parse_source
    from npumanager.schemas import DriverCapability

    given: list[str] = ctx.args.health
    if given == ["none"]:
        return []
    if "none" in given:
        raise NpuManagerError("--health none turns health sources off; give it alone")
    if given:
        return [parse_source("--health", spec) for spec in given]
    record = ctx.registry.driver(ctx.args.driver)
    real = DriverCapability.VIRTUAL_TIME not in record.capabilities
    return [(DEFAULT_SOURCE, {})] if real and sys.platform.startswith("linux") else []


def _log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """A warning in the daemon (an undeclared feature, a plugin's) as one clean log line."""
    logging.getLogger("npumanager.daemon").warning("%s: %s", category.__name__, message)


def _inherited_listener(args: argparse.Namespace) -> socket.socket | None:
    """The one listening socket systemd passed (socket activation), or None."""
    from npumanager.daemon.server.systemd import inherited_sockets

    inherited = inherited_sockets()
    if not inherited:
        return None
    if len(inherited) > 1:
        names = ", ".join(name for name, _ in inherited)
        raise NpuManagerError(
            f"systemd passed {len(inherited)} sockets ({names}); the daemon serves exactly one "
            "(one ListenStream= in its socket unit)"
        )
    name, listener = inherited[0]
    where = listener.getsockname()
    if args.socket is not None and str(args.socket) != where:
        raise NpuManagerError(
            f"--socket {args.socket} differs from the socket systemd passed ({where}); "
            "leave --socket out under socket activation"
        )
    if args.socket_group:
        log.warning("--socket-group is ignored: the socket unit's SocketGroup= applies")
    log.info("serving the socket systemd passed: %s (%s)", where, name)
    return listener


def _host_settings(args: argparse.Namespace, options: dict[str, Any]) -> Any:
    """What each model host builds its driver from (the daemon's own), or None when models
    run in the daemon (`_check_hosts` has settled `args.model_hosts`)."""
    if not args.model_hosts:
        return None
    from npumanager.daemon.host.client import HostSettings
    from npumanager.daemon.host.memory import MemoryCgroups

    cgroups = MemoryCgroups.find()
    if cgroups is None:
        log.warning(
            "model hosts are held to their grants by their data limit (RLIMIT_DATA): no "
            "memory cgroup this daemon may write (cgroup v2 with the memory controller "
            "delegated, or a v1 memory hierarchy)"
        )
    return HostSettings(args.driver, options, args.devices, cgroups=cgroups, lease_us=args.lease_us)


def _device_nodes(given: list[str] | None) -> list[str] | None:
    """The named device nodes, each checked to be a character device; None: the machine's."""
    if given is None:
        return None
    for node in given:
        try:
            mode = os.stat(node).st_mode
        except OSError as exc:
            raise NpuManagerError(f"--device-node {node}: {exc.strerror}") from None
        if not stat.S_ISCHR(mode):
            raise NpuManagerError(
                f"--device-node {node}: not a character device (an accelerator's node is one, "
                "e.g. /dev/accel/accel0)"
            )
    return [os.path.normpath(os.path.abspath(node)) for node in given]


def _check_hosts(args: argparse.Namespace, service: Any) -> None:
    from npumanager.daemon.host.client import can_host

    if args.model_hosts is None:
        args.model_hosts = can_host(service.driver)
    elif args.model_hosts and not can_host(service.driver):
        raise NpuManagerError(
            f"--model-hosts needs a driver that runs real models in a runtime (onnxruntime, "
            f"openvino, or one built on RealDriver); {args.driver!r} is not one"
        )


def cmd_serve(ctx: CommandContext) -> int:
    """Serve one arbiter on the socket until SIGTERM or SIGINT."""
    from npumanager.daemon.peer import named_socket, socket_file, user_socket_path

    args = ctx.args
    # A thread that wants the GIL waits at most this long for one that holds it: the loop
    # and each channel's worker then hand over in well under a frame's deadline.
    sys.setswitchinterval(DAEMON_SWITCH_INTERVAL_S)
    logging.basicConfig(stream=ctx.err, level=args.log_level.upper(), format=_LOG_FORMAT)
    warnings.showwarning = _log_warning
    listener = _inherited_listener(args)
    named = socket_file(args.socket, "--socket") if args.socket is not None else named_socket()
    path = named or user_socket_path()
    default_place = named is None
    health = health_specs(ctx)
    driver_options = dict(map(parse_driver_option, args.driver_option))
    from npumanager.cli.importance import build_importance_sources

    importance = build_importance_sources(ctx.registry, args.importance)
    try:
        return _serve(ctx, listener, path, default_place, health, driver_options, importance)
    finally:
        for _, source in importance:
            source.close()


def _serve(
    ctx: CommandContext,
    listener: socket.socket | None,
    path: Path,
    default_place: bool,
    health: list[tuple[str, dict[str, Any]]],
    driver_options: dict[str, Any],
    importance: list[tuple[str, Any]],
) -> int:
    """`serve` once its options are checked and its importance sources built."""
    from npumanager.core.service.service import Service
    from npumanager.daemon.peer import group_id
    from npumanager.daemon.server.server import Daemon

    args = ctx.args
    socket_group = group_id(args.socket_group) if args.socket_group else None
    management_group = group_id(args.management_group) if args.management_group else None
    limits = limits_of(args)
    service = Service(
        args.driver,
        args.policy,
        policy_params=policy_params(args.policy, args),
        clock="real",
        devices=args.devices,
        driver_options=dict(driver_options),
        attribution_uids=args.attribution_uid,
        unload_grace_ms=args.unload_grace_ms,
        health_interval_ms=args.health_interval_ms,
        registry=ctx.registry,
    )
    try:
        _check_hosts(args, service)
        for spec in args.sink:
            name, options = parse_sink(spec)
            check_sink_options(
                name, ctx.registry.sink(name).factory, options, also=_hub_options(Service)
            )
            service.add_sink(name, **options)
        for source in health:
            log.info("device health from %s", service.add_health_source(source))
        daemon = Daemon(
            service,
            path,
            socket_group=socket_group,
            management_group=management_group,
            limits=limits,
            create_socket_dir=default_place,
            listener=listener,
            hosts=_host_settings(args, driver_options),
            importance_sources=importance,
            device_nodes=_device_nodes(args.device_node),
            count_device_users=args.count_device_users,
        )
        daemon.bind()
        if importance:  # once bound: a daemon refused its socket says that alone
            log.info("apps ranked by %s", ", ".join(name for name, _ in importance))
    except OSError as exc:
        service.close()
        raise NpuManagerError(f"cannot serve on {path}: {exc.strerror or exc}") from None
    except BaseException:
        service.close()
        raise

    def stop(signum: int, _frame: Any) -> None:
        log.info("%s: shutting down", signal.Signals(signum).name)
        daemon.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    daemon.wake_on_signals()
    path = daemon.socket_path  # the socket systemd passed, under socket activation
    log.info(
        "serving on %s: driver %s, policy %s, pid %d, up to %d connections",
        path,
        args.driver,
        service.policy_name,
        os.getpid(),
        daemon.max_connections,
    )
    daemon.serve_forever()
    if listener is None:
        log.info("stopped; every live request was completed and %s removed", path)
    else:
        log.info("stopped; every live request was completed; %s is left to systemd", path)
    if daemon.abandoned_load:
        # The loader's thread is inside the runtime: the interpreter's exit would tear the
        # runtime down under it (a C++ terminate). End here, logs flushed.
        logging.shutdown()
        ctx.err.flush()
        os._exit(0)
    return 0
