"""Kernel pods through the broker (Kubernetes backend): ``POST pods``, ``GET|DELETE pods/{id}``,
and their kernels' reports of their cells, ``POST slices/{id}/activity``.

A server asks for its kernel's pod, then asks how it stands until it runs (queue position, the
pod's phase, the scheduler's words, then the connection info) — long asks, answered when that
changes —, keeps asking after it while the kernel lives, and deletes it at shutdown. The pod is
always the caller's: another user's kernel is "no such kernel".
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections.abc import Mapping
from typing import Any, cast

from jupyter_gpushare.backends.broker_base.authority import require_own
from jupyter_gpushare.backends.broker_base.handler import KERNEL, BrokerHandler
from jupyter_gpushare.backends.kubernetes.broker.authority import KubernetesAuthority
from jupyter_gpushare.backends.kubernetes.broker.pods import PodAsk, PodStarts, view_mark
from jupyter_gpushare.core import request_body
from jupyter_gpushare.core.errors import InvalidRequestError
from jupyter_gpushare.core.slice_request import MAX_NAME_BYTES
from jupyter_gpushare.http_errors import answering_domain_errors

HEX_KEY = re.compile(r"[0-9a-f]{16,128}")
CURVE_KEY_LENGTH = 40  # Z85 of 32 bytes
LONGEST_ASK = 30.0  # seconds a starting kernel's long ask may wait for news


class PodStartsHandler(BrokerHandler):
    """What the pods' routes share: the broker's kernel pod starts."""

    @property
    def pods(self) -> PodStarts:
        return cast(KubernetesAuthority, self.authority).pods


class PodsHandler(PodStartsHandler):
    """``POST pods``: check and queue a kernel pod start; answers how it stands (202): once its
    pod is created where it is admitted at once (:meth:`PodStarts.run_start`)."""

    @answering_domain_errors
    async def post(self) -> None:
        ask = parse_ask(self.json_body())
        caller = self.caller
        view = await self.pods.run_start(caller.user, caller.server_id, ask, caller.admin)
        self.answer({**view, "mark": view_mark(view)}, status=202)


class PodHandler(PodStartsHandler):
    """``GET pods/{id}[?wait=S&seen=MARK]``: how a start or a running kernel pod stands (renews
    its lease); with ``wait``, a long ask: answered once the view's mark is not ``seen`` (the
    ``mark`` of the caller's last answer), or after ``S`` seconds (a start's: at most
    ``LONGEST_ASK``; a running pod's: at most its lease's ``renew_within``).
    ``DELETE pods/{id}[?grace=N]``: delete its pod and Secret, or withdraw its queued start."""

    gone = False  # the caller hung up during a long ask

    def on_connection_close(self) -> None:
        self.gone = True
        super().on_connection_close()

    @answering_domain_errors
    async def get(self, kernel_id: str) -> None:
        wait = parse_wait(self.get_argument("wait", ""))
        seen = self.get_argument("seen", "")
        pods, caller = self.pods, self.caller
        asked = time.monotonic()
        while True:
            changed = pods.ask(kernel_id)  # before the read: a change after it wakes us
            try:
                view = await self.run(pods.view, caller.user, kernel_id, caller.admin)
                # A start's pod is never collected; a running one's lease is renewed by each
                # read, so its asks wait no longer than the lease's renew_within.
                longest = LONGEST_ASK if view["state"] in ("queued", "starting") else pods.longest_ask
                mark, left = view_mark(view), asked + min(wait, longest) - time.monotonic()
                if mark != seen or left <= 0 or self.gone:
                    break
                # At the deadline the view is read once more (and the lease renewed) to answer.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), left)
            finally:
                pods.forget_ask(kernel_id, changed)
        self.answer({**view, "mark": mark})

    @answering_domain_errors
    async def delete(self, kernel_id: str) -> None:
        text = self.get_argument("grace", "")
        if text and not text.isdigit():
            raise InvalidRequestError(f"grace must be a whole number of seconds, not {text!r}")
        grace = int(text) if text else None
        await self.run(self.pods.delete, self.caller.user, kernel_id, grace, self.caller.admin)
        self.answer({})


class PodActivityHandler(PodStartsHandler):
    """``POST slices/{id}/activity`` ``{"busy", "at", "idle_after", "idle_action"}``: a kernel
    pod's cell started or ended, passed on by its server (which checked the kernel's token):
    the caller's own kernels only."""

    @answering_domain_errors
    async def post(self, kernel_id: str) -> None:
        busy, at, idle_after, action = request_body.activity_report(self.json_body(), time.time())
        await self.run(require_own, self.authority, self.caller, kernel_id)
        await self.run(self.scoped().note_activity, kernel_id, None, busy, at, idle_after, action)
        self.answer({})


def parse_wait(text: str) -> float:
    """A long ask's ``wait`` (seconds, 0 or more; empty: 0, a plain ask)."""
    try:
        wait = float(text) if text else 0.0
    except ValueError:
        raise InvalidRequestError(f"wait must be a number of seconds, not {text[:40]!r}") from None
    if not math.isfinite(wait) or wait < 0:
        raise InvalidRequestError(f"wait must be a number of seconds of at least 0, not {text[:40]!r}")
    return wait


def parse_ask(body: Mapping[str, Any]) -> PodAsk:
    """A server's ``POST pods`` body, checked field by field (raises with what is wrong)."""
    kernel_id = request_body.check_kernel_id(body.get("kernel_id"))
    argv = body.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(part, str) for part in argv):
        raise InvalidRequestError("argv must be a non-empty list of strings")
    env = body.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise InvalidRequestError("env must be an object of strings")
    generation = body.get("generation", 0)
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise InvalidRequestError("generation must be a whole number of at least 0")
    token = body.get("token")
    if not isinstance(token, str) or not 16 <= len(token) <= 200:
        raise InvalidRequestError("token must be the kernel's own-slice secret (16-200 characters)")
    report_url = body.get("report_url")
    if report_url is not None and (
        not isinstance(report_url, str) or not report_url.startswith(("http://", "https://"))
    ):
        raise InvalidRequestError("report_url must be an http(s) URL or null")
    key = body.get("key")
    if key is not None and (not isinstance(key, str) or not HEX_KEY.fullmatch(key)):
        raise InvalidRequestError("key must be the kernel's HMAC key in hex, or null")
    curve = body.get("curve")
    if curve is not None and not (
        isinstance(curve, list)
        and len(curve) == 2
        and all(isinstance(part, str) and len(part) == CURVE_KEY_LENGTH for part in curve)
    ):
        raise InvalidRequestError("curve must be [public, secret] Z85 CurveZMQ keys, or null")
    kernel_name = request_body.check_label("kernel_name", body.get("kernel_name") or "", MAX_NAME_BYTES)
    for name, kinds in (("gpu_memory", (str, int)), ("gpu_mode", (str,)), ("gpu_cores", (str, int))):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
            raise InvalidRequestError(
                f"{name} must be a string{' or a whole number' if int in kinds else ''}"
            )
    return PodAsk(
        kernel_id=kernel_id,
        memory=body.get("gpu_memory"),
        mode=body.get("gpu_mode"),
        cores=body.get("gpu_cores"),
        argv=tuple(argv),
        env=dict(env),
        kernel_name=kernel_name,
        report_url=report_url,
        token=token,
        generation=generation,
        key=key,
        curve=(curve[0], curve[1]) if curve else None,
    )


ROUTES: list[tuple[str, type[BrokerHandler]]] = [
    ("pods", PodsHandler),
    (f"pods/{KERNEL}", PodHandler),
    (f"slices/{KERNEL}/activity", PodActivityHandler),
]

__all__ = ["ROUTES", "parse_ask", "parse_wait"]
