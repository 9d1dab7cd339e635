"""The inference a lane waits for, while it waits: what `cancel_lane` cancels."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from npumanager.core.service.service import Service
from npumanager.errors import UnknownWorkError

if TYPE_CHECKING:
    from npumanager.core.client.manager import LoadedModel


class Running:
    """One lane's live work, by model and work id, for a cancel from another thread."""

    def __init__(self, service: Service) -> None:
        self._backend = service.backend
        self._lock = threading.Lock()
        self._work: tuple[LoadedModel, int] | None = None

    def now(self, model: LoadedModel | None, work_id: int = 0) -> None:
        """The lane waits for `work_id` of `model` now (None: for nothing)."""
        with self._lock:
            self._work = None if model is None else (model, work_id)

    def cancel(self) -> bool:
        """Cancel the work the lane waits for: False if it waits for none (it ended)."""
        with self._lock:
            work = self._work
            if work is None:
                return False
            try:
                self._backend.cancel_work(*work)
            except UnknownWorkError:
                return False
            return True
