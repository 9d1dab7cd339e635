"""What each client call does: the service's backend interface, for one connection.

The service holds the one record of each request and model, by the connection's client
number, so a client names and acts on only what it made, and the service's checks are
the only ones. The management calls check the kernel's credentials first.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final

from npumanager.core.client.dispatch import Task
from npumanager.core.client.manager import LoadedModel, NpuManager
from npumanager.core.service.service import Service
from npumanager.daemon.peer import PeerCredentials
from npumanager.daemon.server.connection import Connection
from npumanager.daemon.server.importance import AppImportance
from npumanager.daemon.wire import protocol as p
from npumanager.errors import (
    IllegalArgumentError,
    ModelHostError,
    NpuPermissionError,
    UnknownModelError,
)
from npumanager.schemas import ModelLoadRequest


class NoReply:
    """What a handler returns when its call is answered later, or not at all."""


NO_REPLY: Final = NoReply()

Handler = Callable[[Connection, Any], dict[str, Any] | bytes | NoReply | None]
"""A call's handler: its result as a dict, as JSON already encoded, None (an empty reply),
or `NO_REPLY`."""


class Calls:
    """The handler of every call, by message type."""

    def __init__(
        self,
        service: Service,
        post: Callable[[Task], None],
        management_group: int | None,
        importance: AppImportance,
    ) -> None:
        self.service = service
        self.importance = importance
        self.backend = service.backend
        self._post = post
        self.management_group = management_group
        self.handlers: dict[type[p.Call], Handler] = {
            p.RequestCanLoad: self.on_request,
            p.CancelLoad: self.on_cancel,
            p.NotifyLoaded: self.on_loaded,
            p.NotifyUnloaded: self.on_unloaded,
            p.LoadModel: self.on_load_model,
            p.Submit: self.on_submit,
            p.CancelWork: self.on_cancel_work,
            p.SetPolicy: self.on_set_policy,
            p.SetImportance: self.on_set_importance,
            p.SetAccess: self.on_set_access,
        }

    @staticmethod
    def manager_of(connection: Connection) -> NpuManager:
        """The connection's manager (it said hello)."""
        assert connection.manager is not None
        return connection.manager

    def live(self, connection: Connection, request_id: int) -> ModelLoadRequest:
        """One of the connection's live requests (`UnknownRequestError` otherwise)."""
        return self.backend.live_request(self.manager_of(connection), request_id)

    def model(self, connection: Connection, handle: int) -> LoadedModel:
        """A model the connection loaded and holds (`UnknownModelError` otherwise, or
        `ModelHostError` for one its dead model host took with it)."""
        try:
            return self.backend.model_of(self.manager_of(connection), handle)
        except UnknownModelError:
            why = connection.lost.get(handle)
            if why is not None:
                raise ModelHostError(
                    f"model {handle} is gone: its model host {why}; load it again"
                ) from None
            raise

    def on_request(self, connection: Connection, message: p.RequestCanLoad) -> None:
        manager = self.manager_of(connection)
        if message.uses_feature:
            manager.declare_feature()
        request = message.request
        connection.check_quota("requests")
        self.backend.request_load(
            manager, request, connection.callback, self._post, message.weight_bytes
        )

    def on_cancel(self, connection: Connection, message: p.CancelLoad) -> None:
        request = self.live(connection, message.request_id)
        self.backend.cancel_load(self.manager_of(connection), request)

    def on_loaded(self, connection: Connection, message: p.NotifyLoaded) -> None:
        request = self.live(connection, message.request_id)
        self.backend.notify_loaded(self.manager_of(connection), request)

    def on_unloaded(self, connection: Connection, message: p.NotifyUnloaded) -> None:
        request = self.live(connection, message.request_id)
        self.backend.notify_unloaded(self.manager_of(connection), request)

    def on_load_model(self, connection: Connection, message: p.LoadModel) -> dict[str, Any]:
        request = self.live(connection, message.request_id)
        connection.check_quota("models")
        model = self.backend.load_model(
            self.manager_of(connection), request, message.weight_bytes, message.sram_bytes
        )
        return {"model": model.handle, "device": model.device}

    def on_submit(self, connection: Connection, message: p.Submit) -> dict[str, Any]:
        work_id = self.backend.submit_work(
            self.model(connection, message.model),
            message.cost_cycles,
            message.job_priority,
            message.original_uid,
            message.group_id,
            message.feature_id,
        )
        return {"work_id": work_id}

    def on_cancel_work(self, connection: Connection, message: p.CancelWork) -> None:
        model = self.model(connection, message.model)
        if message.work_id in connection.inferences:
            connection.cancelled.add(message.work_id)  # its end is CANCELLED_USER
        try:
            self.backend.cancel_work(model, message.work_id)
        except Exception:
            connection.cancelled.discard(message.work_id)
            raise

    def may_manage(self, peer: PeerCredentials) -> bool:
        """True for root, the daemon's own uid and members of the management group."""
        return (
            peer.uid == 0
            or peer.uid == os.getuid()
            or (self.management_group is not None and peer.in_group(self.management_group))
        )

    def _check_management(self, connection: Connection, what: str) -> None:
        if self.may_manage(connection.peer):
            return
        group = "" if self.management_group is None else f", or group {self.management_group}"
        raise NpuPermissionError(
            f"uid {connection.peer.uid} may not {what}: it needs the management permission "
            f"(root, the daemon's uid {os.getuid()}{group})"
        )

    def on_set_policy(self, connection: Connection, message: p.SetPolicy) -> dict[str, Any]:
        self._check_management(connection, "set the policy")
        self.service.set_policy(message.policy, message.params)
        return {"policy": self.service.policy_name}

    def on_set_importance(self, connection: Connection, message: p.SetImportance) -> None:
        self._check_management(connection, "set importances")
        if (message.uid is None) == (message.app_id is None):
            raise IllegalArgumentError("set_importance names a uid or an app id, exactly one")
        if message.app_id is not None:
            self.importance.pin_app(message.app_id, message.importance)
        else:
            assert message.uid is not None
            self.importance.pin_uid(message.uid, message.importance)

    def on_set_access(self, connection: Connection, message: p.SetAccess) -> None:
        self._check_management(connection, "set scheduling configs")
        self.service.set_uid_access(
            message.uid,
            has_direct_access=message.has_direct_access,
            can_attribute_other_uid=message.can_attribute_other_uid,
        )
