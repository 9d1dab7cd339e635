"""The suite's rules as a table: rule, test, the capability it needs, what a driver must do.

`npu-manager vts --list` prints it and CONTRIBUTING.md shows it; a test keeps the three
in step with the suite's test methods.
"""

from __future__ import annotations

from typing import NamedTuple


class Rule(NamedTuple):
    """One rule of the suite and the test that checks it."""

    rule: str
    test: str
    capability: str
    must: str


ALL = "-"
RULES: tuple[Rule, ...] = (
    Rule(
        "SetSchedulingConfigs",
        "test_SetSchedulingConfigs",
        ALL,
        "hold valid configs, one per uid, and rank work by them",
    ),
    Rule(
        "SetSchedulingConfigsInvalidPriority",
        "test_SetSchedulingConfigsInvalidPriority",
        ALL,
        "reject a priority outside 0..1000 as an illegal argument, changing nothing",
    ),
    Rule(
        "SetSchedulingConfigsDuplicateUid",
        "test_SetSchedulingConfigsDuplicateUid",
        ALL,
        "reject two configs for one uid, changing nothing",
    ),
    Rule(
        "UpdateSchedulingConfigs",
        "test_UpdateSchedulingConfigs",
        ALL,
        "update upserts per uid; set replaces the whole set; an empty set clears it",
    ),
    Rule(
        "RejectedConfigsKeepScheduling",
        "test_RejectedConfigsKeepScheduling",
        ALL,
        "after a rejected set or update, schedule work exactly as before",
    ),
    Rule(
        "UpdateUpsertsByBehaviour",
        "test_UpdateUpsertsByBehaviour",
        ALL,
        "after an update, rank uids not named by their old config",
    ),
    Rule(
        "QueuedWorkReranked",
        "test_QueuedWorkReranked",
        ALL,
        "re-rank queued work when its uid's priority changes",
    ),
    Rule(
        "SetCallback",
        "test_SetCallback",
        ALL,
        "deliver events to the one callback set; the replaced one gets nothing more",
    ),
    Rule(
        "SetCallbackNull",
        "test_SetCallbackNull",
        ALL,
        "with no callback, call nobody and keep events for take_events",
    ),
    Rule(
        "RunInferenceStatusCallbacks",
        "test_RunInferenceStatusCallbacks",
        ALL,
        "one inference: Requested, Started(INITIAL), Ended(COMPLETED), fields as submitted",
    ),
    Rule(
        "RunInferenceEffectivePriority",
        "test_RunInferenceEffectivePriority",
        ALL,
        "effective priority = the uid's priority + the job priority",
    ),
    Rule(
        "ClampJobPriority",
        "test_ClampJobPriority",
        ALL,
        "clamp the job priority into [minPriority, maxPriority] before adding appPriority",
    ),
    Rule(
        "RunInferencesPrioritized",
        "test_RunInferencesPrioritized",
        ALL,
        "more important work submitted later finishes first (without preemption: starts on "
        "a free channel at once)",
    ),
    Rule(
        "RunInferenceFailsWithoutDirectAccess",
        "test_RunInferenceFailsWithoutDirectAccess",
        ALL,
        "work of a uid without direct access is requested and ends FAILED",
    ),
    Rule(
        "RunInferenceFailsWithoutAttributeOtherUid",
        "test_RunInferenceFailsWithoutAttributeOtherUid",
        ALL,
        "attributing another uid needs canAttributeOtherUid",
    ),
    Rule(
        "ConcurrentSubmittersIdOrder",
        "test_ConcurrentSubmittersIdOrder",
        ALL,
        "distinct ids for concurrent submits; Requested in id order",
    ),
    Rule(
        "WorkIdsPast65536",
        "test_WorkIdsPast65536",
        ALL,
        "ids strictly increase past 65,536 work items (no 16-bit counter)",
    ),
    Rule(
        "TimestampsNeverDecrease",
        "test_TimestampsNeverDecrease",
        ALL,
        "timestampMs never decreases across all events of all devices; Ended not before Started",
    ),
    Rule(
        "FifoWithinUid",
        "test_FifoWithinUid",
        ALL,
        "one uid's work of equal priority runs in submission order",
    ),
    Rule(
        "FifoAfterPause",
        "test_FifoAfterPause",
        "preemption",
        "a resumed job keeps its place among equal priorities",
    ),
    Rule(
        "PausesLeastImportant",
        "test_PausesLeastImportant",
        "preemption",
        "on several channels, pause the least important running job",
    ),
    Rule(
        "RestartPreemption",
        "test_RestartPreemption",
        "restart_preemption",
        "for a more important band with no free channel, stop a running job of a less "
        "important band (runtime cancel) and requeue it: Ended(PAUSED), then Started(RESUMED) "
        "from the start; never for its own band",
    ),
    Rule(
        "Cancel",
        "test_CancelSemantics",
        ALL,
        "cancel ends queued or running work CANCELLED_USER; stale ids are a LookupError",
    ),
    Rule(
        "ShareBetweenUids",
        "test_ShareBetweenUids",
        ALL,
        "equal priorities across uids: shared under fair_share, else strict FIFO",
    ),
    Rule(
        "FloorForLowerBands",
        "test_FloorForLowerBands",
        "fair_share",
        "a lower band with waiting work gets its floor share: done before the busy band's "
        "last job, or held a channel for its length before that job started",
    ),
    Rule(
        "PausedResumed",
        "test_PausedResumedPairing",
        "preemption",
        "every Ended(PAUSED) is followed by Started(RESUMED)",
    ),
    Rule(
        "Debounce",
        "test_DebounceDefaultWindow",
        ALL,
        "default window 50 ms; back-to-back work of a uid gives one Requested, Started, Ended",
    ),
    Rule(
        "DebounceHoldsEnded",
        "test_DebounceHoldsEnded",
        ALL,
        "hold Ended until the uid has been idle for the window",
    ),
    Rule(
        "DebounceSuppressesWithinWindow",
        "test_DebounceSuppressesWithinWindow",
        ALL,
        "suppress Requested/Started of work within the window of a held Ended",
    ),
    Rule(
        "DebounceZero",
        "test_DebounceZero",
        ALL,
        "a window of 0 delivers every event; a negative one is illegal",
    ),
    Rule(
        "UnloadFreesItsBytes",
        "test_UnloadFreesItsBytes",
        ALL,
        "unload frees exactly the model's bytes",
    ),
    Rule(
        "MemoryAccounting",
        "test_MemoryAccounting",
        ALL,
        "bytes used equal the sum of loaded models after any loads, refusals, unloads",
    ),
    Rule(
        "UnloadCancelsItsWork",
        "test_UnloadCancelsItsWork",
        ALL,
        "unload ends the model's queued and running work CANCELLED_SYSTEM",
    ),
    Rule(
        "Capacity",
        "test_CapacityErrorLeavesNothingLoaded",
        ALL,
        "a load that does not fit raises CapacityError and loads nothing",
    ),
    Rule(
        "DeviceNumbering",
        "test_DeviceNumbering",
        ALL,
        "devices numbered from 0; events name the device; others are refused",
    ),
    Rule(
        "DeviceNumbering",
        "test_DeviceNumberingMultiDevice",
        "multi_device",
        "the same on three devices",
    ),
    Rule(
        "ThermalModel",
        "test_ThermalModel",
        "thermal_model",
        "add_heat raises the device temperature",
    ),
    Rule(
        "MatchesReferenceDevice",
        "test_MatchesReferenceDevice",
        "virtual_time",
        "match the reference device op by op and event by event",
    ),
)
"""Every test of `~npumanager.testing.DriverSuite`, in the order it runs."""


def table() -> list[list[str]]:
    """The rows `vts --list` prints."""
    return [[r.rule, r.test, r.capability, r.must] for r in RULES]
