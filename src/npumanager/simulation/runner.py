"""Play a scenario twice: *direct* (every app loads and submits straight to the driver, as
before the NPU manager) and *managed* (through the service and its policy).

Both runs step virtual time a millisecond at a time and measure the same things: camera
frames and deadline misses, background throughput, loads that would not fit (each would
wake the low-memory killer), memory and temperature peaks, throttled time, unload requests.
Either run can feed telemetry sinks (`sinks=`): the managed run through the service, the
direct run through a hub of its own, both inline at every millisecond, so nothing is lost.

This module is the face of the parts: `direct` and `managed` (the two runs), `apps` (the
apps as a run plays them) and `results` (what a run measured).
"""

from __future__ import annotations

from npumanager.simulation.direct import run_direct
from npumanager.simulation.managed import run_managed
from npumanager.simulation.results import MS_US, Progress, RunMetrics, RunResult, Sample

__all__ = ["MS_US", "Progress", "RunMetrics", "RunResult", "Sample", "run_direct", "run_managed"]
