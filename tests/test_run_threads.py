"""The threads a model's runs may use: the driver's setting, or what the app asked at load
(`load_model(threads=)`, which `npu-manager run` fills from the program's own session
options), never past the CPUs, one for a model loaded in the background.

Real sessions: in process the runtime's own session options are read back; through a daemon
the threads the runtime started are counted in the model host's /proc.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import npumanager as npu
from helpers.daemon_support import FOREGROUND_UID, DaemonProcess
from npumanager.errors import IllegalArgumentError
from npumanager.schemas.limits import MAX_INTRA_OP_THREADS
from npumanager.vendor_drivers.realexec.threads import run_threads

ort = pytest.importorskip("onnxruntime")

from npumanager.vendor_drivers.realexec.chain import chain_model  # noqa: E402

CPUS = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("asked", "configured", "background", "expected"),
    [
        (None, 1, False, 1),
        (None, 3, True, 3),  # the operator's setting stands, in any band
        (0, 1, False, CPUS),
        (1, 4, False, 1),
        (CPUS + 5, 1, False, CPUS),
        (0, 1, True, 1),
        (2, 1, True, 1),
    ],
)
def test_run_threads(asked: int | None, configured: int, background: bool, expected: int) -> None:
    assert run_threads(asked, configured, background) == expected


def _driver(service: npu.Service) -> Any:
    return service.drivers[0] if hasattr(service, "drivers") else service.driver


def _intra_op_threads(service: npu.Service, model: npu.LoadedModel) -> int:
    session = _driver(service)._models[model.handle].session.session  # the runtime's own
    return int(session.get_session_options().intra_op_num_threads)


def _loaded(service: npu.Service, uid: int, request_id: int, **load: object) -> npu.LoadedModel:
    manager = service.manager(uid, uses_feature=True)
    request = npu.ModelLoadRequest.Builder(request_id).set_size(0).build()
    lease = manager.reserve(request, timeout_s=30)
    lease.__enter__()
    return lease.load_model(model=chain_model(), **load)


def test_in_process_a_model_runs_on_the_threads_its_app_asked() -> None:
    with npu.Service("onnxruntime") as service:
        service.set_uid_importance(10001, npu.IMPORTANCE_FOREGROUND)
        service.set_uid_importance(10002, npu.IMPORTANCE_CACHED)
        assert _intra_op_threads(service, _loaded(service, 10001, 1)) == 1  # the driver's
        assert _intra_op_threads(service, _loaded(service, 10001, 2, threads=0)) == CPUS
        assert _intra_op_threads(service, _loaded(service, 10001, 3, threads=64)) == CPUS
        background = _loaded(service, 10002, 4, threads=0)
        assert _intra_op_threads(service, background) == 1


@pytest.mark.parametrize("threads", [-1, 257, 1.5, "2", True])
def test_a_bad_thread_count_is_refused_before_anything_loads(threads: object) -> None:
    with npu.Service("onnxruntime") as service:
        manager = service.manager(10001, uses_feature=True)
        request = npu.ModelLoadRequest.Builder(1).set_size(0).build()
        with (
            manager.reserve(request, timeout_s=30) as lease,
            pytest.raises(IllegalArgumentError, match="threads must be None"),
        ):
            lease.load_model(model=chain_model(), threads=threads)  # type: ignore[arg-type]
        assert not _driver(service)._models, "nothing was opened"


def _threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a client its own uid needs root")
@pytest.mark.skipif(CPUS < 2, reason="one CPU: every count asked comes down to one thread")
def test_through_a_daemon_the_host_starts_the_runtime_threads_the_app_asked(
    start_onnxruntime: Callable[..., DaemonProcess], model_file: Path
) -> None:
    from helpers.real_daemon import app, granted, in_front, info

    daemon = start_onnxruntime("--model-hosts")
    in_front(daemon)  # in a background band every count would come down to one
    child = app(daemon, FOREGROUND_UID)
    counts = []
    for request_id, threads in ((1, None), (2, None), (3, 2)):
        granted(child, request_id)
        child.ok("real_load", id=request_id, path=str(model_file), threads=threads)
        (pid,) = [c["host_pid"] for c in info(daemon)["clients"] if c["uid"] == FOREGROUND_UID]
        counts.append(_threads_of(pid))
    by_default, by_asking = counts[1] - counts[0], counts[2] - counts[1]
    assert by_asking - by_default == 1, counts  # one pool thread beside the caller's


@pytest.mark.skipif(CPUS < 2, reason="one CPU: every count asked comes down to one thread")
def test_under_run_a_session_asks_the_threads_of_its_own_options(
    start_onnxruntime: Callable[..., DaemonProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers.run_support import managed_sessions

    daemon = start_onnxruntime("--model-hosts")
    with npu.DaemonClient(daemon.socket) as admin:
        admin.set_uid_importance(os.getuid(), npu.IMPORTANCE_FOREGROUND)
    one = ort.SessionOptions()
    one.intra_op_num_threads = 1
    counts = []
    with managed_sessions(daemon.socket, monkeypatch) as (managed_class, sessions):
        for options in (one, one, None):  # None: the runtime's default, one per CPU
            sessions.append(managed_class(chain_model(), sess_options=options))
            assert type(sessions[-1]) is managed_class, "the managed session, not the fallback"
            from helpers.real_daemon import info

            (pid,) = {c["host_pid"] for c in info(daemon)["clients"] if c["host_pid"]}
            counts.append(_threads_of(pid))
        by_one, by_default = counts[1] - counts[0], counts[2] - counts[1]
        assert by_default - by_one == CPUS - 1, counts


def test_the_threads_a_program_asks_are_read_from_its_runtimes_options() -> None:
    from npumanager.run.openvino_model import _threads_of as openvino_threads
    from npumanager.run.ort_session import _threads_of as ort_threads

    options = ort.SessionOptions()
    assert ort_threads(options) == 0
    options.intra_op_num_threads = 3
    assert ort_threads(options) == 3
    assert ort_threads(None) == 0
    assert openvino_threads(None) == 0
    assert openvino_threads({"INFERENCE_NUM_THREADS": 2}) == 2
    assert openvino_threads({"INFERENCE_NUM_THREADS": "x"}) == 0
    assert openvino_threads({"PERFORMANCE_HINT": "LATENCY"}) == 0
    assert openvino_threads({"INFERENCE_NUM_THREADS": "3"}) == 3
    assert openvino_threads(["not", "a", "mapping"]) == 0


@pytest.mark.parametrize(
    ("value", "threads"),
    [
        (0, 0),
        (-1, 0),
        (2, 2),
        ("4", 4),
        (MAX_INTRA_OP_THREADS + 1, MAX_INTRA_OP_THREADS),
        (True, 0),
        (None, 0),
        ("x", 0),
        (2.0, 2),
    ],
)
def test_a_program_asks_at_most_the_most_threads_a_load_takes(value: object, threads: int) -> None:
    from npumanager.run.managed import asked_threads

    assert asked_threads(value) == threads
