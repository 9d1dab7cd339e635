"""One model of a program under `npu-manager run`, whatever runtime it was made with: it asks
the daemon before it loads, loads into the app's model host, runs there, gives the model back
when the manager asks, and loads it again on the next run.

A process has one connection to the daemon, made on first use; a child after `fork` forgets
its parent's (it shares the parent's socket) and makes its own on its first load.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from collections.abc import Mapping
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import npumanager as npu
from npumanager.errors import (
    DaemonUnavailableError,
    ModelHostError,
    NpuManagerError,
    RequestStateError,
    UnknownModelError,
    UnknownRequestError,
)
from npumanager.run._boot.npumanager_run_boot import WARNING_PREFIX
from npumanager.run.settings import REFUSE, Settings
from npumanager.schemas import ModelLoadRequestStatus, ModelLoadStatus, UnloadReason
from npumanager.schemas.limits import MAX_INTRA_OP_THREADS, NOMINAL_MODEL_BYTES


class NotGrantedError(NpuManagerError):
    """The manager did not let the model load: refused, cancelled, or no grant in time."""


class HostLostError(NpuManagerError):
    """The model's host ended; the next run loads the model again (in a new host)."""


class RunCancelledError(NpuManagerError):
    """The manager cancelled a run (its model was taken back while it ran)."""


def size_class(nbytes: int) -> int:
    """The HAL size class of a model of `nbytes` counted bytes."""
    for index, nominal in enumerate(NOMINAL_MODEL_BYTES[:-1]):
        if nbytes < nominal:
            return index
    return len(NOMINAL_MODEL_BYTES) - 1


def asked_threads(value: Any) -> int:
    """The threads a program's runtime options ask for its runs, as `load_model(threads=)`
    takes them: 0 (the runtime's default, one per CPU) when unset, not a count or not
    above 0; never more than `MAX_INTRA_OP_THREADS`."""
    if isinstance(value, bool):
        return 0
    try:
        threads = int(value)
    except (TypeError, ValueError):
        return 0
    return min(threads, MAX_INTRA_OP_THREADS) if threads > 0 else 0


_WARNED: set[str] = set()
"""The uncarried models this process was warned of, once each (`run_unmanaged`)."""


def run_unmanaged(settings: Settings, foreign: str) -> str | None:
    """A model whose ``foreign`` input or output the data plane cannot carry: the reason
    to refuse it where every model must go through the manager (``--no-daemon refuse``),
    else None once one warning line says it runs in the program's own process."""
    why = f"its {foreign} cannot cross the manager's data plane (tensors of numbers only)"
    if settings.no_daemon == REFUSE:
        return f"npu-manager refused the model: {why}"
    if why not in _WARNED:
        _WARNED.add(why)
        sys.stderr.write(f"{WARNING_PREFIX} a model runs in this process, unmanaged: {why}\n")
    return None


@dataclass(frozen=True)
class Source:
    """What a model is loaded from: a file (``path``) or its bytes (``data``)."""

    path: Path | None
    data: bytes | None
    nbytes: int
    """The bytes counted for its size class: the file's and its weights files', or the data's."""


class _Process:
    """The process's one connection to the daemon, made lazily and forgotten after a fork."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.manager: npu.NpuManager | None = None
        self.next_id = 1
        self.warned = False
        self.orphans: list[object] = []
        """A parent's connection as a child saw it: kept, never closed (it is the parent's)."""

    def connect(self, settings: Settings) -> npu.NpuManager | None:
        """The connection, or None when no daemon answers and the program runs unmanaged."""
        with self.lock:
            if self.manager is None:
                try:
                    self.manager = npu.connect(uses_feature=True)
                except DaemonUnavailableError as error:
                    if settings.no_daemon == REFUSE:
                        raise NotGrantedError(f"no npu-manager daemon answers: {error}") from None
                    if not self.warned:
                        self.warned = True
                        sys.stderr.write(
                            f"{WARNING_PREFIX} no daemon answers ({error}); models run in this "
                            "process, unmanaged\n"
                        )
                    return None
            return self.manager

    def request_id(self) -> int:
        with self.lock:
            self.next_id += 1
            return self.next_id - 1

    def lost(self, manager: npu.NpuManager) -> None:
        """The daemon closed `manager`'s connection: the next load connects again."""
        with self.lock:
            if self.manager is manager:
                self.manager = None

    def after_fork(self) -> None:
        self.lock = threading.Lock()
        if self.manager is not None:
            self.orphans.append(self.manager)
        self.manager = None


PROCESS = _Process()
_LIVE: weakref.WeakSet[ManagedModel] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    PROCESS.after_fork()
    for model in list(_LIVE):
        model.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Grant(npu.ModelLoadRequestCallback):
    """The decisions about one load request, and the owner told when the model must go."""

    def __init__(self, owner: ManagedModel) -> None:
        self.owner = owner
        self.changed = threading.Condition()
        self.status: ModelLoadStatus | None = None
        self.completion: ModelLoadRequestStatus | None = None
        self.reason: UnloadReason | None = None

    def on_can_load_model(self, request: Any, status: ModelLoadStatus, listener: Any) -> None:
        with self.changed:
            self.status = ModelLoadStatus(status)
            self.changed.notify_all()

    def on_request_unload_model(self, request: Any, reason: UnloadReason | None = None) -> None:
        self.reason = reason
        self.owner.unload_asked(self)

    def on_model_load_request_complete(self, request: Any, status: ModelLoadRequestStatus) -> None:
        with self.changed:
            self.completion = ModelLoadRequestStatus(status)
            self.changed.notify_all()
        self.owner.unload_asked(self)

    def wait(self, request: npu.ModelLoadRequest, timeout_s: float) -> None:
        """Wait for CAN_LOAD_NOW; raise `NotGrantedError` saying why it did not come."""
        with self.changed:
            granted = self.changed.wait_for(
                lambda: self.status == ModelLoadStatus.CAN_LOAD_NOW or self.completion is not None,
                timeout_s,
            )
        if self.completion is not None:
            raise NotGrantedError(
                f"npu-manager ended the model's load request ({self.completion.name}) before "
                "it was granted"
            )
        if not granted:
            last = "no answer" if self.status is None else self.status.name
            raise NotGrantedError(
                f"npu-manager did not grant the model within {timeout_s:g} s (last decision: "
                f"{last}); set the wait with npu-manager run --timeout"
            )


class ManagedModel:
    """A model under the manager: `run` loads it when it is not loaded, then runs it in the
    app's model host; an unload request gives it back as soon as no run uses it."""

    def __init__(
        self,
        source: Source,
        settings: Settings,
        manager: npu.NpuManager,
        threads: int | None = None,
        options: Mapping[str, str] | None = None,
    ) -> None:
        self.source = source
        self.settings = settings
        self.threads = threads
        """The threads the program asked its runtime to run the model on (0: the runtime's
        default, one per CPU), asked of the manager at each load."""
        self.options = dict(options) if options else None
        """The runtime options the program set that change what a run computes, asked of
        the manager at each load (`NpuManager.load_model`)."""
        self.loads = 0
        """How many times the model was loaded (1 + each reload after an unload)."""
        self._pid = os.getpid()
        self._manager: npu.NpuManager | None = manager
        self._load_lock = threading.Lock()
        self._cv = threading.Condition()
        self._model: npu.LoadedModel | None = None
        self._grant: _Grant | None = None
        self._asked = False
        self._inflight = 0
        self._closed = False
        _LIVE.add(self)
        self._release(self._acquire())  # loaded at creation, as the runtime's session is

    # Running ------------------------------------------------------------------------------

    def run(self, inputs: dict[str, Any]) -> list[Any]:
        """The model's outputs, in the model's order; an unloaded model is loaded first."""
        for attempt in (1, 2):
            model = self._acquire()
            try:
                return model.run(inputs)
            except UnknownModelError:  # taken back before this run reached it: load again
                self._drop(model)
                if attempt == 2:
                    raise
            except ModelHostError as error:
                self._drop(model)
                raise HostLostError(f"npu-manager: the model's host ended: {error}") from None
            except CancelledError as error:
                self._drop(model)
                raise RunCancelledError(
                    f"npu-manager cancelled the run ({error or 'its model was taken back'}): "
                    "the model was unloaded or its model host ended; the next run loads it again"
                ) from None
            except DaemonUnavailableError:
                self._drop(model)
                PROCESS.lost(model.manager)
                raise
            finally:
                self._release(model)
        raise AssertionError("unreachable")

    def submit(self, inputs: dict[str, Any]) -> Future[list[Any]]:
        """A future of the outputs (its `cancel` cancels the work in the host)."""
        model = self._acquire()
        try:
            future: Future[list[Any]] = model.submit(inputs)  # type: ignore[assignment]
        except BaseException:
            self._release(model)
            raise
        future.add_done_callback(lambda _f: self._release(model))
        return future

    def close(self) -> None:
        """Give the model back for good (the session is gone)."""
        with self._cv:
            self._closed = True
            taken = self._take() if self._inflight == 0 else None
        self._give_back(taken)

    # The model's life ---------------------------------------------------------------------

    def _acquire(self) -> npu.LoadedModel:
        with self._cv:
            if self._pid != os.getpid():
                self.after_fork()
            if self._model is not None and not self._asked:
                self._inflight += 1
                return self._model
        with self._load_lock:
            with self._cv:
                if self._model is not None and not self._asked:
                    self._inflight += 1
                    return self._model
                self._cv.wait_for(lambda: self._inflight == 0)
                old = self._take()
            self._give_back(old)
            model, grant = self._load()
            with self._cv:
                self._model, self._grant, self._asked = model, grant, False
                self._inflight += 1
            if grant.completion is not None or grant.reason is not None:
                self.unload_asked(grant)  # asked back while it loaded
            return model

    def _release(self, model: npu.LoadedModel) -> None:
        with self._cv:
            self._inflight -= 1
            if self._inflight:
                return
            self._cv.notify_all()
            wanted = self._asked or self._closed
            taken = self._take() if wanted and self._model is model else None
        self._give_back(taken)

    def unload_asked(self, grant: _Grant) -> None:
        """The manager wants the model back (or took it): give it back once no run uses it."""
        with self._cv:
            if grant is not self._grant:
                return
            self._asked = True
            taken = self._take() if self._inflight == 0 else None
        self._give_back(taken)

    def _drop(self, model: npu.LoadedModel) -> None:
        with self._cv:
            if self._model is model:
                self._asked = True

    def _take(self) -> tuple[npu.NpuManager, npu.ModelLoadRequest, _Grant] | None:
        """Detach the loaded model (under the lock); `_give_back` then reports it unloaded."""
        if self._model is None or self._grant is None:
            return None
        taken = (self._model.manager, self._model.request, self._grant)
        self._model = self._grant = None
        return taken

    @staticmethod
    def _give_back(taken: tuple[npu.NpuManager, npu.ModelLoadRequest, _Grant] | None) -> None:
        if taken is None:
            return
        manager, request, grant = taken
        if grant.completion is not None:
            return
        # the request may have ended meanwhile, or the connection
        with contextlib.suppress(UnknownRequestError, RequestStateError, DaemonUnavailableError):
            manager.listener.notify_model_unloaded(request)

    def _load(self) -> tuple[npu.LoadedModel, _Grant]:
        manager = self._manager
        if manager is None:
            manager = PROCESS.connect(self.settings)
            if manager is None:
                raise NotGrantedError("no npu-manager daemon answers any more")
        self._manager = None  # the creator's connection serves the first load only
        request = (
            npu.ModelLoadRequest.Builder(PROCESS.request_id())
            .set_size(size_class(self.source.nbytes))
            .set_priority(int(self.settings.priority))
            .build()
        )
        grant = _Grant(self)
        try:
            manager.request_can_load_model(request, grant)
            grant.wait(request, self.settings.timeout_s)
            model = manager.load_model(
                request,
                model=self.source.data,
                path=self.source.path,
                threads=self.threads,
                options=self.options,
            )
            manager.listener.notify_model_loaded(request)
        except DaemonUnavailableError:
            PROCESS.lost(manager)
            raise
        except BaseException as error:
            if grant.completion is None:
                with contextlib.suppress(NpuManagerError):
                    manager.cancel_model_load(request)
            if isinstance(error, NpuManagerError) and not isinstance(error, NotGrantedError):
                raise NotGrantedError(f"{type(error).__name__}: {error}") from None
            raise
        self.loads += 1
        return model, grant

    def after_fork(self) -> None:
        """In a child: the parent's model and connection are not ours; load anew when run."""
        self._pid = os.getpid()
        self._load_lock = threading.Lock()
        self._cv = threading.Condition()
        self._model = self._grant = self._manager = None
        self._asked = False
        self._inflight = 0
