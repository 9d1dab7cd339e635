"""How many hops one load request takes, from `request_can_load_model` to its
`on_can_load_model`, in process and over the daemon.

Every thread is traced (`threading.setprofile`, installed before any thread starts) while
one request runs. A hop is a call from one component into another (a layer or role: a
subpackage of core or daemon, `core.arbiter`, `daemon.wire`, else a top-level module or
package, as tests/test_import_graph.py groups them), or a hand-off of the request's work
from one thread to the next (consecutive calls into the package on different threads).
Calls between modules of one component are counted apart (`module calls`).

Over the daemon, the daemon runs in this process (`Daemon` on a thread, the code `npu-manager
serve` runs) so its threads are traced too; the client talks to it over its real Unix
socket. Background threads that happen to run in the window (the service's clock, the
health monitor) are left out by taking the fewest hops of several tries. `--path` prints
the fewest run's calls.

Targets (issue 28): over the daemon at most 10 hops and one delivery path.

Usage: python benchmarks/hops.py [--json] [--tries N] [--path]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from _report import Progress, Target, print_report  # beside this script

import npumanager as npu

try:
    from npumanager.core.client.dispatch import run_inline
    from npumanager.daemon.server.server import Daemon
except ImportError:  # the layout before issue 28, to measure it the same way
    from npumanager.core.dispatch import run_inline  # type: ignore[no-redef]

    from npumanager.daemon.server import Daemon  # type: ignore[no-redef]

Service = npu.Service

PACKAGE = Path(npu.__file__).parent
TARGET_DAEMON_HOPS = 10


def module_of(frame: FrameType | None) -> str | None:
    """The npumanager module a frame runs in, or None outside the package."""
    if frame is None:
        return None
    path = Path(frame.f_code.co_filename)
    if PACKAGE not in path.parents:
        return None
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def component(module: str) -> str:
    """`npumanager.core.arbiter.ledger` -> `core.arbiter`; `npumanager.telemetry.hub` ->
    `telemetry` (as tests/test_import_graph.py groups modules)."""
    parts = module.split(".")[1:]
    return ".".join(parts[:2] if parts[:1] in (["core"], ["daemon"]) else parts[:1])


class Tracer:
    """Records every call into npumanager: cross-module calls, and the thread of each."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, str]] = []
        """(thread, caller module or None from outside the package, callee module)."""
        self.on = False

    def profile(self, frame: FrameType, event: str, _: Any) -> None:
        if not self.on or event != "call":
            return
        callee = module_of(frame)
        if callee is None:
            return
        caller = module_of(frame.f_back)
        if caller != callee:
            self.calls.append((threading.current_thread().name, caller, callee))

    def module_calls(self) -> list[tuple[str, str | None, str]]:
        """Calls from one npumanager module into another."""
        return [call for call in self.calls if call[1] is not None]

    def crossings(self) -> list[tuple[str, str | None, str]]:
        """Calls from one component into another: a subpackage of core or daemon
        (`core.arbiter`, `daemon.wire`), else a top-level module or package."""
        return [c for c in self.module_calls() if component(c[1] or "") != component(c[2])]

    def handoffs(self) -> int:
        """How often the request's work moved from one thread to another."""
        threads = [thread for thread, _, _ in self.calls]
        return sum(1 for a, b in itertools.pairwise(threads) if a != b)

    def hops(self) -> int:
        """Component crossings and thread hand-offs."""
        return len(self.crossings()) + self.handoffs()

    def install(self) -> None:
        """Trace this thread and every thread started from now on."""
        threading.setprofile(self.profile)
        sys.setprofile(self.profile)

    @staticmethod
    def remove() -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


class Granted(npu.ModelLoadRequestCallback):
    """Sets an event when the decision arrives."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.done = threading.Event()

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        self.tracer.on = False
        self.done.set()


def one_request(tracer: Tracer, manager: npu.NpuManager, request_id: int, executor: Any) -> Tracer:
    """Trace one request (the tracer was installed before any thread started)."""
    tracer.calls = []
    callback = Granted(tracer)
    request = npu.ModelLoadRequest.Builder(request_id).set_size(0).build()
    tracer.on = True
    manager.request_can_load_model(request, callback, executor)
    callback.done.wait(10)
    tracer.on = False
    run = Tracer()
    run.calls = list(tracer.calls)
    manager.cancel_model_load(request)
    return run


def fewest(make: Callable[[int], Tracer], tries: int) -> Tracer:
    runs = [make(n + 1) for n in range(tries)]
    return min(runs, key=lambda t: t.hops())


def summary(tracer: Tracer) -> dict[str, Any]:
    calls = tracer.module_calls()
    return {
        "hops": tracer.hops(),
        "component_crossings": len(tracer.crossings()),
        "module_calls": len(calls),
        "thread_handoffs": tracer.handoffs(),
        "threads": sorted({thread for thread, _, _ in tracer.calls}),
        "path": [
            f"{thread}: {caller or '(outside)'} -> {callee}"
            for thread, caller, callee in tracer.calls
        ],
    }


def in_process(tries: int, executor: Any) -> dict[str, Any]:
    tracer = Tracer()
    tracer.install()
    try:
        with Service("vnpu", "status_quo", clock="real") as service:
            manager = service.manager(10123, uses_feature=True)
            return summary(fewest(lambda n: one_request(tracer, manager, n, executor), tries))
    finally:
        tracer.remove()


def over_daemon(tries: int, executor: Any) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="npu-hops-"))
    path = folder / "npu.sock"
    tracer = Tracer()
    tracer.install()
    service = Service("vnpu", "status_quo", clock="real")
    daemon = Daemon(service, path)
    daemon.bind()
    thread = threading.Thread(target=daemon.serve_forever, name="npu-daemon-loop", daemon=True)
    thread.start()
    try:
        with npu.connect(socket_path=path, uses_feature=True) as manager:
            time.sleep(0.1)
            return summary(fewest(lambda n: one_request(tracer, manager, n, executor), tries))
    finally:
        tracer.remove()
        daemon.stop()
        thread.join(10)
        service.close()


TARGETS = [
    Target(
        "daemon.hops", "<=", TARGET_DAEMON_HOPS, why="issue 28: one load request over the daemon"
    ),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="two tries of each")
    parser.add_argument("--tries", type=int, default=7, help="requests of each, fewest kept")
    parser.add_argument("--path", action="store_true", help="print the fewest run's calls")
    args = parser.parse_args(argv)
    tries = 2 if args.quick else args.tries
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "in_process": lambda: in_process(tries, run_inline),
        "in_process_dispatch": lambda: in_process(tries, None),
        "daemon": lambda: over_daemon(tries, run_inline),
        "daemon_dispatch": lambda: over_daemon(tries, None),
    }
    progress = Progress("hops", len(runs))
    results: dict[str, Any] = {}
    for name, run in runs.items():
        progress.step(name.replace("_", " "))
        results[name] = run()
    progress.done()
    paths = {name: result.pop("path") for name, result in results.items()}
    print_report(results, TARGETS, as_json=args.json)
    if args.path and not args.json:
        for name, path in paths.items():
            print(f"\n{name}:")
            for line in path:
                print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
