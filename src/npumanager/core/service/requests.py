"""The service's record of each live request: its delivery queue, device, models and work.

`Requests` holds them by key, the live work ids by the model that submitted them, and the
delivery queues that have callbacks to schedule once the service lock is released. It
checks what a client may do with its own requests, models and work; the decisions stay
the arbiter's. Every method runs under the service lock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from npumanager.core.arbiter.actions import RequestKey
from npumanager.core.client.dispatch import SerialQueue, Task
from npumanager.core.client.manager import Delivery, LoadedModel
from npumanager.errors import (
    CapacityError,
    UnknownModelError,
    UnknownRequestError,
    UnknownWorkError,
)
from npumanager.schemas import ModelLoadRequest
from npumanager.schemas.limits import grant_allowance_bytes


@dataclass
class RequestRecord(Delivery):
    """What the service keeps for one live request: its delivery, device and models."""

    device: int | None = None
    models: list[LoadedModel] = field(default_factory=list)


class Requests:
    """The live requests' records, their work, and the queues waiting to be scheduled."""

    def __init__(self) -> None:
        self._records: dict[RequestKey, RequestRecord] = {}
        self._requests_of: Counter[int] = Counter()
        """Live requests, by client."""
        self._models: dict[tuple[int, int], LoadedModel] = {}
        """Loaded models by (client, handle)."""
        self._models_of: Counter[int] = Counter()
        """Loaded models, by client."""
        self._work_models: dict[int, LoadedModel] = {}
        self._to_schedule: list[SerialQueue] = []

    def __contains__(self, key: RequestKey) -> bool:
        return key in self._records

    def get(self, key: RequestKey) -> RequestRecord | None:
        """The record of a live request, or None."""
        return self._records.get(key)

    def clients(self) -> list[int]:
        """The clients with live requests, in order."""
        return sorted({key.client for key in self._records})

    def model_devices(self) -> dict[RequestKey, int]:
        """The device each request with a model loaded holds it on."""
        return {key: r.models[0].device for key, r in self._records.items() if r.models}

    def add(self, key: RequestKey, record: RequestRecord) -> None:
        """Keep a new request's record (the arbiter has refused a duplicate already)."""
        assert key not in self._records, key
        self._records[key] = record
        self._requests_of[key.client] += 1

    def remove(self, key: RequestKey) -> None:
        """Forget a request that ended (its models were dropped first)."""
        del self._records[key]
        _less(self._requests_of, key.client, 1)

    def holdings(self, client: int) -> tuple[int, int]:
        """How many live requests and loaded models a client holds."""
        return self._requests_of[client], self._models_of[client]

    def model(self, client: int, handle: int) -> LoadedModel:
        """A model the client loaded and holds (`UnknownModelError` otherwise)."""
        model = self._models.get((client, handle))
        if model is None:
            raise UnknownModelError(f"model {handle} is not loaded by this client")
        return model

    def keep_model(self, record: RequestRecord, model: LoadedModel) -> None:
        """A model was loaded under the request."""
        record.models.append(model)
        self._models[(model.manager.client, model.handle)] = model
        self._models_of[model.manager.client] += 1

    def drop_models(self, record: RequestRecord, *models: LoadedModel) -> None:
        """Models (all of them when none is named) left the request."""
        gone = list(models or record.models)
        for model in gone:
            record.models.remove(model)
            del self._models[(model.manager.client, model.handle)]
        if gone:
            _less(self._models_of, gone[0].manager.client, len(gone))

    def live(self, key: RequestKey, request: ModelLoadRequest) -> RequestRecord:
        """The record of the client's live `request` (`UnknownRequestError` otherwise)."""
        record = self._records.get(key)
        if record is None or record.request != request:
            raise UnknownRequestError(f"request {request.id} is not a live request of this client")
        return record

    def allowance_left(self, record: RequestRecord, declared: int | None) -> int:
        """The weight bytes the request's grant still allows (0 when it holds them all)."""
        allowed = grant_allowance_bytes(record.request.size, declared)
        return max(0, allowed - sum(model.weight_bytes for model in record.models))

    def check_allowance(self, record: RequestRecord, declared: int | None, weight: int) -> None:
        """Refuse a load that would take the request past what its grant allows."""
        request = record.request
        allowed = grant_allowance_bytes(request.size, declared)
        held = sum(model.weight_bytes for model in record.models)
        if held + weight <= allowed:
            return
        grant = (
            f"declared {declared} bytes"
            if declared is not None
            else f"{request.size.name} (at most {allowed} bytes without declared weight_bytes)"
        )
        raise CapacityError(
            f"request {request.id} was granted {grant} and holds {held} of {allowed} bytes; "
            f"loading {weight} more would exceed the grant: ask for a larger size class "
            "or declare weight_bytes when requesting"
        )

    def check_model(self, model: LoadedModel) -> None:
        """`UnknownModelError` unless the model is still loaded under a live request."""
        record = self._records.get(model.request_key)
        if record is None or model not in record.models:
            raise UnknownModelError(
                f"model {model.handle} is no longer loaded (its request ended or it was revoked)"
            )

    def work_submitted(self, work_id: int, model: LoadedModel) -> None:
        """The model submitted this work; only it may cancel it."""
        self._work_models[work_id] = model

    def check_work(self, model: LoadedModel, work_id: int) -> None:
        """`UnknownWorkError` unless the work is live and was submitted by this model."""
        if self._work_models.get(work_id) is not model:
            raise UnknownWorkError(
                f"work {work_id} is not live work of model {model.handle}: a model may "
                "cancel only work it submitted and that has not ended"
            )

    def work_ended(self, work_id: int) -> None:
        """The work ended for good (not a pause)."""
        self._work_models.pop(work_id, None)

    def deliver(self, record: RequestRecord, task: Task) -> None:
        """Queue a callback for the request; its queue is scheduled at the next flush."""
        if record.queue.put(task):
            self._to_schedule.append(record.queue)

    def take_queues(self) -> list[SerialQueue]:
        """The queues that got deliveries since the last call."""
        queues, self._to_schedule = self._to_schedule, []
        return queues


def _less(counts: Counter[int], client: int, by: int) -> None:
    left = counts[client] - by
    if left > 0:
        counts[client] = left
    else:
        del counts[client]
