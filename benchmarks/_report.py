"""What every benchmark script shares: its targets beside its figures, and progress on stderr.

A script adopts it in three steps (benchmarks/admission.py is a short example):

1. Progress: `progress = Progress("what is measured", steps)` with `steps` the number of
   steps or a list of their relative costs; `progress.step("label")` as each step begins
   (stderr: `what: 2/8 label, 3 s so far, about 9 s left`); `progress.done()` at the end.
   It writes to stderr only, so `--json` output on stdout stays one JSON object.
2. Targets: one `Target(figure, op, bound)` per promise, `figure` the key of the figure in
   the script's result, a dotted path into nested dicts (`"budget.p99_us.10000"`), `op`
   one of `<=`, `<`, `>=`, `>` or `within` (then `bound` is the low end and `upper` the
   high end), `why` where the target comes from.
3. Output: `print_report(result, targets, as_json=args.json)` prints the result with a
   `targets` object (`{figure: {"target", "value", "met", "why"}}`; `met` is null when the
   figure was not measured) as one JSON object, or a table whose rows give each figure,
   its value, its target and `met`/`MISSED`, and a summary line.

Each script also takes `--quick`: the smallest run that still measures every figure
(seconds, not minutes), for tests and a first look; its figures are noisy.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TextIO

SERVE = (sys.executable, "-m", "npumanager", "serve", "--importance", "none")
"""`npu-manager serve` as a benchmark starts it: with no importance source, for its figures
time the daemon, not this machine's desktop (the default `desktop` source watches every
cgroup here, with other programs' churn and their warnings)."""

Op = Literal["<=", "<", ">=", ">", "within"]
OPS: tuple[Op, ...] = ("<=", "<", ">=", ">", "within")


@dataclass(frozen=True)
class Target:
    """A promise about one figure: `figure op bound` (or `bound <= figure <= upper`)."""

    figure: str
    op: Op
    bound: float
    upper: float | None = None
    """The high end of a `within` target."""
    why: str = ""
    """Where the target comes from (an issue, a design note)."""

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"target {self.figure}: op must be one of {', '.join(OPS)}")
        if (self.op == "within") != (self.upper is not None):
            raise ValueError(f"target {self.figure}: `upper` goes with op 'within' only")

    @property
    def text(self) -> str:
        """The target as a reader sees it: `<= 50`, `45..55`."""
        if self.op == "within":
            return f"{_number(self.bound)}..{_number(self.upper)}"
        return f"{self.op} {_number(self.bound)}"

    def met(self, value: Any) -> bool | None:
        """Whether `value` meets the target; None when there is no number to judge."""
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            return None
        if self.op == "within":
            assert self.upper is not None
            return self.bound <= value <= self.upper
        return {
            "<=": value <= self.bound,
            "<": value < self.bound,
            ">=": value >= self.bound,
            ">": value > self.bound,
        }[self.op]


def lookup(result: Mapping[str, Any], figure: str) -> Any:
    """The value at a dotted path of `result`, None if it is not there."""
    value: Any = result
    for part in figure.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def evaluate(result: Mapping[str, Any], targets: Sequence[Target]) -> dict[str, dict[str, Any]]:
    """Each target's figure, its value in `result` and whether it is met."""
    return {
        t.figure: {
            "target": t.text,
            "value": lookup(result, t.figure),
            "met": t.met(lookup(result, t.figure)),
            "why": t.why,
        }
        for t in targets
    }


def with_targets(result: Mapping[str, Any], targets: Sequence[Target]) -> dict[str, Any]:
    """`result` with a `targets` object added (the JSON form)."""
    return {**result, "targets": evaluate(result, targets)}


def flatten(result: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of nested dicts, in order."""
    for key, value in result.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flatten(value, path + ".")
        else:
            yield path, value


def verdict(met: bool | None) -> str:
    """`met`, `MISSED`, or `not measured`."""
    return "not measured" if met is None else "met" if met else "MISSED"


def table(result: Mapping[str, Any], targets: Sequence[Target]) -> str:
    """Every figure with its value, and its target and verdict where it has one."""
    by_figure = {t.figure: t for t in targets}
    rows = [("FIGURE", "VALUE", "TARGET", "")]
    seen = set()
    for key, value in flatten(result):
        target = by_figure.get(key)
        seen.add(key)
        if target is None:
            rows.append((key, _cell(value), "", ""))
        else:
            rows.append((key, _cell(value), target.text, verdict(target.met(value))))
    for figure, target in by_figure.items():  # targets whose figure this run did not produce
        if figure not in seen:
            rows.append((figure, "-", target.text, verdict(None)))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)).rstrip()
        + ("  " + row[3] if row[3] else "")
        for row in rows
    ]
    verdicts = [t.met(lookup(result, t.figure)) for t in targets]
    lines.append(
        f"targets: {verdicts.count(True)} met, {verdicts.count(False)} missed"
        + (f", {verdicts.count(None)} not measured" if None in verdicts else "")
    )
    return "\n".join(lines)


def print_report(
    result: Mapping[str, Any],
    targets: Sequence[Target],
    *,
    as_json: bool,
    out: TextIO | None = None,
) -> None:
    """Print `result` and its targets on stdout: one JSON object, or the table."""
    out = out or sys.stdout
    if as_json:
        print(json.dumps(with_targets(result, targets)), file=out)
    else:
        print(table(result, targets), file=out)


class Progress:
    """`what: i/n label, elapsed, about T left` on stderr as each step of a run begins."""

    def __init__(
        self,
        what: str,
        steps: int | Sequence[float],
        *,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.weights = [1.0] * steps if isinstance(steps, int) else [float(w) for w in steps]
        self.stream = stream or sys.stderr
        self.clock = clock
        self.index = 0
        self._started = clock()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._width = 0

    def step(self, label: str) -> None:
        """Step `index + 1` of n begins; the estimate is from the pace of those before it."""
        now = self.clock() - self._started
        done = sum(self.weights[: self.index])
        left = sum(self.weights[self.index :])
        self.index += 1
        count = len(self.weights)
        estimate = f", about {_seconds(now / done * left)} left" if done > 0 else ""
        self._write(
            f"{self.what}: {self.index}/{max(count, self.index)} {label}, "
            f"{_seconds(now)} so far{estimate}"
        )

    def done(self) -> None:
        """The run is over: say how long it took."""
        self._write(f"{self.what}: done in {_seconds(self.clock() - self._started)}")
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()

    def _write(self, line: str) -> None:
        if self._tty:
            self._width = max(self._width, len(line))
            self.stream.write("\r" + line.ljust(self._width))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _seconds(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60} s"


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value == int(value) and abs(value) >= 1000 else f"{value:g}"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 1000 else f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, list | tuple | dict):
        return json.dumps(value)
    return str(value)
