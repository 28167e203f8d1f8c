"""Local kernels' slices through the broker: ask, wait, attach, resize, give back, free (local
backend only).

The decisions are the node ledger's, made in one transaction for everybody: quotas count every
server of a user, the FIFO queue holds all users' requests. What the broker adds is whose they
are. A request is the caller's and is held by the caller's process (from the socket's peer
credentials), so it dies with that process; a kernel process is attached only if it is the
caller's own — same OS user, and the very process (pid and start time) the caller names.
"""

from __future__ import annotations

import json
import re
from typing import Any, cast

import psutil

from jupyter_gpushare.backends.broker_base.authority import require_own
from jupyter_gpushare.backends.broker_base.handler import (
    KERNEL,
    BrokerHandler,
    kernel_id_field,
    label_field,
    request_fields,
)
from jupyter_gpushare.backends.broker_client.transport import TOKEN_HEADER
from jupyter_gpushare.backends.broker_client.wire import (
    device_to_json,
    holding_to_json,
    outcome_to_json,
    record_to_json,
)
from jupyter_gpushare.backends.local.backend import LocalBackend
from jupyter_gpushare.backends.local.broker.authority import LocalAuthority
from jupyter_gpushare.backends.processes import identify, same_process
from jupyter_gpushare.core.errors import GPUShareError, InvalidRequestError, NotYourSliceError
from jupyter_gpushare.core.records import Placed, ProcessIdentity, SliceRecord
from jupyter_gpushare.core.slice_request import MAX_NAME_BYTES, MAX_PATH_BYTES
from jupyter_gpushare.http_errors import answering_domain_errors

TOKEN_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class NeedsSocketError(GPUShareError):
    """Local slices are asked over the broker's Unix socket, where the caller's process is known."""


class SliceHandler(BrokerHandler):
    @property
    def local(self) -> LocalAuthority:
        return cast(LocalAuthority, self.authority)

    def mine(self) -> LocalBackend:
        if self.caller.process is None:
            raise NeedsSocketError(
                "local kernels' GPU slices are asked over the broker's Unix socket (the slice is "
                "held by the asking process); set c.GPUShare.broker_url = 'unix:/path/to/broker.sock'"
            )
        return self.local.as_seen_by(self.caller)

    def with_env(self, record: SliceRecord | None) -> dict[str, Any]:
        """A record and the variables a kernel holding it gets from its mode on this node."""
        if record is None or record.state != "running" or record.unit_uuid is None:
            return {"record": record_to_json(record) if record else None, "env": {}}
        return {"record": record_to_json(record), "env": self.local.local.slice_env(record)}

    def outcome(self, outcome: Any) -> dict[str, Any]:
        answer = outcome_to_json(outcome)
        if isinstance(outcome, Placed):
            answer.update(self.with_env(outcome.record))
        return answer


class AskHandler(SliceHandler):
    """``POST slices``: queue a request and place it if it fits (one transaction)."""

    @answering_domain_errors
    async def post(self) -> None:
        body = self.json_body()
        kernel_id = kernel_id_field(body, required=True)
        memory, mode, cores = request_fields(body)
        kernel_name = label_field(body, "kernel_name", MAX_NAME_BYTES)
        path = label_field(body, "path", MAX_PATH_BYTES)
        token_hash = body.get("token_hash")
        if token_hash is not None and not (isinstance(token_hash, str) and TOKEN_DIGEST.match(token_hash)):
            raise InvalidRequestError("token_hash must be a SHA-256 digest in hex (64 characters)")
        mine = self.mine()
        # A kernel id somebody else holds or claims is not to be taken over (a restart keeps
        # one's own), nor a kernel's process to ask under another kernel's id.
        await self.run(lambda: require_own(self.authority, self.caller, kernel_id, missing_ok=True))
        self.local.waiting.asked(kernel_id)
        request = await self.run(mine.check, memory, mode, cores, kernel_id)
        outcome = await self.run(
            lambda: mine.ask(kernel_id, request, kernel_name=kernel_name, path=path, token_hash=token_hash)
        )
        self.answer(self.outcome(outcome))


class PlaceHandler(SliceHandler):
    """``POST slices/{id}/place``: try again to place a waiting request."""

    @answering_domain_errors
    async def post(self, kernel_id: str) -> None:
        mine = self.mine()
        await self.run(require_own, self.authority, self.caller, kernel_id)
        self.local.waiting.asked(kernel_id)  # its requester still waits for it
        self.answer(self.outcome(await self.run(mine.poll, kernel_id)))


class SliceRecordHandler(SliceHandler):
    """``GET|PATCH|DELETE slices/{id}``: read (a kernel, with ``?as_kernel=1`` and its token:
    its own slice only), resize in place, free."""

    @answering_domain_errors
    async def get(self, kernel_id: str) -> None:
        record = await self.run(self.local.local.ledger.get, kernel_id)
        if record is None or not self.caller.may_act_on(record.owner):
            self.answer({"record": None, "env": {}})  # another user's reads as none at all
            return
        if self.get_argument("as_kernel", ""):
            token = self.request.headers.get(TOKEN_HEADER) or None
            record = await self.run(self.local.local.own_slice, kernel_id, token)
        self.answer(self.with_env(record))

    @answering_domain_errors
    async def patch(self, kernel_id: str) -> None:
        body = self.json_body()
        if set(body) != {"gpu_memory"}:
            raise InvalidRequestError('send {"gpu_memory": SIZE} to resize a slice')
        memory, _, _ = request_fields(body)
        if memory is None:
            raise InvalidRequestError('gpu_memory must be a size such as "8G", not null')
        await self.run(require_own, self.authority, self.caller, kernel_id)
        record = await self.run(self.local.as_seen_by(self.caller).resize, kernel_id, memory)
        self.answer(self.with_env(record))

    @answering_domain_errors
    async def delete(self, kernel_id: str) -> None:
        await self.run(lambda: require_own(self.authority, self.caller, kernel_id, missing_ok=True))
        record = await self.run(self.local.local.free, kernel_id)
        self.answer({"record": record_to_json(record) if record else None})


class GiveBackHandler(SliceHandler):
    """``DELETE slices/{id}/gpu``: give the slice back while the kernel runs on (the server's
    release, ``%gpu release``). What the kernel's processes hold is measured first and stays
    reserved until freed; the kernel keeps its claim on its id."""

    @answering_domain_errors
    async def delete(self, kernel_id: str) -> None:
        await self.run(lambda: require_own(self.authority, self.caller, kernel_id, missing_ok=True))
        record, held = await self.run(self.local.as_seen_by(self.caller).give_back, kernel_id)
        self.answer({"record": record_to_json(record), "held": holding_to_json(held)})


class ClaimHandler(SliceHandler):
    """``POST slices/{id}/claim`` (with the kernel's token): may the calling process take a
    slice under this kernel id again? Refused (403) unless it is the kernel that gave it back —
    judged on the process the socket's peer credentials name, not on anything the caller says."""

    @answering_domain_errors
    async def post(self, kernel_id: str) -> None:
        mine = self.mine()
        token = self.request.headers.get(TOKEN_HEADER) or None
        await self.run(mine.check_claim, kernel_id, token, mine.holder)
        self.answer({})


class AttachHandler(SliceHandler):
    """``PUT slices/{id}/kernel`` ``{"pid", "start"}``: the slice follows this kernel process from
    now on — if it is the caller's own; ``{"pid": null}``: back to the process that asked."""

    @answering_domain_errors
    async def put(self, kernel_id: str) -> None:
        body = self.json_body()
        pid, start = body.get("pid"), body.get("start")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
            raise InvalidRequestError(f"pid must be a process id or null, not {json.dumps(pid)}")
        if pid is not None and (isinstance(start, bool) or not isinstance(start, (int, float))):
            raise InvalidRequestError(
                f"start must be the process's start time in seconds, not {json.dumps(start)}"
            )
        await self.run(require_own, self.authority, self.caller, kernel_id)
        await self.run(self._attach, kernel_id, pid, start)
        self.answer({})

    def _attach(self, kernel_id: str, pid: int | None, start: float | None) -> None:
        ledger = self.local.local.ledger
        if pid is None:
            ledger.attach_kernel(kernel_id, None)
            return
        identity = identify(pid)
        if identity is None or start is None or not same_process(identity, ProcessIdentity(pid, start)):
            raise InvalidRequestError(
                f"there is no process {pid} started at {start}: it cannot hold a GPU slice"
            )
        if not self.caller.admin and process_uid(pid) != self.caller.uid:
            raise NotYourSliceError(
                f"process {pid} is not {self.caller.user}'s: only your own kernel process can hold "
                "your GPU slice"
            )
        caller = self.caller.process
        if self.local.kernel_of(self.caller) is not None and caller is not None and pid != caller.pid:
            # A kernel names only itself: the slice must not follow another process of the user.
            raise NotYourSliceError(
                f"a kernel's GPU slice follows the kernel's own process, not process {pid}"
            )
        ledger.attach_kernel(kernel_id, identity)
        self.local.local.start_monitoring()


class DevicesHandler(SliceHandler):
    @answering_domain_errors
    async def get(self) -> None:
        devices = await self.run(self.local.local.devices)
        self.answer([device_to_json(device) for device in devices])


def process_uid(pid: int) -> int | None:
    """The real uid of process ``pid`` (None when it is gone)."""
    try:
        return int(psutil.Process(pid).uids().real)
    except psutil.Error:
        return None


ROUTES: list[tuple[str, type[BrokerHandler]]] = [
    ("slices", AskHandler),
    (f"slices/{KERNEL}/place", PlaceHandler),
    (f"slices/{KERNEL}/kernel", AttachHandler),
    (f"slices/{KERNEL}/claim", ClaimHandler),
    (f"slices/{KERNEL}/gpu", GiveBackHandler),
    (f"slices/{KERNEL}", SliceRecordHandler),
    ("devices", DevicesHandler),
]

__all__ = ["ROUTES", "NeedsSocketError"]
