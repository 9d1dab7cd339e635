"""Model hosts held to their grants by what the kernel counts, never by their word.

A host runs what an untrusted model makes its runtime do, and with the data plane it runs
what its client sends it directly: so every `AUDIT_PERIOD_S` a thread of the daemon reads
each host's CPU time as the kernel counts it (its cgroup's ``cpu.stat`` where it has a
cgroup v2 of its own, else ``/proc/PID/stat``: every thread, user and system) and holds
it to what the daemon granted it in that time: the time its grants were open (runs,
leases, loads; `daemon.host.grants`) times the CPUs a run may use, plus
`AUDIT_ALLOWANCE` of one CPU for a host's own upkeep. A host over that is throttled
(`SIGSTOP` for `THROTTLE_S`, then `SIGCONT`); one over it `AUDIT_STRIKES` times, less one
for each period it kept within, is killed, and the reason goes where a host's death goes
(its models' loss, `info` and `npu-manager apps`, the model-host event).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from npumanager.daemon.host.client import ModelHost
from npumanager.schemas.limits import (
    AUDIT_ALLOWANCE,
    AUDIT_PERIOD_S,
    AUDIT_STRIKES,
    THROTTLE_S,
)

log = logging.getLogger(__name__)
_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def cpu_ns(pid: int, cgroup: Path | None = None) -> int | None:
    """The CPU time the kernel has counted for process `pid` (all its threads) or its
    cgroup v2 `cgroup`, in ns; None once it is gone."""
    try:
        if cgroup is not None:
            for line in (cgroup / "cpu.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "usage_usec":
                    return int(value) * 1000
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_NS  # utime, stime: fields 14 and 15


@dataclass
class Watched:
    """One host under audit: its last readings and its strikes."""

    host: ModelHost
    cpu_ns: int
    granted_ns: int
    cgroup: Path | None
    strikes: int = 0
    throttled_until: float = 0.0
    over: list[str] = field(default_factory=list)


class HostAudit:
    """The thread that reads every host's CPU time and holds it to the host's grants."""

    def __init__(
        self,
        *,
        period_s: float = AUDIT_PERIOD_S,
        cpus: int | None = None,
        read: Callable[[int, Path | None], int | None] = cpu_ns,
    ) -> None:
        self.period_s = period_s
        self.cpus = cpus or os.cpu_count() or 1
        self._read = read
        self._lock = threading.Lock()
        self._watched: dict[int, Watched] = {}
        self._wake = threading.Event()
        self._stopping = False
        self.throttled = 0
        self.killed = 0
        self.periods = 0
        """How many periods the thread has audited (the hosts watched then)."""
        self._thread: threading.Thread | None = None

    def watch(self, host: ModelHost) -> None:
        """Audit `host` from now on (its start-up, before it served, is not held to
        anything); the thread starts with the first host."""
        cgroup = host.cgroup.path if host.cgroup is not None and host.cgroup.version == 2 else None
        now = self._read(host.pid, cgroup)
        if now is None:
            return
        with self._lock:
            self._watched[host.pid] = Watched(host, now, host.grants.total_ns(), cgroup)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="npu-audit", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """End the thread, and let every host it throttled go on (nothing else would)."""
        self._stopping = True
        self._wake.set()
        self._resume_all()

    def _resume_all(self) -> None:
        with self._lock:
            watched = list(self._watched.values())
        for entry in watched:
            if entry.throttled_until:
                entry.throttled_until = 0.0
                entry.host.resume()

    def describe(self) -> dict[str, object]:
        """For `info`: the period, and how many hosts were throttled and killed."""
        return {
            "period_s": self.period_s,
            "periods": self.periods,
            "throttled": self.throttled,
            "killed": self.killed,
        }

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.period_s)
            if self._stopping:
                break
            with self._lock:
                watched = list(self._watched.values())
            for entry in watched:
                try:
                    self.check(entry)
                except Exception:  # one host's reading must not end the audit of the rest
                    log.exception("auditing model host %d failed", entry.host.pid)
            self.periods += 1
        self._resume_all()  # one it stopped while `stop` ran

    def check(self, entry: Watched) -> None:
        """One period's reading of one host: within its grants, throttled, or killed."""
        host = entry.host
        used_now = self._read(host.pid, entry.cgroup) if host.dead is None else None
        if used_now is None:
            with self._lock:
                self._watched.pop(host.pid, None)
            return
        if entry.throttled_until:
            if time.monotonic() < entry.throttled_until:
                return
            entry.throttled_until = 0.0
            host.resume()
            # What it did before the stop was judged already: start afresh.
            entry.cpu_ns, entry.granted_ns = used_now, host.grants.total_ns()
            return
        granted_now = host.grants.total_ns()
        used = used_now - entry.cpu_ns
        granted = (granted_now - entry.granted_ns) * self.cpus
        allowed = granted + int(AUDIT_ALLOWANCE * self.period_s * 1e9) + 2 * _TICK_NS
        entry.cpu_ns, entry.granted_ns = used_now, granted_now
        if used <= allowed:
            entry.strikes = max(0, entry.strikes - 1)
            return
        entry.strikes += 1
        entry.over.append(f"{used // 1_000_000} ms with {granted // 1_000_000} ms granted")
        del entry.over[:-AUDIT_STRIKES]
        if entry.strikes >= AUDIT_STRIKES:
            self.killed += 1
            host.condemn(
                "used more CPU time than the daemon granted it ("
                + "; ".join(entry.over)
                + f" in periods of {self.period_s:g} s, as the kernel counts it) "
                "and was killed"
            )
            with self._lock:
                self._watched.pop(host.pid, None)
            return
        self.throttled += 1
        log.warning(
            "the model host of uid %d (pid %d) used %d ms of CPU in %g s with %d ms granted: "
            "stopped for %g s (strike %d of %d)",
            host.uid,
            host.pid,
            used // 1_000_000,
            self.period_s,
            granted // 1_000_000,
            THROTTLE_S,
            entry.strikes,
            AUDIT_STRIKES,
        )
        entry.throttled_until = time.monotonic() + THROTTLE_S
        host.pause()
