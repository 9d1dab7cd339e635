"""A program that uses only onnxruntime's public API, run under `npu-manager run` and
directly by tests/test_run_*.py. Usage: ort_app.py MODE MODEL [ARGS]; it prints one line per
step (`name value`), and where it waits, reads a line from stdin first."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parent))
from vendorlib.inner.deep import make_session


def say(*parts: object) -> None:
    print(*parts, flush=True)


def digest(arrays: list[np.ndarray]) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()[
        :16
    ]


def x(value: float = 0.5, rows: int = 4) -> np.ndarray:
    return np.full((rows, 256), value, np.float32)


def api(model: str) -> None:
    say("managed", bool(getattr(ort, "__npu_manager_managed__", False)))
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    say("is_session", isinstance(session, ort.InferenceSession))
    say("inputs", [(a.name, a.type, a.shape) for a in session.get_inputs()])
    say("outputs", [(a.name, a.type, a.shape) for a in session.get_outputs()])
    say("providers", session.get_providers())
    say("meta", session.get_modelmeta().producer_name, session.get_modelmeta().graph_name)
    say("options", type(session.get_session_options()).__name__)
    say("run_none", digest(session.run(None, {"x": x()})))
    say("run_named", digest(session.run(["y"], {"x": x()})))
    say("run_list_input", digest(session.run(None, {"x": x().tolist()})))
    values = session.run_with_ort_values(None, {"x": ort.OrtValue.ortvalue_from_numpy(x())})
    say("ort_values", type(values[0]).__name__, digest([values[0].numpy()]))
    binding = session.io_binding()
    binding.bind_cpu_input("x", x())
    binding.bind_output("y")
    session.run_with_iobinding(binding)
    say("io_binding", digest(binding.copy_outputs_to_cpu()))
    from_bytes = ort.InferenceSession(Path(model).read_bytes())
    say("from_bytes", digest(from_bytes.run(None, {"x": x(0.25)})))
    deep = make_session(model)
    say("deep_import", type(deep) is type(session), digest(deep.run(None, {"x": x()})))
    for name, feed in (
        ("dtype", {"x": x().astype(np.float64)}),
        ("missing", {}),
        ("rank", {"x": np.zeros((256,), np.float32)}),
    ):
        try:
            session.run(None, feed)
        except Exception as error:
            say("error", name, type(error).__module__, type(error).__name__)
    try:
        session.run(["nope"], {"x": x()})
    except Exception as error:
        say("error", "output", type(error).__module__, type(error).__name__)
    say("loaded", os.getpid())
    sys.stdin.readline()
    say("run_again", digest(session.run(None, {"x": x()})))


def hundred(model: str) -> None:
    outputs = set()
    for _ in range(100):
        session = ort.InferenceSession(model)
        outputs.add(digest(session.run(None, {"x": x()})))
        del session
    say("sessions", 100, "distinct_outputs", len(outputs), outputs.pop())
    say("loaded", os.getpid())
    sys.stdin.readline()


def forking(model: str) -> None:
    session = ort.InferenceSession(model)
    say("parent", digest(session.run(None, {"x": x()})))
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        try:
            line = f"child {digest(session.run(None, {'x': x()}))} {own_connection()}\n"
            child = ort.InferenceSession(model)
            line += f"child_new {digest(child.run(None, {'x': x()}))}\n"
        except BaseException as error:
            line = f"child_error {type(error).__name__}: {error}\n"
        os.write(writer, line.encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as lines:
        for line in lines:
            say(line.rstrip())
    os.waitpid(pid, 0)
    say("parent_after", digest(session.run(None, {"x": x()})))


def own_connection() -> bool:
    """Whether this process's connection to the daemon is its own (the daemon saw its pid)."""
    from npumanager.run.managed import PROCESS

    manager = PROCESS.manager
    return manager is not None and manager.backend.pid == os.getpid()  # type: ignore[attr-defined]


def threads(model: str) -> None:
    session = ort.InferenceSession(model)
    expected = {v: digest(session.run(None, {"x": x(v)})) for v in (0.1, 0.2, 0.3, 0.4)}
    wrong: list[str] = []

    def worker(value: float) -> None:
        for _ in range(25):
            got = digest(session.run(None, {"x": x(value)}))
            if got != expected[value]:
                wrong.append(f"{value}: {got} != {expected[value]}")

    workers = [threading.Thread(target=worker, args=(v,)) for v in expected]
    for worker_thread in workers:
        worker_thread.start()
    for worker_thread in workers:
        worker_thread.join()
    say("threads", len(workers), "runs", 25 * len(workers), "wrong", len(wrong))


def refused(model: str) -> None:
    try:
        ort.InferenceSession(model)
    except Exception as error:
        say("refused", type(error).__module__, type(error).__name__)
        say("message", str(error).replace("\n", " "))
        return
    say("refused", "no")


def interrupt(model: str) -> None:
    session = ort.InferenceSession(model)
    session.run(None, {"x": x()})
    say("ready", os.getpid())
    while True:
        session.run(None, {"x": x()})


def unload(model: str) -> None:
    session = ort.InferenceSession(model)
    say("first", digest(session.run(None, {"x": x()})))
    sys.stdin.readline()
    say("second", digest(session.run(None, {"x": x()})))


def crash(model: str, endless: str) -> None:
    """Run a model that never ends until the test kills the model host under it."""
    session = ort.InferenceSession(model)
    first = digest(session.run(None, {"x": x()}))
    forever = ort.InferenceSession(endless)
    say("running", os.getpid())
    try:
        forever.run(None, {"x": x()})
    except Exception as error:
        say("crashed", type(error).__module__, type(error).__name__)
        say("message", str(error).replace("\n", " "))
    for _ in range(2):  # the other session's model was in the same host: told once
        try:
            say("after", digest(session.run(None, {"x": x()})) == first)
            return
        except Exception as error:
            say("lost", type(error).__name__, str(error).replace("\n", " "))


def uncarried(model: str, kind: str) -> None:
    """A model with a sequence-of-maps output (a classifier's ZipMap) or string tensors."""
    try:
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    except Exception as error:
        say("refused", type(error).__name__, str(error).replace("\n", " "))
        return
    say("managed_session", hasattr(session, "_npu_model"))
    if kind == "strings":
        feed = {"s": np.array(["a", "bc"], dtype=object)}
    else:
        feed = {"x": np.array([[1.0, 2.0, 3.0]], np.float32)}
    outputs = session.run(None, feed)
    say("outputs", repr(outputs).replace("\n", " "))


if __name__ == "__main__":
    {
        "uncarried": uncarried,
        "api": api,
        "hundred": hundred,
        "fork": forking,
        "threads": threads,
        "refused": refused,
        "interrupt": interrupt,
        "unload": unload,
        "crash": crash,
    }[sys.argv[1]](*sys.argv[2:])
