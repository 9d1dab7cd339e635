"""Real inference on this machine: a foreground app beside a background app, managed and direct.

For each real driver installed (`onnxruntime`, `openvino`), in one run, with a model built
in code (a chain of matrix multiplications sized to about `--ms` per inference here):

* solo: the foreground app alone, through npu-manager (a `Service`, `LoadedModel.run`),
  one inference every 16.7 ms; `fg_solo_p50_ms` / `fg_solo_p99_ms` submit to outputs.
* managed: the same beside a background app that keeps the device busy (cached
  importance: a background band); `fg_managed_p99_ms`, `bg_managed_per_s`.
* direct: no manager: the foreground thread and `--bg-threads` background threads call
  the runtime themselves, as before npu-manager; `fg_direct_p99_ms`, `bg_direct_per_s`.
* overhead: on an idle device, `LoadedModel.run` against a bare runtime call of the same
  session with one input row, alternating; `overhead_p50_us` is the difference of the
  medians.
* parallel: two inferences on the device's two channels at once against one alone;
  `two_at_once_over_one` is about 1 when the runtime really runs them side by side.

The three phases run `--repeats` times in turn, with the same model and inputs, and each
figure is the median over the repeats (`*_spread` gives the lowest and highest ratio seen).
The figures come from the CPU of a shared machine; no NPU is claimed. Targets are printed
beside them. Usage: python benchmarks/real_inference.py [--json] [--seconds S] [--ms MS]
[--repeats N] [--background-nice N]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import Progress

import npumanager as npu
from npumanager.core.driver.job import Job
from npumanager.core.service.service import Service
from npumanager.schemas.limits import CHAIN_WIDTH

PERIOD_S = 1 / 60
FOREGROUND, BACKGROUND = 10001, 10002
BG_DEPTH = 4
"""Inferences the managed background app keeps in flight."""
OVERHEAD_PAIRS = 1000
"""Bare and managed one-row calls, alternating, for `overhead_p50_us`."""


def chain_bytes() -> bytes:
    """The model built in code (the drivers' timed model)."""
    from npumanager.vendor_drivers.realexec.chain import chain_model

    return chain_model()


def request(request_id: int) -> npu.ModelLoadRequest:
    return (
        npu.ModelLoadRequest.Builder(request_id).set_size(npu.NPU_MODEL_SIZE_LESS_THAN_1GB).build()
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def foreground(run: Callable[[], Any], seconds: float) -> list[float]:
    """Submit-to-outputs latencies (ms) of one inference every 16.7 ms."""
    latencies: list[float] = []
    next_at = time.perf_counter()
    end = next_at + seconds
    while next_at < end:
        time.sleep(max(0.0, next_at - time.perf_counter()))
        start = time.perf_counter()
        run()
        latencies.append((time.perf_counter() - start) * 1000)
        next_at += PERIOD_S
    return latencies


def rows_for(driver_name: str, ms: float) -> int:
    """Input rows for about `ms` per inference, measured by the driver's timed model."""
    with Service(driver_name, "status_quo") as svc:
        driver: Any = svc.driver
        model = driver.load_timed_model()
        return int(driver.timed_inputs(model, ms)["x"].shape[0])


def two_at_once(driver_name: str, rows: int) -> float:
    """Wall time of two foreground inferences submitted together to the driver's two
    channels over that of one (medians): about 1 when the channels really run in
    parallel (two free cores), about 2 when the runtime runs them in turn."""
    with Service(driver_name, "status_quo") as svc:
        svc.set_uid_importance(FOREGROUND, npu.IMPORTANCE_FOREGROUND)
        driver: Any = svc.driver
        model = driver.load_model(model=chain_bytes(), uid=FOREGROUND)
        feeds = {"x": np.full((rows, CHAIN_WIDTH), 0.5, np.float32)}

        def wall(count: int) -> float:
            start = time.perf_counter()
            futures = [driver.submit_future(model, Job(FOREGROUND), feeds) for _ in range(count)]
            for future in futures:
                future.result()
            return time.perf_counter() - start

        wall(2)
        one = statistics.median(wall(1) for _ in range(15))
        two = statistics.median(wall(2) for _ in range(15))
        return two / one


def managed(
    driver_name: str, rows: int, seconds: float, background: bool, options: dict[str, Any]
) -> dict[str, Any]:
    """The foreground app (and the background one) through a `Service`."""
    svc = Service(driver_name, "status_quo", driver_options=options)
    svc.set_uid_importance(FOREGROUND, npu.IMPORTANCE_FOREGROUND)
    svc.set_uid_importance(BACKGROUND, npu.IMPORTANCE_CACHED)
    feeds = {"x": np.full((rows, CHAIN_WIDTH), 0.5, np.float32)}
    stop = threading.Event()
    done = [0]
    try:
        fg_app = svc.manager(FOREGROUND, uses_feature=True)
        bg_app = svc.manager(BACKGROUND, uses_feature=True)
        with (
            fg_app.reserve(request(1), timeout_s=30) as fg_lease,
            bg_app.reserve(request(2), timeout_s=30) as bg_lease,
        ):
            fg = fg_lease.load_model(model=chain_bytes())
            bg = bg_lease.load_model(model=chain_bytes())
            fg.run(feeds)  # warm-up

            def flood() -> None:
                pending = [bg.submit(feeds) for _ in range(BG_DEPTH)]
                while not stop.is_set():
                    pending.pop(0).result()
                    done[0] += 1
                    pending.append(bg.submit(feeds))
                for handle in pending:
                    handle.cancel()

            flooder = threading.Thread(target=flood, daemon=True)
            if background:
                flooder.start()
            time.sleep(0.2 if background else 0)
            start_count, start = done[0], time.perf_counter()
            latencies = foreground(lambda: fg.run(feeds), seconds)
            rate = (done[0] - start_count) / (time.perf_counter() - start)
            stop.set()
            if background:
                flooder.join()
            overhead = None if background else overhead_us(fg, svc)
    finally:
        svc.close()
    return {"latencies": latencies, "bg_per_s": rate, "overhead_us": overhead}


def overhead_us(model: npu.LoadedModel, svc: Service) -> float:
    """Median `LoadedModel.run` less the median bare call of the same session, one row;
    the two alternate call by call, so a change of the machine's load hits both alike."""
    driver: Any = svc.driver
    session = driver.model_info(model.handle)
    small = {"x": np.full((1, CHAIN_WIDTH), 0.5, np.float32)}
    from npumanager.vendor_drivers.realexec.session import Call

    bare, through = [], []
    for _ in range(OVERHEAD_PAIRS):
        start = time.perf_counter_ns()
        session.run(small, Call(False))
        middle = time.perf_counter_ns()
        model.run(small)
        bare.append(middle - start)
        through.append(time.perf_counter_ns() - middle)
    return (statistics.median(through) - statistics.median(bare)) / 1000


def direct_runner(driver_name: str, callers: int) -> Callable[[], Callable[[dict[str, Any]], Any]]:
    """A factory of bare runtime callers (one per thread), no npu-manager in between, each
    able to run beside the others as separate apps' would (OpenVINO: a stream apiece)."""
    data = chain_bytes()
    if driver_name == "onnxruntime":
        import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        return lambda: lambda feeds: session.run(None, feeds)
    import openvino as ov  # type: ignore[import-untyped,unused-ignore]

    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": callers, "NUM_STREAMS": callers}
    compiled = core.compile_model(core.read_model(data), "CPU", config)

    def make() -> Callable[[dict[str, Any]], Any]:
        req = compiled.create_infer_request()
        return req.infer  # type: ignore[no-any-return]

    return make


def direct(driver_name: str, rows: int, seconds: float, bg_threads: int) -> dict[str, Any]:
    """The two apps calling the runtime themselves."""
    make = direct_runner(driver_name, bg_threads + 1)
    feeds = {"x": np.full((rows, CHAIN_WIDTH), 0.5, np.float32)}
    stop = threading.Event()
    counts = [0] * bg_threads

    def loop(index: int) -> None:
        call = make()
        while not stop.is_set():
            call(feeds)
            counts[index] += 1

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(bg_threads)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    fg_call = make()
    fg_call(feeds)
    before, start = sum(counts), time.perf_counter()
    latencies = foreground(lambda: fg_call(feeds), seconds)
    rate = (sum(counts) - before) / (time.perf_counter() - start)
    stop.set()
    for thread in threads:
        thread.join()
    return {"latencies": latencies, "bg_per_s": rate}


def once(driver_name: str, rows: int, args: argparse.Namespace) -> dict[str, float]:
    """One repeat: solo, managed and direct, in turn; its figures."""
    options = {} if args.background_nice is None else {"background_nice": args.background_nice}
    solo = managed(driver_name, rows, args.seconds, False, options)
    shared = managed(driver_name, rows, args.seconds, True, options)
    bare = direct(driver_name, rows, args.seconds, args.bg_threads)
    return {
        "fg_solo_p50_ms": statistics.median(solo["latencies"]),
        "fg_solo_p99_ms": pct(solo["latencies"], 0.99),
        "fg_managed_p50_ms": statistics.median(shared["latencies"]),
        "fg_managed_p99_ms": pct(shared["latencies"], 0.99),
        "fg_direct_p50_ms": statistics.median(bare["latencies"]),
        "fg_direct_p99_ms": pct(bare["latencies"], 0.99),
        "bg_managed_per_s": shared["bg_per_s"],
        "bg_direct_per_s": bare["bg_per_s"],
        "overhead_p50_us": solo["overhead_us"],
        "fg_inferences": len(shared["latencies"]),
    }


def measure(driver_name: str, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Medians over `args.repeats` repeats, with the ratios the targets are about."""
    rows = rows_for(driver_name, args.ms)
    runs = []
    for repeat in range(args.repeats):
        progress.step(
            f"{driver_name}, repeat {repeat + 1} of {args.repeats}: solo, managed, direct"
        )
        runs.append(once(driver_name, rows, args))
    progress.step(f"{driver_name}: two inferences at once")
    out: dict[str, Any] = {"rows": rows, "repeats": args.repeats}
    for key in runs[0]:
        out[key] = round(statistics.median(run[key] for run in runs), 3)
    over_solo = [r["fg_managed_p99_ms"] / r["fg_solo_p99_ms"] for r in runs]
    over_direct = [r["fg_managed_p99_ms"] / r["fg_direct_p99_ms"] for r in runs]
    out["managed_over_solo_p99"] = round(out["fg_managed_p99_ms"] / out["fg_solo_p99_ms"], 2)
    out["managed_over_solo_p99_spread"] = [round(min(over_solo), 2), round(max(over_solo), 2)]
    out["managed_over_direct_p99"] = round(out["fg_managed_p99_ms"] / out["fg_direct_p99_ms"], 2)
    out["managed_over_direct_p99_spread"] = [
        round(min(over_direct), 2),
        round(max(over_direct), 2),
    ]
    out["bg_managed_over_direct"] = round(
        out["bg_managed_per_s"] / max(out["bg_direct_per_s"], 1e-9), 2
    )
    out["two_at_once_over_one"] = round(two_at_once(driver_name, rows), 2)
    out["targets_met"] = {
        "fg_managed_p99_ms <= 1.5 x fg_solo_p99_ms": out["managed_over_solo_p99"] <= 1.5,
        "fg_managed_p99_ms < fg_direct_p99_ms": out["managed_over_direct_p99"] < 1.0,
        "overhead_p50_us <= 50": out["overhead_p50_us"] <= 50,
    }
    return out


TARGETS = {
    "fg_managed_p99_ms": "<= 1.5 x fg_solo_p99_ms, below fg_direct_p99_ms",
    "managed_over_solo_p99": "target <= 1.5",
    "managed_over_direct_p99": "target < 1",
    "overhead_p50_us": "target <= 50",
    "two_at_once_over_one": "~1: channels in parallel, ~2: in turn",
}


def table(name: str, result: dict[str, Any]) -> str:
    lines = [
        f"driver {name} (CPU, {result['rows']} rows of {CHAIN_WIDTH}, "
        f"medians of {result['repeats']} repeats)"
    ]
    for key, value in result.items():
        if key in ("targets_met", "rows", "repeats"):
            continue
        lines.append(f"  {key:26} {value!s:>10}  {TARGETS.get(key, '')}")
    for target, met in result["targets_met"].items():
        lines.append(f"  target {target:42} {'met' if met else 'NOT met'}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each phase")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the three phases")
    parser.add_argument(
        "--background-nice",
        type=int,
        default=None,
        help="the managed driver's background_nice (its default if not given)",
    )
    parser.add_argument("--ms", type=float, default=3.0, help="rough duration of one inference")
    parser.add_argument("--bg-threads", type=int, default=2, help="direct background threads")
    parser.add_argument("--driver", action="append", help="only these drivers")
    parser.add_argument("--quick", action="store_true", help="a short, noisy run")
    args = parser.parse_args()
    names = args.driver or [
        n
        for n, mod in (("onnxruntime", "onnxruntime"), ("openvino", "openvino"))
        if importlib.util.find_spec(mod) is not None
    ]
    if args.repeats < 1 or args.seconds <= 0:
        parser.error("--repeats must be >= 1 and --seconds > 0")
    if args.quick:
        args.seconds, args.repeats = 0.5, 1
    weights = [w for name in names for w in [3.0] * args.repeats + [0.3]]
    progress = Progress("real_inference", weights)
    results = {name: measure(name, args, progress) for name in names}
    progress.done()
    if args.json:
        print(json.dumps(results))
    else:
        print("\n\n".join(table(name, result) for name, result in results.items()))


if __name__ == "__main__":
    main()
