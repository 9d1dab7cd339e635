"""Admission latency: from a request until its decision is delivered, by tracked requests.

In process, no service: the arbiter decides and an inline executor delivers each action
at once, the way an in-process service with an inline executor would. The arbiter is
first filled with N tracked requests (a foreground uid holding most of the budget, the
rest from many background uids, refused); then each sample is one request from a
background uid, alternately small (granted) and large (refused), cancelled afterwards so
N stays put. The incremental `budget` policy and the naive, rescan-everything one run in
the same process on the same states.

    python benchmarks/admission.py --json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from npumanager.core.actions import Action, CanLoad, RequestKey
from npumanager.core.arbiter import Arbiter
from npumanager.core.policy import Policy
from npumanager.plugins.policies.budget import BudgetPolicy, NaiveBudgetPolicy
from npumanager.schemas import Importance, ModelLoadRequest, ModelSize

SIZES = (10, 1_000, 10_000, 100_000)
FOREGROUND_UID = 10_000
BACKGROUND_UID = 20_000
REQUESTS_PER_UID = 10
PROBE_CLIENT = 1 << 30

POLICIES: dict[str, Callable[[], Policy]] = {
    "budget": BudgetPolicy,
    "naive": NaiveBudgetPolicy,
}


def inline_executor(actions: Sequence[Action], deliver: Callable[[Action], None]) -> None:
    """Deliver every action at once, in order, on the caller's thread."""
    for action in actions:
        deliver(action)


def filled_arbiter(tracked: int, policy: Callable[[], Policy]) -> Arbiter:
    """An arbiter holding `tracked` live requests, most of them NOT_PRIORITIZED.

    Built under the incremental policy, then handed to `policy` (a swap keeps every
    request), so the naive one never pays the quadratic cost of being filled.
    """
    arbiter = Arbiter(BudgetPolicy())
    now = 0
    arbiter.set_importance(now, FOREGROUND_UID, Importance.FOREGROUND)
    holders = [ModelSize.BETWEEN_1GB_AND_2GB, ModelSize.LESS_THAN_1GB][:tracked]
    for request_id, size in enumerate(holders):
        arbiter.request(now, 0, FOREGROUND_UID, ModelLoadRequest(id=request_id, size=size))
        arbiter.notify_loaded(now, 0, request_id)
    importances = [Importance.SERVICE, Importance.CACHED, Importance.GONE]
    for index in range(tracked - len(holders)):
        uid = BACKGROUND_UID + index // REQUESTS_PER_UID
        if index % REQUESTS_PER_UID == 0:
            arbiter.set_importance(now, uid, importances[uid % len(importances)])
        request = ModelLoadRequest(id=index, size=ModelSize.GREATER_THAN_2G)
        arbiter.request(now, 1 + index % 1000, uid, request)
    if policy is not BudgetPolicy:
        arbiter.set_policy(now, policy())
    return arbiter


def measure(tracked: int, policy: Callable[[], Policy], samples: int) -> list[float]:
    """Microseconds from each probe request until its decision is delivered."""
    arbiter = filled_arbiter(tracked, policy)
    uids = max(1, (tracked - 2) // REQUESTS_PER_UID)
    clock = time.perf_counter_ns
    latencies = []
    decided: list[int] = []
    gc.collect()
    for sample in range(samples):
        key = RequestKey(PROBE_CLIENT, sample)
        size = ModelSize.LESS_THAN_1GB if sample % 2 else ModelSize.GREATER_THAN_2G
        uid = BACKGROUND_UID + sample % uids

        def deliver(action: Action, key: RequestKey = key) -> None:
            if isinstance(action, CanLoad) and action.key == key:
                decided.append(clock())

        request = ModelLoadRequest(id=sample, size=size)
        start = clock()
        actions = arbiter.request(sample, PROBE_CLIENT, uid, request)
        inline_executor(actions, deliver)
        latencies.append((decided[-1] - start) / 1000)
        arbiter.cancel(sample, PROBE_CLIENT, sample)
    return latencies


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def run(
    sizes: Sequence[int] = SIZES, samples: int = 2000, repeat: int = 3
) -> dict[str, dict[str, dict[str, float]]]:
    """Medians over `repeat` runs of p50 and p99 per policy and tracked-request count."""
    result: dict[str, dict[str, dict[str, float]]] = {}
    for name, policy in POLICIES.items():
        p50: dict[str, float] = {}
        p99: dict[str, float] = {}
        for tracked in sizes:
            count = samples if name == "budget" else max(20, samples * 100 // max(tracked, 100))
            runs = [measure(tracked, policy, count) for _ in range(repeat)]
            p50[str(tracked)] = round(statistics.median(percentile(r, 0.50) for r in runs), 2)
            p99[str(tracked)] = round(statistics.median(percentile(r, 0.99) for r in runs), 2)
        result[name] = {"p50_us": p50, "p99_us": p99}
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Print the figures, as JSON with `--json`, else as a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--samples", type=int, default=2000, help="probes per run (budget)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; medians kept")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    args = parser.parse_args(argv)
    result = run(args.sizes, args.samples, args.repeat)
    if args.json:
        print(json.dumps(result))
        return 0
    for name, figures in result.items():
        for tracked in map(str, args.sizes):
            print(
                f"{name:7} {tracked:>7} tracked: p50 {figures['p50_us'][tracked]:>10.1f} us"
                f"  p99 {figures['p99_us'][tracked]:>10.1f} us"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
